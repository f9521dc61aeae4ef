"""The simulator callback that feeds the sinks of ``cfg.log`` (see :mod:`fedshift.tracking`).

It runs in the process that drives the simulator (the driver under ``executor=ray``; each job's
process under ``sweep``/``reproduce``). Each sink gets an evaluation once: ``tracking.json``
keeps, per sink, its tracked run and the last round it holds. A resumed run reopens those
tracked runs and skips the rounds they already hold, except where the sink rewinds to the
checkpoint (TensorBoard purges the steps after it, which the resumed run logs again), so no
step appears twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import Any

from fedshift.config import RunConfig
from fedshift.tracking.common import (
    RunInfo,
    Sink,
    TrackingFile,
    hyperparameters,
    probe_servers,
    require_packages,
    scalars,
)


def make_sink(name: str) -> Sink:
    """A new sink of the given name (its package imported now)."""
    if name == "tensorboard":
        from fedshift.tracking.tensorboard_sink import TensorBoardSink

        return TensorBoardSink()
    if name == "wandb":
        from fedshift.tracking.wandb_sink import WandbSink

        return WandbSink()
    from fedshift.tracking.mlflow_sink import MlflowSink

    return MlflowSink()


class Tracker:
    """Sends a run's evaluations, config, figures and summary to its sinks; a context manager
    around the run that ends every tracked run (finished, failed, or killed by an interrupt:
    ``--resume`` continues it)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, *, resume: bool, summary: Path) -> None:
        self.cfg, self.run_dir, self.resume, self.summary_path = cfg, run_dir, resume, summary
        self.file = TrackingFile(run_dir)
        self.sinks: dict[str, Sink] = {}
        self.entries: dict[str, dict[str, Any]] = {}
        self.through: dict[str, int] = {}  # the last round each sink's tracked run holds
        self.last_round = 0

    @property
    def callbacks(self) -> list[Tracker]:
        """What the simulator calls: this tracker, or nothing without sinks."""
        return [self] if self.cfg.log else []

    def info(self) -> RunInfo:
        """The tracked run's settings; its output folder is ``output.dir``, or the parent of a
        run directory placed elsewhere (``run_experiment(run_dir=...)``)."""
        t, cfg = self.cfg.tracking, self.cfg
        run_dir = self.run_dir.resolve()
        output = Path(cfg.output.dir).resolve()
        if output / cfg.name != run_dir:
            output = run_dir.parent
        return RunInfo(cfg.name, run_dir, output, t.project, t.group, t.mode, t.mlflow_uri)

    # ------------------------------------------------------------------ simulator callbacks

    def on_start(self, sim, state) -> None:
        require_packages(self.cfg.log)
        saved = self.file.read() if self.resume else {}
        run = self.info()
        mlflow_uri = saved.get("mlflow", {}).get("uri") or run.mlflow_uri
        probe_servers(self.cfg.log, mlflow_uri, run.mode)  # seconds, not minutes of retries
        params = hyperparameters(self.cfg.model_dump(mode="json"))
        for name in self.cfg.log:
            entry = saved.get(name)
            sink = make_sink(name)
            self.entries[name] = sink.start(run, entry, state.round)
            self.sinks[name] = sink
            through = 0 if entry is None else int(entry.get("logged_through", 0))
            self.through[name] = min(through, state.round) if sink.rewinds else through
            if entry is None:
                sink.params(params)
        self.last_round = state.round
        for record in state.history:  # what a new (or rewound) tracked run does not hold yet
            self._log(record)
        self._save()

    def on_round_end(self, sim, state, metrics: dict | None) -> None:
        self.last_round = state.round
        if metrics is not None:
            self._log(metrics)
            self._save()

    def on_end(self, sim, state) -> None:
        self._summary()

    def on_diverged(self, sim, state, err: Exception) -> None:
        self._summary()

    # ------------------------------------------------------------------ the run's end

    def images(self, paths: list[Path]) -> None:
        """The run's figures (curves.png, clusters.png, ...) at its last round, each named
        ``plots/<file stem>``."""
        found = {f"plots/{p.stem}": p for p in paths if p.is_file()}
        if found:
            for sink in self.sinks.values():
                sink.images(found, self.last_round)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """End every tracked run; an error while ending one is raised only when the run
        itself ended well (it must not hide the run's own error)."""
        if exc_type is None:
            status = "finished"
        else:
            status = "killed" if issubclass(exc_type, KeyboardInterrupt) else "failed"
        first: BaseException | None = None
        for sink in self.sinks.values():
            try:
                sink.close(status)
            except Exception as err:  # noqa: BLE001 - the others still close
                first = first or err
        self.sinks.clear()
        if first is not None and exc_type is None:
            raise first

    # ------------------------------------------------------------------ helpers

    def _log(self, record: dict[str, Any]) -> None:
        rnd = int(record["round"])
        values = scalars(record)
        for name, sink in self.sinks.items():
            if rnd > self.through[name]:
                sink.metrics(values, rnd)
                self.through[name] = rnd

    def _save(self) -> None:
        self.file.write(
            {n: {**e, "logged_through": self.through[n]} for n, e in self.entries.items()}
        )

    def _summary(self) -> None:
        path = self.summary_path
        if not path.is_file():
            return
        summary = json.loads(path.read_text())
        for sink in self.sinks.values():
            sink.summary(summary, self.last_round)
