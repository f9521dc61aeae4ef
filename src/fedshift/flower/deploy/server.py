"""A real deployment's server: the clients' data and private states stay on their nodes.

In a deployment every SuperNode names its own data folder (node config ``data``; see
:mod:`fedshift.flower.deploy.node`). The server then knows the clients only by what their nodes
tell it (ids, split sizes, the input format) and runs fedshift's simulator with the client
side of each round on the nodes (:class:`DeployedSimulator`):

- **training**: each sampled client's node receives the server state and the round's
  settings, builds the client's task from the state it keeps, trains, updates that state on
  its own disk and replies with what the algorithm shares (``shared_result``);
- **evaluation** is federated: each node scores its clients on their own splits and replies
  with counts; the server pools them into ``local_acc`` (and its client mean), ``train_acc``,
  ``train_loss``, the clusters and each cluster's accuracy. Metrics that need the ground truth
  of a simulation (ARI/NMI against concepts, test-only clients, PM) are not measured; the run
  summary's ``evaluation`` says which metric was measured how.

A job whose reply is lost (its node was killed or restarted, or Flower reports the node
unavailable) is sent again after ``resend_s`` seconds to the node that serves its client
then; a node computes a job again from the state before the job's round, so a job done twice
gives the same result.

The server trusts no reply: each is checked against what the server sent and what its node
declared at the handshake (:mod:`fedshift.flower.deploy.replies`); one that does not fit is
dropped for its round with a warning naming the node, the client and what was wrong, and
more than ``flower.max_dropped_replies`` dropped replies stop the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedshift.algorithms.base import ClientResult
from fedshift.core.errors import FedshiftError
from fedshift.core.version import VERSION as __version__
from fedshift.flower.codec import META, decode_result, from_bytes, to_bytes
from fedshift.flower.deploy.replies import ModelSpec, check_result, check_rows

logger = logging.getLogger("flwr")

#: how each metric of a deployment is measured (the run summary's ``evaluation``)
MEASURED = {
    "local_acc": "federated: each node's correct counts on its clients' own test splits, pooled",
    "local_acc_client_mean": "federated: the mean over clients of their own test accuracies",
    "train_acc": "federated: the nodes' correct counts on their clients' train splits, pooled",
    "train_loss": "federated: the nodes' summed train NLL over all train samples",
    "clusters": "federated: the cluster each node reports for its clients",
    "cluster_acc_<k>": "federated: local_acc pooled over the clients of cluster k",
    "ari_concept, nmi_*, global_acc, pm_*": "not measured: they need the ground truth (concepts, "
    "test-only clients) that only a simulation has",
}


class DeployedClients:
    """The clients of a deployment, reached through Flower's ``grid``: the handshake, the
    jobs of a round (sent, resent when lost, replies in order) and the node store's reset."""

    name = "flower-deployment"

    def __init__(
        self,
        grid: Grid,
        config: str,
        device: torch.device | str = "cpu",
        wait_s: float = 300.0,
        resend_s: float = 600.0,
        poll_s: float = 0.05,
        stop: threading.Event | None = None,
        max_dropped: int = 10,
        norm_ratio: float = 100.0,
    ) -> None:
        self.grid, self.config, self.device = grid, config, torch.device(device)
        self.wait_s, self.resend_s, self.poll_s, self.stop = wait_s, resend_s, poll_s, stop
        self.node: dict[int, int] = {}  # client id -> node id
        self.info: dict[int, dict[str, Any]] = {}  # client id -> what its node said
        self.format: dict[str, Any] = {}
        self.run_meta = {"evaluation": MEASURED}
        self.declared: dict[int, set[int]] = {}  # node id -> the clients it said it holds
        self.max_dropped, self.norm_ratio = max_dropped, norm_ratio
        self.dropped = 0

    # ------------------------------------------------------------------ nodes
    def connect(self, num_clients: int, wait_s: float | None = None) -> None:
        """Ask every node for its clients until clients ``0..num_clients-1`` all have one
        (within ``wait_s``); a client a later node claims moves to it (a restarted node)."""
        deadline = time.monotonic() + (self.wait_s if wait_s is None else wait_s)
        asked: set[int] = set()
        pending: set[str] = set()
        covered = 0.0  # when every client had a node
        while True:
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            asked.update(new)
            hello = ConfigRecord({"action": "hello"})
            msgs = [Message(RecordDict({META: hello}), n, "query", group_id="hello") for n in new]
            pending.update(self.grid.push_messages(msgs) if msgs else [])
            for reply in self.grid.pull_messages(list(pending)) if pending else []:
                pending.discard(reply.metadata.reply_to_message_id)
                self._register(reply)
            missing = sorted(set(range(num_clients)) - set(self.node))
            if not missing:
                covered = covered or time.monotonic()
                if not pending or time.monotonic() - covered > 2.0:
                    return  # a stale node that never answers does not hold the run up
            if time.monotonic() > deadline:
                raise FedshiftError(
                    f"Flower deployment: no node holds clients {missing} after "
                    f"{self.wait_s:g} s ({len(asked)} nodes asked); start a SuperNode with "
                    'node config data="<folder>" for each (folders: `fedshift export`)'
                )
            self._sleep(self.poll_s if pending else 0.2)

    def _register(self, reply: Message) -> None:
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise FedshiftError(f"Flower node {node}: {reply.error.reason}")
        rec = reply.content.config_records[META]
        if rec.get("mode") != "own-data":
            raise FedshiftError(
                f"Flower node {node} serves simulated clients (partition-id) while others "
                'name their own data; start every SuperNode with node config data="<folder>"'
            )
        if rec["fedshift"] != __version__:
            raise FedshiftError(
                f"Flower node {node} runs fedshift {rec['fedshift']}, the server {__version__}"
            )
        info = from_bytes(rec["info"])
        fmt = {k: info[k] for k in ("num_classes", "input_shape", "image")}
        if self.format and fmt != self.format:
            raise FedshiftError(
                f"Flower node {node}: its data is {fmt}, other nodes' {self.format}"
            )
        self.format = fmt
        self.declared[node] = {c["cid"] for c in info["clients"]}
        for c in info["clients"]:
            old = self.node.get(c["cid"])
            if old is not None and old != node:
                logger.info(
                    "fedshift: client %d now served by node %d (was %d)", c["cid"], node, old
                )
            self.node[c["cid"]], self.info[c["cid"]] = node, c

    def nodes_of(self, cids: list[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for cid in cids:
            out.setdefault(self.node[cid], []).append(cid)
        return out

    # ------------------------------------------------------------------ jobs
    def exchange(self, kind: str, jobs: list[tuple[int, dict]], shared: bytes, rnd: int):
        """Send job i (client id, payload) to its client's node as a ``kind`` message with the
        common ``shared`` bytes (the server state); yield the replies in order."""
        sent: dict[str, int] = {}  # message id -> job
        when: dict[int, float] = {}

        def send(i: int) -> None:
            cid, payload = jobs[i]
            rec = ConfigRecord(
                {"job": to_bytes(payload, f"the job of client {cid}"), "server": shared,
                 "index": i, "config": self.config}
            )  # fmt: skip
            msg = Message(RecordDict({META: rec}), self.node[cid], kind, group_id=str(rnd))
            for mid in self.grid.push_messages([msg]):
                sent[mid], when[i] = i, time.monotonic()

        for i in range(len(jobs)):
            send(i)
        ready: dict[int, Message] = {}
        nxt = 0
        while nxt < len(jobs):
            waiting = [m for m, i in sent.items() if i >= nxt and i not in ready]
            for reply in self.grid.pull_messages(waiting):
                i = sent.pop(reply.metadata.reply_to_message_id, None)
                if i is None or i in ready or i < nxt:
                    continue  # the reply to a job sent again
                if reply.has_error():
                    if "unavailable" not in reply.error.reason.lower():
                        cid = jobs[i][0]
                        raise FedshiftError(
                            f"Flower: round {rnd}, client {cid}: {reply.error.reason}"
                        )
                    self._resend(i, jobs, send, rnd, "its node is unavailable")
                    continue
                ready[i] = reply
            while nxt in ready:
                yield ready.pop(nxt)
                nxt += 1
            late = [
                i
                for i in range(nxt, len(jobs))
                if i not in ready and time.monotonic() - when[i] > self.resend_s
            ]
            for i in late:
                self._resend(i, jobs, send, rnd, f"no reply within {self.resend_s:g} s")
            if nxt < len(jobs):
                self._sleep(self.poll_s)

    def _resend(self, i: int, jobs, send, rnd: int, why: str) -> None:
        cid = jobs[i][0]
        logger.warning("fedshift: round %d, client %d: %s; sending its job again", rnd, cid, why)
        self.node.pop(cid, None)
        self.connect_client(cid)
        send(i)

    def connect_client(self, cid: int) -> None:
        """Wait (up to ``wait_s``) until a node serves client ``cid`` again."""
        deadline = time.monotonic() + self.wait_s
        while cid not in self.node:
            self._refresh()
            if cid in self.node:
                return
            if time.monotonic() > deadline:
                raise FedshiftError(f"Flower deployment: client {cid}'s node did not come back")
            self._sleep(1.0)

    def _refresh(self) -> None:
        """Ask every connected node again which clients it holds."""
        msgs = [
            Message(
                RecordDict({META: ConfigRecord({"action": "hello"})}), n, "query", group_id="hello"
            )
            for n in self.grid.get_node_ids()
        ]
        ids = set(self.grid.push_messages(msgs)) if msgs else set()
        deadline = time.monotonic() + 30.0
        while ids and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(ids)):
                ids.discard(reply.metadata.reply_to_message_id)
                if not reply.has_error():
                    self._register(reply)
            self._sleep(self.poll_s)

    def train_round(
        self, server: Any, jobs: list[tuple[int, dict]], rnd: int
    ) -> Iterator[ClientResult]:
        shared = to_bytes(server, "the server state")
        spec = ModelSpec(server)
        replies = self.exchange("train", jobs, shared, rnd)
        for (cid, _), reply in zip(jobs, replies, strict=True):
            node = reply.metadata.src_node_id
            why = self._not_declared(node, [cid])
            result = None
            if why is None:
                try:
                    result = decode_result(reply.content, self.device)[1]
                except Exception as err:  # noqa: BLE001 - whatever a node sent
                    why = f"its reply cannot be read ({type(err).__name__}: {err})"
            if why is None:
                why = check_result(result, cid, self.info[cid], spec, self.norm_ratio)
            if why is None:
                yield result
            else:
                self._drop(rnd, node, f"client {cid}", why)

    def evaluate_round(self, server: Any, job: dict, cids: list[int], rnd: int) -> list[dict]:
        shared = to_bytes(server, "the server state")
        jobs = [(c[0], {**job, "cids": c}) for c in self.nodes_of(cids).values()]
        train = bool(job.get("train_metrics"))
        rows = []
        replies = self.exchange("evaluate", jobs, shared, rnd)
        for (_, payload), reply in zip(jobs, replies, strict=True):
            node, asked = reply.metadata.src_node_id, payload["cids"]
            why = self._not_declared(node, asked)
            if why is None:
                try:
                    got = from_bytes(reply.content.config_records[META]["rows"])
                except Exception as err:  # noqa: BLE001 - whatever a node sent
                    why = f"its reply cannot be read ({type(err).__name__}: {err})"
            if why is None:
                why = check_rows(got, asked, self.info, train)
            if why is None:
                rows += got
            else:
                names = ", ".join(str(c) for c in asked)
                self._drop(rnd, node, f"evaluation of clients {names}", why)
        return rows

    def _not_declared(self, node: int, cids: list[int]) -> str | None:
        other = [c for c in cids if c not in self.declared.get(node, ())]
        return f"it did not declare clients {other}" if other else None

    def _drop(self, rnd: int, node: int, what: str, why: str) -> None:
        """Drop a node's reply for this round (one warning), or stop the run when more than
        ``max_dropped`` replies were dropped."""
        self.dropped += 1
        line = f"round {rnd}, node {node}, {what}: reply dropped: {why}"
        if self.dropped > self.max_dropped:
            raise FedshiftError(
                f"Flower deployment: {self.dropped} replies dropped, more than "
                f"flower.max_dropped_replies={self.max_dropped}; the last: {line}"
            )
        logger.warning("fedshift: %s", line)

    def reset(self, run: str) -> None:
        """Every node forgets its client states of run ``run`` (a run starting over)."""
        rec = {"action": "reset", "run": run}
        for node in sorted(set(self.node.values())):
            msg = Message(RecordDict({META: ConfigRecord(rec)}), node, "query", group_id="reset")
            ids = set(self.grid.push_messages([msg]))
            deadline = time.monotonic() + self.wait_s
            while ids:
                for reply in self.grid.pull_messages(list(ids)):
                    ids.discard(reply.metadata.reply_to_message_id)
                    if reply.has_error():
                        raise FedshiftError(f"Flower node {node}: {reply.error.reason}")
                if time.monotonic() > deadline:
                    raise FedshiftError(f"Flower node {node} did not confirm the reset")
                self._sleep(self.poll_s)

    def train(self, *args: Any, **kwargs: Any):
        raise FedshiftError("a deployment trains on its nodes (DeployedSimulator)")

    def _sleep(self, seconds: float) -> None:
        if self.stop is None:
            time.sleep(seconds)
        elif self.stop.wait(seconds):
            raise FedshiftError("Flower: the run was stopped while waiting for its nodes")
