"""Experiment tracking: the evaluation records of ``metrics.jsonl`` also sent to TensorBoard,
Weights & Biases or MLflow, chosen by the config's ``log`` (``log: [tensorboard, wandb]``, or
``fedshift run ... --log tensorboard,wandb``) and set up by its ``tracking`` section.

What each sink gets (see :class:`~fedshift.tracking.callback.Tracker`): every numeric scalar
of each evaluation at step = round (nested names joined with ``/``), the resolved config as
hyper-parameters (dotted keys, as in ``key=value`` overrides), the run's figures and
``summary.json`` at the end. ``tracking.json`` in the run directory names the tracked runs,
so ``--resume`` continues them. Sinks say where results go, not what is computed: ``log`` and
``tracking`` are execution keys of the config.

This module imports only the standard library: the sinks' packages are imported when a run
uses them (``import fedshift`` and ``fedshift --help`` never load them).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedshift.errors import FedshiftError, did_you_mean

if TYPE_CHECKING:
    from fedshift.config import RunConfig
    from fedshift.tracking.callback import Tracker

#: sink name -> the module it needs
SINKS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
INSTALL = 'pip install "fedshift[tracking]"'


def parse_sinks(value: Any) -> list[str]:
    """The sink names of a ``log`` value: a list, a comma-separated string or nothing; an
    unknown name is a ValueError naming the valid ones (the config makes it a ConfigError)."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError(f"must be a list of sinks ({', '.join(SINKS)})")
    out: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        if not isinstance(item, str) or name not in SINKS:
            hint = did_you_mean(name, SINKS)
            raise ValueError(f"unknown sink {item!r}{hint}; allowed: {', '.join(SINKS)}")
        if name not in out:
            out.append(name)
    return out


def _installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_packages(sinks: list[str]) -> None:
    """A sink whose package is missing is a one-line error before anything runs."""
    for name in sinks:
        if not _installed(SINKS[name]):
            raise FedshiftError(
                f"log: {name} needs the {SINKS[name]} package, which is not installed: {INSTALL}"
            )


def log_override(text: str | None) -> list[str]:
    """The command line's ``--log a,b`` as a ``log=[a,b]`` override (none without it)."""
    if text is None:
        return []
    return [f"log=[{','.join(s.strip() for s in text.split(',') if s.strip())}]"]


def with_group(raw: dict[str, Any], group: str) -> dict[str, Any]:
    """A raw config whose tracked run joins ``group`` (a sweep's or a reproduction's name),
    unless the config names its own ``tracking.group``."""
    section = raw.get("tracking")
    if section is None:
        section = raw["tracking"] = {}
    if isinstance(section, dict) and section.get("group") is None:
        section["group"] = group
    return raw


def open_tracker(cfg: RunConfig, run_dir: str | Path, *, resume: bool) -> Tracker:
    """The tracking callback of a run in ``run_dir`` (it does nothing when ``cfg.log`` is
    empty); ``resume`` continues the tracked runs that ``tracking.json`` names."""
    from fedshift.tracking.callback import Tracker

    return Tracker(cfg, Path(run_dir), resume=resume)
