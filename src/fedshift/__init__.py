"""fedshift: federated learning under label, feature and concept shift, and drift.

The Python API in one import (loaded on first use, so ``import fedshift`` stays light)::

    import fedshift
    cfg = fedshift.load_config("configs/quickstart.yaml", ["train.rounds=5"])
    data = fedshift.build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    result = fedshift.compare(cfg, ["fedavg", "fedrc"], data=data)

docs/getting-started.md ("Python API") has a complete, tested example.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from fedshift.core.version import VERSION as __version__

_API = {
    "load_config": "fedshift.config",
    "validate_config": "fedshift.config",
    "build_scenario": "fedshift.data.scenario",
    "run_experiment": "fedshift.run.experiment",
    "compare": "fedshift.studies.compare",
    "reproduce_table": "fedshift.studies.reproduce",
    "sweep_grid": "fedshift.studies.sweep",
    "register": "fedshift.algorithms",
    "get_algorithm": "fedshift.algorithms",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'fedshift' has no attribute {name!r}")
