"""MLflow: one MLflow run per fedshift run, in the experiment ``tracking.group`` (else
``tracking.project``), named after the run.

The store is ``tracking.mlflow_uri``, by default the SQLite file ``mlflow.db`` in the folder
holding the run directories (``output.dir``; a sweep's or reproduction's own folder), so the
runs of a study share one store and one experiment; artifacts go beside it, to
``mlartifacts/``. (MLflow 3 refuses its old ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE``
is set; SQLite needs nothing installed.) Runs of parallel processes take turns on the SQLite
file through a lock file beside it. MLflow keeps every value logged, so a resumed run logs
only the rounds after the last one this run logged."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from fedshift.core.errors import FedshiftError
from fedshift.tracking.common import RunInfo, is_number, summary_values

#: the run status MLflow records for how the process ended
STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
#: MLflow's limits: values per log_batch call, characters of a parameter value
MAX_METRICS, MAX_PARAMS, MAX_PARAM_CHARS = 1000, 100, 6000


def default_uri(output_dir: Path) -> str:
    return f"sqlite:///{output_dir / 'mlflow.db'}"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None: another store)."""
    if not uri.startswith("sqlite:///") or uri.endswith(":memory:"):
        return None
    return Path(uri.removeprefix("sqlite:///"))


class MlflowSink:
    rewinds = False

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id = ""
        self.db: Path | None = None

    @contextmanager
    def _call(self) -> Iterator[None]:
        """Around every store call: MLflow's (and SQLAlchemy's) notes kept off the terminal,
        and a SQLite store held by this process alone (parallel jobs share it)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                import fcntl
            except ImportError:  # not POSIX: SQLite's own locking alone
                fcntl = None  # type: ignore[assignment]
            if self.db is None or fcntl is None:
                yield
                return
            with open(self.db.with_name(self.db.name + ".lock"), "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
                yield

    def start(self, run: RunInfo, saved: dict[str, Any] | None, resumed: int) -> dict:
        for name in ("mlflow", "alembic"):  # table creation and migrations log at INFO
            logging.getLogger(name).setLevel(logging.WARNING)
        saved = saved or {}
        uri = saved.get("uri") or run.mlflow_uri or default_uri(run.output_dir)
        experiment = saved.get("experiment") or run.group or run.project
        self.db = sqlite_file(uri)
        if self.db is not None:
            self.db.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._call():
                self.client = MlflowClient(tracking_uri=uri)
                if saved.get("run_id"):
                    self.run_id = saved["run_id"]
                    self.client.update_run(self.run_id, status="RUNNING")
                else:
                    exp_id = self._experiment(experiment)
                    tags = {"fedshift.group": run.group or ""}
                    created = self.client.create_run(exp_id, run_name=run.name, tags=tags)
                    self.run_id = created.info.run_id
        except MlflowException as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise FedshiftError(f"log: mlflow store {uri}: {first}") from None
        return {"uri": uri, "experiment": experiment, "run_id": self.run_id}

    def _experiment(self, name: str) -> str:
        """The id of experiment ``name``, created if new (a SQLite store's artifacts beside
        its file, not in the current folder where MLflow would put them)."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        where = None if self.db is None else (self.db.parent / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=where)

    def params(self, params: dict[str, Any]) -> None:
        items = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
        with self._call():
            for i in range(0, len(items), MAX_PARAMS):
                self.client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS])

    def metrics(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in values.items()]
        with self._call():
            for i in range(0, len(items), MAX_METRICS):
                self.client.log_batch(self.run_id, metrics=items[i : i + MAX_METRICS])

    def images(self, images: dict[str, Path], step: int) -> None:
        with self._call():
            for path in images.values():
                self.client.log_artifact(self.run_id, str(path), artifact_path="plots")

    def summary(self, summary: dict[str, Any], step: int) -> None:
        """summary.json as an artifact, its numbers as ``summary/...`` metrics and its status
        as the tag ``fedshift.status``."""
        values = {k: float(v) for k, v in summary_values(summary).items() if is_number(v)}
        self.metrics(values, step)
        with self._call():
            self.client.log_dict(self.run_id, summary, "summary.json")
            status = str(summary.get("status", ""))
            self.client.log_batch(self.run_id, tags=[RunTag("fedshift.status", status)])

    def close(self, status: str) -> None:
        if self.client is not None and self.run_id:
            with self._call():
                self.client.set_terminated(self.run_id, STATUS[status])
            self.client = None
