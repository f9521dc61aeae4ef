"""A node of a real deployment: it trains and scores its own clients on its own data, and
keeps their states; nothing here imports Flower (the ClientApp of
:mod:`fedshift.flower.client_app` calls it).

- :class:`NodeStore`: each client's private state (and kept momentum) on the node's disk,
  one file per round it trained, so a restarted node goes on from where it was and a job
  sent twice (its reply was lost) is computed again from the same state;
- :func:`describe`: what the server learns about the node's clients (ids, sizes, the input
  format), never their samples;
- :func:`train_job` / :func:`evaluate_job`: a client's task, training, state update and
  reply, and its scores on its own splits (counts only);
- :func:`check_private`: the last guard before a reply leaves the node: no tensor of the
  client's private state (:meth:`~fedshift.algorithms.base.Algorithm.private_state`) in it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from fedshift.algorithms.base import Algorithm, ClientResult, RoundContext, State, check_task
from fedshift.algorithms.states import check_state
from fedshift.config import RunConfig, parse_config_text, validate_config
from fedshift.core.errors import FedshiftError
from fedshift.data.client_folders import FolderClient, local_shift, node_data, read_clients
from fedshift.data.federated import FederatedData
from fedshift.engine.evaluation import Scoring, client_data, score_chunk
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.trees import tensors
from fedshift.flower.codec import from_bytes, to_bytes
from fedshift.run.experiment import make_algorithm, resolve_device

_ROUND = re.compile(r"round_(\d+)\.pt")


class NodeStore:
    """Client states of one run on a node: ``<root>/<run>/client_<cid>/round_<r>.pt``.

    A file holds the state after round ``r`` (and the client's momentum when the run keeps
    it); it is written whole (a temporary file, then a rename), so a node killed while
    writing keeps the previous one. Files are 0600 and folders 0700 (the clients' private
    states)."""

    def __init__(self, root: Path, run: str) -> None:
        if not re.fullmatch(r"[0-9a-f]{8,64}", run):
            raise FedshiftError(f"bad run key {run!r} from the server")
        self.root, self.run = Path(root), run

    def folder(self, cid: int) -> Path:
        return self.root / self.run / f"client_{cid}"

    def rounds(self, cid: int) -> list[int]:
        folder = self.folder(cid)
        found = (_ROUND.fullmatch(p.name) for p in folder.iterdir()) if folder.is_dir() else ()
        return sorted(int(m.group(1)) for m in found if m)

    def load(self, cid: int, before: int) -> dict[str, Any] | None:
        """The latest saved entry of a round before ``before`` (None: the client has none)."""
        done = [r for r in self.rounds(cid) if r < before]
        if not done:
            return None
        path = self.folder(cid) / f"round_{done[-1]}.pt"
        return from_bytes(path.read_bytes())

    def save(self, cid: int, rnd: int, entry: dict[str, Any]) -> None:
        """Save the entry of round ``rnd``; later rounds' files (of a run that resumed from
        an earlier checkpoint) and all but the previous round's go."""
        folder = self.folder(cid)
        for d in (self.root, self.root / self.run, folder):  # private: 0700 (the root if new)
            if not d.is_dir():
                d.mkdir(parents=True, exist_ok=True)
                os.chmod(d, 0o700)
            elif d != self.root:
                os.chmod(d, 0o700)
        tmp = folder / f".round_{rnd}.pt.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with open(tmp, "wb", opener=lambda p, _: os.open(p, flags, 0o600)) as f:
            os.fchmod(f.fileno(), 0o600)  # a leftover temporary file of another mode
            f.write(to_bytes(entry, f"the state of client {cid}"))
        os.replace(tmp, folder / f"round_{rnd}.pt")
        keep = [r for r in self.rounds(cid) if r < rnd][-1:] + [rnd]
        for r in self.rounds(cid):
            if r not in keep:
                (folder / f"round_{r}.pt").unlink(missing_ok=True)

    def reset(self) -> None:
        """Forget the run's states (the server starts the run over)."""
        shutil.rmtree(self.root / self.run, ignore_errors=True)


@dataclass(frozen=True)
class NodeSettings:
    """A node's own settings (its node config): its data folder, a shift to apply to it, a
    client id for a folder that does not say one, where states are kept, the device."""

    data: str
    shift: str | None = None
    labels: str | None = None
    client_id: int | None = None
    store: str | None = None
    device: str | None = None

    @property
    def store_root(self) -> Path:
        return Path(self.store).expanduser() if self.store else Path(self.data) / ".fedshift-node"


@functools.lru_cache(maxsize=4)
def node_clients(settings: NodeSettings) -> tuple[FolderClient, ...]:
    """The node's clients, read once per process, with the node's own shift applied."""
    clients = read_clients(settings.data)
    if settings.client_id is not None:
        if len(clients) != 1:
            raise FedshiftError(f"client-id={settings.client_id}: {settings.data} holds "
                                f"{len(clients)} clients; set cid in each one's client.json")  # fmt: skip
        clients[0] = replace(clients[0], cid=settings.client_id)
    return tuple(local_shift(c, settings.shift, settings.labels) for c in clients)


def describe(settings: NodeSettings) -> dict[str, Any]:
    """What the node tells the server: its clients' ids and split sizes, the input format and
    a digest of each client's data (so a resumed run sees the same data)."""
    clients = node_clients(settings)
    data = node_data(list(clients))
    return {
        "clients": [
            {"cid": c.cid, "num_train": c.num_train, "num_test": c.num_test, "digest": _digest(f)}
            for c, f in zip(data.clients, clients, strict=True)
        ],
        "num_classes": data.num_classes,
        "input_shape": list(data.input_shape),
        "image": data.is_image,
    }


