"""The experiments a ServerApp runs (each through :func:`fedshift.run.experiment.run_experiment` with
the Flower executor) and their result tables. Nothing here imports Flower."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedshift.config import RunConfig
from fedshift.reporting.tables import rich_table, table_rows
from fedshift.run.experiment import RunResult


@dataclass
class ServerRun:
    """One experiment for the ServerApp: its config and run-directory options."""

    cfg: RunConfig
    run_dir: str | None = None
    resume: bool = False
    overwrite: bool = False
    callbacks: list[Any] = field(default_factory=list)


def result_tables(name: str, res: RunResult) -> list[Any]:
    """The tables ``fedshift run`` prints: the last round and the round of best training
    accuracy (rich renderables)."""

    return [rich_table(table_rows({name: res.history}, p), p) for p in ("last", "best_train")]
