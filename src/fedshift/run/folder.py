"""Run directories: resolved config, metrics.jsonl, summary.json, checkpoint, plots.

Every write is atomic (a temp file in the same folder, then ``os.replace``), so a run killed at
any moment never leaves a half-written file. The checkpoint holds the whole simulator state and
the metric history, so ``--resume`` continues exactly where the last completed round ended.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.torch_version import TorchVersion

from fedshift.core.errors import FedshiftError
from fedshift.core.files import atomic_write_text
from fedshift.engine.simulator import STORE_DIR, SimState
from fedshift.engine.store import ClientStore, StoreTable
from fedshift.reporting.protocols import PROTOCOLS, select_round

CONFIG, METRICS, SUMMARY, CHECKPOINT = (
    "config.yaml",
    "metrics.jsonl",
    "summary.json",
    "checkpoint.pt",
)
#: the layout of checkpoint.pt: 2 holds plain data only (a client store as a tagged dict);
#: 3 holds the client store's manifest, its values in the run directory's store/ folder
CHECKPOINT_FORMAT = 3
_STORE = "__client_store__"  # format 2's tag of a bounded store
_TABLE = "__store_table__"  # format 3: this field is a table of the run's client store
_STORE_KEY = "__store__"


def _plain_state(state: SimState) -> dict[str, Any]:
    """The simulator state as plain data: a table of the client store becomes a tagged name,
    and the store writes what changed since the last checkpoint and gives its manifest."""
    out = dict(state.__dict__)
    store = None
    for key, value in out.items():
        if isinstance(value, StoreTable):
            store = value.store
            out[key] = {_TABLE: value.name}
    if store is not None:
        out[_STORE_KEY] = store.commit()
    return out


def _state_from_plain(
    fields: dict[str, Any], folder: Path, device: torch.device
) -> tuple[SimState, ClientStore | None]:
    """A checkpoint's state back as a :class:`SimState` (and its client store, whose values
    on disk are read when needed); format 2's client stores and plain dicts are moved into a
    new store, which the next checkpoint writes in format 3."""
    fields = dict(fields)
    manifest = fields.pop(_STORE_KEY, None)
    store = None if manifest is None else ClientStore.from_manifest(manifest, folder, device)
    legacy: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, dict) and set(value) == {_TABLE}:
            fields[key] = store.table(value[_TABLE])  # type: ignore[union-attr]
        elif isinstance(value, dict) and set(value) == {_STORE}:
            legacy[key] = _legacy_store(value[_STORE], folder.parent, device)
    if legacy or store is None:  # a format-2 checkpoint
        store = ClientStore(None, folder, device)
        for key in ("clients", "momentum", "local_models"):
            old = legacy.get(key, fields.get(key) or {})
            table = store.table(key)
            for cid, value in dict(old).items():
                table[cid] = value
            fields[key] = table
    return SimState(**fields), store


def _legacy_store(d: dict[str, Any], run_dir: Path, device) -> dict[int, Any]:
    """The values of a format-2 bounded store (its spilled files under the run directory)."""
    out = dict(d["memory"])
    folder = run_dir / Path(d["folder"]).name if d["folder"] else None
    for cid, version in d["spilled"].items():
        path = folder / f"{cid}.{version}.pt"  # type: ignore[operator]
        out[cid] = torch.load(path, map_location=device, weights_only=True)
    return out


def _unreadable(path: Path, err: Exception) -> str:
    """A few words on why a checkpoint failed to load."""
    if path.stat().st_size == 0:
        return "the file is empty"
    text = str(err).strip()
    foreign = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if foreign:
        return (
            f"it refers to {foreign.group(1)}, which is not plain data; fedshift loads only "
            "plain data and tensors"
        )
    if isinstance(err, KeyError):
        return f"not a fedshift checkpoint: it has no {err.args[0]!r} entry"
    first = (text.splitlines() or [type(err).__name__])[0][:120]
    if isinstance(err, pickle.UnpicklingError | TypeError | AttributeError):
        return f"not a fedshift checkpoint: {first}"
    return f"truncated or damaged: {first}"


def _clean(v: Any) -> Any:
    """JSON-safe value (NaN becomes null)."""
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def to_json(obj: dict[str, Any]) -> str:
    return json.dumps({k: _clean(v) for k, v in obj.items()})


class RunDir:
    """The files of one run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write_config(self, yaml_text: str) -> None:
        atomic_write_text(self.path / CONFIG, yaml_text)

    def write_metrics(self, history: list[dict[str, Any]]) -> None:
        atomic_write_text(self.path / METRICS, "".join(to_json(h) + "\n" for h in history))

    def read_metrics(self) -> list[dict[str, Any]]:
        p = self.path / METRICS
        if not p.is_file():
            return []
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        return [{k: (float("nan") if v is None else v) for k, v in r.items()} for r in rows]

    def save_checkpoint(self, state: SimState, meta: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".checkpoint.")
        os.close(fd)
        try:
            blob = {"format": CHECKPOINT_FORMAT, "state": _plain_state(state), "meta": meta}
            torch.save(blob, tmp)
            os.replace(tmp, self.path / CHECKPOINT)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_checkpoint(self, device: torch.device) -> tuple[SimState, dict[str, Any]]:
        """The state and meta of the checkpoint, read with ``weights_only=True`` (plain
        containers, numbers, strings and tensors: loading never runs code from the file); a
        missing, damaged or foreign checkpoint is a one-line error saying why and what to do."""
        p = self.path / CHECKPOINT
        if not p.is_file():
            raise FedshiftError(self._no_checkpoint())
        try:
            # format 1 (before plain checkpoints) pickled torch's version
            with torch.serialization.safe_globals([TorchVersion]):
                blob = torch.load(p, map_location=device, weights_only=True)
            state, _ = _state_from_plain(blob["state"], self.path / STORE_DIR, device)
            return state, dict(blob["meta"])
        except Exception as err:  # noqa: BLE001 - any failure to read is the same advice
            raise FedshiftError(
                f"checkpoint {p} cannot be read ({_unreadable(p, err)}); delete it to start "
                f"this run over from round 1 (`fedshift run {self.path / CONFIG}` without "
                "--resume, or the same sweep/reproduce command)"
            ) from None

    def _no_checkpoint(self) -> str:
        """Why there is no checkpoint to resume from (the run diverged or stopped first)."""
        start = f"start it again without --resume (`fedshift run {self.path / CONFIG}`)"
        if not (self.path / CONFIG).is_file():
            return f"no checkpoint in {self.path}; is it a fedshift run directory?"
        try:
            summary = json.loads((self.path / SUMMARY).read_text())
        except (OSError, ValueError):
            summary = {}
        if isinstance(summary, dict) and summary.get("status") == "diverged":
            return (
                f"{self.path} has no checkpoint to resume: the run diverged in round "
                f"{summary.get('diverged_round', '?')}, before its first checkpoint; "
                f"{start} with a lower train.lr or train.grad_clip set"
            )
        return (
            f"{self.path} has no checkpoint to resume: the run stopped before its first "
            f"checkpoint was written; {start}"
        )

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.path / SUMMARY, json.dumps(summary, indent=2, default=_clean))

    def read_summary(self) -> dict[str, Any]:
        p = self.path / SUMMARY
        if not p.is_file():
            raise FedshiftError(f"{self.path} has no {SUMMARY}; is the run finished?")
        return json.loads(p.read_text())