def _digest(c: FolderClient) -> str:
    h = hashlib.sha256()
    for arr in (c.x_train, c.y_train, c.x_test, c.y_test):
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


@dataclass
class NodeRuntime:
    """What a node builds from a run's config: the config, device, data and algorithm, and
    (a deployment's node) the store of its clients' states."""

    cfg: RunConfig
    device: torch.device
    data: FederatedData
    algo: Algorithm
    store: NodeStore = None  # type: ignore[assignment]  # a node of simulated clients: none

    def record(self, cid: int):
        for c in self.data.clients:
            if c.cid == cid:
                return c
        raise FedshiftError(f"this node holds no client {cid}")


@functools.lru_cache(maxsize=4)
def runtime(config: str, settings: NodeSettings, run: str) -> NodeRuntime:
    """The algorithm of a run's resolved ``config`` over the node's own data (cached)."""

    raw = parse_config_text(config, "the run config from the server")
    if settings.device:
        raw["device"] = settings.device
    cfg = validate_config(raw)
    dev = resolve_device(cfg.device)
    data = node_data(list(node_clients(settings)))
    data.to(dev)
    store = NodeStore(settings.store_root, run)
    return NodeRuntime(cfg, dev, data, make_algorithm(cfg, data, dev), store)


def _state_of(rt: NodeRuntime, cid: int, before: int) -> tuple[State, Any]:
    saved = rt.store.load(cid, before)
    if saved is None:
        fresh = rt.algo.init_client_state(cid)
        return check_state(rt.algo, fresh, "client", "init_client_state"), None
    return saved["state"], saved.get("momentum")


def train_job(rt: NodeRuntime, job: dict[str, Any]) -> ClientResult:
    """Train client ``job['cid']`` for round ``job['rnd']`` from the server state in the job;
    save its new state; return what it shares with the server."""
    algo, cid, rnd = rt.algo, int(job["cid"]), int(job["rnd"])
    server, ctx = job["server"], RoundContext(**job["ctx"])
    state, momentum = _state_of(rt, cid, rnd)
    view = client_data(rt.data, rt.record(cid), int(job["eval_batch"]))
    task = check_task(algo, algo.client_task(server, state, view, ctx))
    if job["keep_momentum"]:
        task = replace(task, momentum=momentum or [{} for _ in task.params])
    if job.get("epochs") is not None:
        task = replace(task, epochs=int(job["epochs"]))
    work = RoundWork.from_dict(job["work"])
    with torch.enable_grad():
        result = SequentialExecutor().train_one(algo, task, view, work)
    new = check_state(
        algo, algo.client_update(server, state, task, result), "client", "client_update"
    )
    entry = {"state": new}
    if job["keep_momentum"] and result.momentum is not None:
        entry["momentum"] = result.momentum
    rt.store.save(cid, rnd, entry)
    shared = algo.shared_result(task, result)
    check_private(shared, algo.private_state(new), cid, algo.name)
    return shared


@torch.no_grad()
def evaluate_job(rt: NodeRuntime, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Scores of the node's clients ``job['cids']`` after round ``job['rnd']``: correct counts
    on their test and train splits, the train NLL, and the cluster each is assigned to."""
    algo, server, rnd = rt.algo, job["server"], int(job["rnd"])
    work = RoundWork.from_dict(job["work"]).tuning()  # fine-tuning: without augmentation
    states = {cid: _state_of(rt, cid, rnd + 1)[0] for cid in job["cids"]}
    records = [rt.record(cid) for cid in job["cids"]]

    def tune(jobs):
        return SequentialExecutor().train(algo, jobs, work)

    how = Scoring(
        algo, server, states, rt.data, bool(job["train_metrics"]), int(job["eval_batch"]),
        set(), {}, tune,
    )  # fmt: skip
    with algo.ops.memoised():
        sc = score_chunk(how, records, [], False)
    out = []
    for i, c in enumerate(records):
        row = {"cid": c.cid, "num_test": c.num_test, "test_correct": int(sc.test_correct[i])}
        if sc.train_correct:
            row.update(num_train=c.num_train, train_correct=int(sc.train_correct[i]))
        row["cluster"] = algo.cluster_of(server, states[c.cid])
        out.append(row)
    if sc.train_correct:
        out[0]["train_nll"] = float(sc.train_nll)  # summed over the node's clients
    return out


def check_private(shared: Any, private: State, cid: int, name: str) -> None:
    """Refuse to send ``shared`` when any of its tensors (of more than one element) equals a
    tensor of the client's private state: the last guard that a client's personal model,
    head or statistics never leave its node."""

    def keys(tree: Any) -> set[tuple]:
        return {
            (str(t.dtype), tuple(t.shape), hashlib.sha1(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest())
            for t in tensors(tree) if t.numel() > 1
        }  # fmt: skip

    sent = [shared.params, shared.buffers, shared.upload, shared.momentum]
    leaked = keys(sent) & keys(private)
    if leaked:
        raise FedshiftError(
            f"{name}: client {cid}'s reply holds {len(leaked)} tensor(s) of its private state; "
            "its shared_result must drop them (or private_state must not claim them)"
        )
