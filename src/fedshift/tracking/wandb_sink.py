"""Weights & Biases: one W&B run per fedshift run, in ``tracking.project`` and
``tracking.group``, named after the run; files under ``<run dir>/wandb/``.

Offline (the default) needs no account and no network: each process that runs (or resumes)
the run writes ``wandb/offline-run-<time>-<id>/``, and ``wandb sync`` uploads them later into
the one W&B run of that id. W&B keeps a step once logged, so a resumed run logs only the
rounds after the last one this run logged (the numbers of a resumed round are the same; only
its timings differ)."""

from __future__ import annotations

import secrets
import string
from pathlib import Path
from typing import Any

import wandb

from fedshift.core.errors import FedshiftError
from fedshift.tracking.common import RunInfo, remove_stale, summary_values

#: exit codes W&B records for how the process ended
EXIT_CODES = {"finished": 0, "failed": 1, "killed": 130}


def new_id() -> str:
    """A W&B run id (8 lowercase letters and digits, as W&B makes them)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbSink:
    rewinds = False

    def __init__(self) -> None:
        self.run: Any = None

    def start(self, run: RunInfo, saved: dict[str, Any] | None, resumed: int) -> dict:
        if saved is None:
            remove_stale(run.run_dir / "wandb")
        saved = saved or {}
        run_id = saved.get("id") or new_id()
        project = saved.get("project", run.project)
        group = saved.get("group", run.group)
        # silent, and no capture of the terminal (fedshift draws progress bars there)
        settings = wandb.Settings(silent=True, console="off")
        try:
            self.run = wandb.init(
                project=project,
                group=group,
                name=run.name,
                id=run_id,
                resume="allow",
                dir=str(run.run_dir),
                mode=run.mode,
                settings=settings,
            )
        except wandb.errors.Error as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise FedshiftError(
                f"log: wandb could not start ({first}); run `wandb login` for "
                "tracking.mode=online, or use tracking.mode=offline"
            ) from None
        return {"id": run_id, "project": project, "group": group}

    def params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def metrics(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def images(self, images: dict[str, Path], step: int) -> None:
        self.run.log({tag: wandb.Image(str(path)) for tag, path in images.items()}, step=step)

    def summary(self, summary: dict[str, Any], step: int) -> None:
        self.run.summary.update(summary_values(summary))

    def close(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=EXIT_CODES[status])
            self.run = None