def summarise(history: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """summary.json: the metrics under each round protocol, and what produced them."""
    out: dict[str, Any] = dict(meta)
    out["protocols"] = {}
    timed = any("step" in h for h in history)
    validated = any("val_acc" in h for h in history)
    for name, desc in PROTOCOLS.items():
        if (name == "steps" and not timed) or (name == "best_val" and not validated):
            continue  # without time steps (a validation split) it is the last evaluation again
        row = select_round(history, name)
        out["protocols"][name] = {"description": desc, **{k: _clean(v) for k, v in row.items()}}
    return out


def resource_use() -> dict[str, float]:
    """Peak memory of this process so far: host RSS, and GPU memory when CUDA was used."""
    import resource

    out = {"peak_host_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_gpu_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


#: checkpoint_every=auto: checkpoints that take less than this many seconds are written every
#: round; slower ones at most once per AUTO_FACTOR times their own duration (<= 10% overhead)
AUTO_CHEAP_S, AUTO_FACTOR = 0.02, 10.0


def checkpoint_due(
    every: int | str, rnd: int, last_round: int, since_last_s: float, last_write_s: float | None
) -> bool:
    """Whether to checkpoint at the end of round ``rnd`` (the last round always;
    ``every="auto"``: see :data:`AUTO_CHEAP_S`; a first checkpoint is always written)."""
    if rnd == last_round:
        return True
    if every != "auto":
        return rnd % int(every) == 0
    if last_write_s is None or last_write_s < AUTO_CHEAP_S:
        return True
    return since_last_s >= AUTO_FACTOR * last_write_s


class RunRecorder:
    """Callback: writes metrics.jsonl each evaluation and a checkpoint every N rounds (or, with
    ``"auto"``, as often as their cost allows: :func:`checkpoint_due`)."""

    def __init__(
        self, run: RunDir, meta: dict[str, Any], checkpoint_every: int | str = "auto"
    ) -> None:
        self.run, self.meta, self.every = run, meta, checkpoint_every
        self._last_write_s: float | None = None
        #: this process's checkpoints: round, seconds, MiB of client state written
        self.checkpoints: list[dict[str, float]] = []
        self._last_end = time.perf_counter()

    def on_start(self, sim, state: SimState) -> None:
        self.run.write_metrics(state.history)
        self._last_end = time.perf_counter()

    def on_round_end(self, sim, state: SimState, metrics: dict | None) -> None:
        if metrics is not None:
            self.run.write_metrics(state.history)
        since = time.perf_counter() - self._last_end
        if checkpoint_due(self.every, state.round, sim.cfg.rounds, since, self._last_write_s):
            t0 = time.perf_counter()
            store = getattr(state.clients, "store", None)
            written = store.stats["bytes_written"] if store is not None else 0
            self.run.save_checkpoint(state, self.meta)
            self._last_end = time.perf_counter()
            self._last_write_s = self._last_end - t0
            if store is not None:  # the files the checkpoint no longer refers to
                store.collect()
                written = store.stats["bytes_written"] - written
            self.checkpoints.append(
                {"round": state.round, "s": round(self._last_write_s, 3),
                 "store_mb": round(written / 2**20, 1)}
            )  # fmt: skip

    def on_end(self, sim, state: SimState) -> None:
        self._summary(state, status="finished")

    def on_diverged(self, sim, state: SimState, err: Exception) -> None:
        """Record a diverged run: summary.json says so (round, reason), metrics.jsonl keeps the
        evaluations so far, and the checkpoint stays at the last good round."""
        self._summary(
            state, status="diverged", diverged_round=state.round + 1, diverged_reason=str(err)
        )

    def _summary(self, state: SimState, **status: Any) -> None:
        meta = {**self.meta, **status, **resource_use(), "elapsed_s": round(state.elapsed, 2)}
        meta["train_s_total"] = round(state.elapsed - state.eval_elapsed, 2)
        meta["eval_s_total"] = round(state.eval_elapsed, 2)
        meta["model_sample_steps"] = state.sample_steps
        meta["checkpoints"] = self.checkpoints
        store = getattr(state.clients, "store", None)
        if store is not None:  # what the client store held and wrote (this process's share)
            meta["client_store"] = {
                **store.stats,
                "peak_resident_mb": round(store.peak_resident_bytes / 2**20, 1),
                "total_mb": round(store.total_bytes / 2**20, 1),
            }
        self.run.write_summary(summarise(state.history, meta) if state.history else meta)
