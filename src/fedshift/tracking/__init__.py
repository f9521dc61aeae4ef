"""Experiment tracking: the evaluation records of ``metrics.jsonl`` also sent to TensorBoard,
Weights & Biases or MLflow, chosen by the config's ``log`` (``log: [tensorboard, wandb]``, or
``fedshift run ... --log tensorboard,wandb``) and set up by its ``tracking`` section.

What each sink gets (see :class:`~fedshift.tracking.callback.Tracker`): every numeric scalar
of each evaluation at step = round (nested names joined with ``/``), the resolved config as
hyper-parameters (dotted keys, as in ``key=value`` overrides), the run's figures and
``summary.json`` at the end. ``tracking.json`` in the run directory names the tracked runs,
so ``--resume`` continues them. Sinks say where results go, not what is computed: ``log`` and
``tracking`` are execution keys of the config.

The sinks' packages are imported when a run uses them (``import fedshift`` and
``fedshift --help`` never load them).
"""

from __future__ import annotations

from pathlib import Path

from fedshift.config import RunConfig
from fedshift.tracking.callback import Tracker
from fedshift.tracking.common import log_override, require_packages, with_group

__all__ = ["Tracker", "log_override", "open_tracker", "require_packages", "with_group"]


def open_tracker(cfg: RunConfig, run_dir: str | Path, *, resume: bool, summary: Path) -> Tracker:
    """The tracking callback of a run in ``run_dir`` (it does nothing when ``cfg.log`` is
    empty); ``resume`` continues the tracked runs that ``tracking.json`` names; ``summary`` is
    the run's summary file, sent to the sinks when the run ends."""
    return Tracker(cfg, Path(run_dir), resume=resume, summary=summary)
