"""An executor that trains fedshift's jobs on Flower nodes (SuperNodes) through a ``Grid``.

:class:`FlowerExecutor` implements fedshift's ``Executor`` protocol, so the
:class:`~fedshift.engine.simulator.Simulator` runs unchanged on top of Flower: sampling, client
tasks, aggregation, clustering state, evaluation and checkpoints stay fedshift's own, and only
local training travels to the nodes, one train message per job.

Which node trains a client: each node reports its ``partition-id`` and ``num-partitions``
(its node config; Flower's simulation engine sets both) in a one-time ``query`` handshake, and
client ``cid`` goes to partition ``cid % num-partitions``. With one node per client (the
default of ``fedshift flower``) node p is client p; with fewer, a node serves several clients.
Results are yielded **in the jobs' order** (buffered as replies arrive), so aggregation sums in
the same order as fedshift's own executors and the numbers match theirs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fedshift.algorithms.base import Algorithm, ClientResult
from fedshift.core.errors import FedshiftError
from fedshift.core.version import VERSION as __version__
from fedshift.engine.executors.base import Jobs, RoundWork
from fedshift.flower.client_app import NODE_RECORD, NUM_PARTITIONS, PARTITION_ID
from fedshift.flower.codec import TrainRequest, decode_result, encode_request


class FlowerExecutor:
    """Trains jobs on the Flower nodes of ``grid``.

    ``config`` is the run's resolved config (YAML), sent with every job so that a node builds
    the same scenario and algorithm. ``device``: where decoded results live (the server's).
    ``wait_s``: how long to wait for the nodes of every partition to connect; ``timeout_s``:
    how long to wait for a round's replies (None: until the messages' TTL). ``stop``: set
    when the run must end (e.g. Ctrl-C in the process that hosts the ServerApp's thread), so
    that waiting for replies that will never come ends. ``push_chunk``: jobs encoded and
    pushed at a time.
    """

    name = "flower"

    def __init__(
        self,
        grid: Grid,
        config: str,
        device: torch.device | str = "cpu",
        wait_s: float = 300.0,
        timeout_s: float | None = None,
        poll_s: float = 0.05,
        stop: threading.Event | None = None,
        push_chunk: int = 64,
    ) -> None:
        self.grid, self.config, self.device = grid, config, torch.device(device)
        self.wait_s, self.timeout_s, self.poll_s = wait_s, timeout_s, poll_s
        self.stop, self.push_chunk = stop, push_chunk
        self.partitions: dict[int, int] = {}  # partition id -> node id
        self.num_partitions = 0

    # ------------------------------------------------------------------ nodes
    def connect(self) -> dict[int, int]:
        """Ask every connected node for its partition (a ``query`` message) until every
        partition of ``num-partitions`` has a node, waiting up to ``wait_s`` for late nodes; a
        node that never answers (e.g. a stale one) does not hold the run up. Return the map
        partition id -> node id."""
        asked: set[int] = set()
        pending: set[str] = set()
        deadline = time.monotonic() + self.wait_s
        while not (self.num_partitions and len(self.partitions) == self.num_partitions):
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            if new:
                asked.update(new)
                msgs = [Message(RecordDict(), n, "query", group_id="handshake") for n in new]
                pending.update(self.grid.push_messages(msgs))
            for reply in self.grid.pull_messages(list(pending)) if pending else []:
                pending.discard(reply.metadata.reply_to_message_id)
                self._register(reply)
            if self.num_partitions and len(self.partitions) == self.num_partitions:
                break
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.num_partitions)) - set(self.partitions))
                raise FedshiftError(
                    f"Flower: no node connected for partitions {missing or 'any'} within "
                    f"{self.wait_s:g} s ({len(asked)} nodes asked); start one SuperNode per "
                    f'partition with --node-config "{PARTITION_ID}=P {NUM_PARTITIONS}=N"'
                )
            self._sleep(self.poll_s if pending else 0.2)
        return self.partitions

    def _register(self, reply: Message) -> None:
        """Record a node's partition from its handshake reply (or raise its error)."""
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise FedshiftError(f"Flower node {node}: {reply.error.reason}")
        info = reply.content.config_records[NODE_RECORD]
        part, total = int(info[PARTITION_ID]), int(info[NUM_PARTITIONS])
        if info["fedshift"] != __version__:
            raise FedshiftError(
                f"Flower node {node} runs fedshift {info['fedshift']}, the server "
                f"{__version__}; install the same version on every node"
            )
        if self.num_partitions and total != self.num_partitions:
            raise FedshiftError(
                f"Flower nodes disagree on {NUM_PARTITIONS}: {total} (node {node}) and "
                f"{self.num_partitions}"
            )
        if part in self.partitions and self.partitions[part] != node:
            raise FedshiftError(
                f"Flower nodes {self.partitions[part]} and {node} both have "
                f"{PARTITION_ID}={part}; give every SuperNode its own"
            )
        self.num_partitions, self.partitions[part] = total, node

    def node_of(self, cid: int) -> int:
        """The node that trains client ``cid``."""
        return self.partitions[cid % self.num_partitions]

    # ------------------------------------------------------------------ training
    def train(self, algo: Algorithm, jobs: Jobs, work: RoundWork) -> Iterator[ClientResult]:
        """Send every job to its client's node, then yield the results in the jobs' order
        (the jobs are taken one by one as they are encoded)."""
        if not len(jobs):
            return
        rnd = work.round
        self.connect()
        ids: list[str] = []
        cids: list[int] = []
        taken = iter(jobs)
        for start in range(0, len(jobs), self.push_chunk):  # bounded encoded copies in memory
            msgs = []
            for i in range(start, min(start + self.push_chunk, len(jobs))):
                task, view = next(taken)
                cids.append(view.cid)
                req = TrainRequest(task, view, work, i, self.config)
                node = self.node_of(view.cid)
                msgs.append(Message(encode_request(req), node, "train", group_id=str(rnd)))
            sent = set(self.grid.push_messages(msgs))
            lost = [m.metadata.dst_node_id for m in msgs if m.metadata.message_id not in sent]
            if lost:
                raise FedshiftError(f"Flower: round {rnd}: messages to nodes {lost} not sent")
            ids += [m.metadata.message_id for m in msgs]
        yield from self._replies(ids, cids, rnd)

    def _replies(self, ids: list[str], cids: list[int], rnd: int) -> Iterator[ClientResult]:
        """Pull replies as they arrive; yield them in the jobs' order."""
        pending, ready, nxt = set(ids), {}, 0
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while nxt < len(ids):
            for reply in self.grid.pull_messages(list(pending)):
                pending.discard(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    i = ids.index(reply.metadata.reply_to_message_id)
                    raise FedshiftError(
                        f"Flower: round {rnd}, client {cids[i]} (node "
                        f"{reply.metadata.src_node_id}): {reply.error.reason}"
                    )
                index, result = decode_result(reply.content, self.device)
                ready[index] = result
            while nxt in ready:
                yield ready.pop(nxt)
                nxt += 1
            if nxt < len(ids):
                if deadline is not None and time.monotonic() > deadline:
                    waiting = sorted(cids[ids.index(m)] for m in pending)
                    raise FedshiftError(
                        f"Flower: round {rnd}: no reply from clients {waiting} within "
                        f"{self.timeout_s:g} s"
                    )
                self._sleep(self.poll_s)

    def _sleep(self, seconds: float) -> None:
        """Wait between polls; a set ``stop`` ends the run."""
        if self.stop is None:
            time.sleep(seconds)
        elif self.stop.wait(seconds):
            raise FedshiftError("Flower: the run was stopped while waiting for its nodes")
