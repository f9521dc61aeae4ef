"""What the sinks share: the run they track (:class:`RunInfo`), what a sink does
(:class:`Sink`), the values they get (an evaluation's scalars, the config's hyper-parameters,
summary.json's leaves) and ``tracking.json``, the record of a run directory's tracked runs."""

from __future__ import annotations

import importlib.util
import json
import numbers
import os
import shutil
import socket
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fedshift.config.execution import INSTALL, SINKS
from fedshift.core.errors import FedshiftError
from fedshift.core.files import atomic_write_text

#: the file in a run directory naming its tracked runs (one entry per sink)
TRACKING = "tracking.json"


@dataclass(frozen=True)
class RunInfo:
    """The run a sink tracks: its name, where its files go and the ``tracking`` settings."""

    name: str
    run_dir: Path
    output_dir: Path  # the folder holding the run directory (output.dir)
    project: str
    group: str | None
    mode: str  # W&B: offline | online
    mlflow_uri: str | None


class Sink(Protocol):
    """One tracking backend. ``start`` opens a new tracked run (``saved`` None: files a
    previous, unrecorded one left in the run directory are removed) or continues the one
    ``saved`` describes, whose checkpoint is at round ``resumed``; it returns what
    ``tracking.json`` keeps of it. ``rewinds``: a continued run forgets what was logged after
    round ``resumed`` (TensorBoard's purge), so those rounds are logged again."""

    rewinds: bool

    def start(self, run: RunInfo, saved: dict[str, Any] | None, resumed: int) -> dict: ...
    def params(self, params: dict[str, Any]) -> None: ...
    def metrics(self, values: dict[str, float], step: int) -> None: ...
    def images(self, images: dict[str, Path], step: int) -> None: ...
    def summary(self, summary: dict[str, Any], step: int) -> None: ...
    def close(self, status: str) -> None: ...  # finished | failed | killed


def leaves(tree: dict[str, Any], sep: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(key, value)`` of every non-mapping value of a nested mapping, the keys of the path
    joined with ``sep``; an empty mapping has none."""
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from leaves(value, sep, name)
        else:
            yield name, value


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """An evaluation record's numeric scalars (booleans as 0/1, nested names joined with
    ``/``), without its ``round``, which is the step they are logged at."""
    return {k: float(v) for k, v in leaves(record, "/") if k != "round" and is_number(v)}


def hyperparameters(config: dict[str, Any]) -> dict[str, str | int | float | bool]:
    """A resolved config (``model_dump(mode="json")``) flattened to dotted keys, as
    ``key=value`` overrides spell them; lists and nulls as JSON text (what every sink takes)."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in leaves(config, "."):
        ok = isinstance(value, str | bool) or is_number(value)
        out[key] = value if ok else json.dumps(value)
    return out


def summary_values(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json's numbers and strings, keyed ``summary/<path>`` (lists, e.g. the leakage
    audit, stay in the file)."""
    return {
        f"summary/{k}": v for k, v in leaves(summary, "/") if isinstance(v, str) or is_number(v)
    }


def remove_stale(path: Path) -> None:
    """Remove a sink's folder that no ``tracking.json`` entry accounts for (the files of a run
    this one replaces), so that a new tracked run does not mix with it."""
    if path.is_dir():
        shutil.rmtree(path)


class TrackingFile:
    """``tracking.json`` of a run directory: per sink, what continues its tracked run."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / TRACKING

    def read(self) -> dict[str, dict[str, Any]]:
        """The recorded entries (none without the file); a damaged file is a one-line error."""
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            raise FedshiftError(
                f"{self.path} cannot be read ({err}); delete it to track the rest of this run "
                "as new tracked runs"
            ) from None
        return {k: v for k, v in data.items() if isinstance(v, dict)}

    def write(self, entries: dict[str, dict[str, Any]]) -> None:
        atomic_write_text(self.path, json.dumps(entries, indent=2) + "\n")


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


#: seconds a tracking server has to accept a connection before the run starts without it
PROBE_TIMEOUT = 3.0


def probe_server(uri: str, fix: str, timeout: float = PROBE_TIMEOUT) -> None:
    """A one-line error, within about ``timeout`` seconds, when the ``http(s)://`` tracking
    server at ``uri`` does not accept a connection (its client would retry for minutes before
    failing); other URIs (a local file or SQLite store, ``databricks``) are not probed. ``fix``:
    what to do about it (the setting that names the server)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as err:
        raise FedshiftError(f"log: tracking server {uri}: {err}; {fix}") from None
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return
    except OSError as err:
        why = (
            f"no answer in {timeout:g} s"
            if isinstance(err, TimeoutError)
            else (err.strerror or str(err) or type(err).__name__)
        )
    raise FedshiftError(f"log: tracking server {uri} does not answer ({why}); {fix}")


def probe_servers(sinks: list[str], mlflow_uri: str | None, wandb_mode: str) -> None:
    """Every tracking server a run's sinks would talk to answers (see :func:`probe_server`):
    MLflow's ``mlflow_uri`` and, online, W&B's ``WANDB_BASE_URL`` when it is set."""
    if "mlflow" in sinks and mlflow_uri:
        probe_server(
            mlflow_uri,
            "start the server, correct tracking.mlflow_uri, or leave it unset for a local "
            "store (mlflow.db in output.dir)",
        )
    base = os.environ.get("WANDB_BASE_URL")
    if "wandb" in sinks and wandb_mode == "online" and base:
        probe_server(base, "start the server, correct WANDB_BASE_URL, or use tracking.mode=offline")


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
