"""The runs of a grid trained as one job: their chunks side by side in one stacked chunk.

The runs of a grid (``compare --tune``, ``sweep``, ``reproduce --lr-grid``) that differ only
in their learning rate, momentum, weight decay or seed do the same work on models of the same
shape. Trained one after another, each pays the per-step cost of its own small chunk; trained
in lockstep, one vmapped step serves them all. Each run keeps its own simulator, client states,
memory plan, checkpoints and metrics, and runs in a greenlet of its own; its executor is a
:class:`Member` of a :class:`Lockstep`. A member's ``train`` hands the lockstep one chunk of
its jobs (``chunk_size`` of them, as the run alone would take) and waits; when every run still
going is waiting, the last to arrive trains all their chunks as one
(:meth:`~fedshift.engine.executors.batched.BatchedExecutor.train_rows`: each run's rows with
its own round settings, SGD settings per range of rows, its own data pool) and each run
continues with its own results, in the order its run alone yields them.

One run at a time, all in the calling thread: a run's greenlet runs its own code until it
waits for the others, so the runs never touch torch's global state at once, their numbers do
not depend on timing, and Ctrl-C interrupts whichever code is running, as for a run alone
(the others are stopped where they wait). A run that diverges, fails or finishes ends its
greenlet and the others go on without it.

Same numbers: a chunk's rows are computed row by row (``vmap``: per-row matrix products,
reductions and element-wise operations over each row), and the SGD update of a run's rows is
the same operations on a view of the same length as its chunk alone, so a run's metrics are
those of the run alone wherever its rows do not share a kernel call whose result depends on
the other rows (the batched executor's tests compare them bit for bit). Models whose chunks
do not vectorise (a convolutional model on the CPU, trained client by client) have nothing
to share: their members train alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import torch
from greenlet import greenlet

from fedshift.algorithms.base import Algorithm, ClientResult
from fedshift.engine.executors.base import Jobs, RoundWork
from fedshift.engine.executors.batched import BatchedExecutor, Row, vectorizes


class Lockstep:
    """Where the members of a grid meet: each runs in a greenlet of its own, all in the
    calling thread (:meth:`run`); a member's ``train`` hands in one chunk of jobs and
    switches back here, and when every member still running is waiting, their chunks train
    as one and each continues with its results."""

    def __init__(self, trainer: BatchedExecutor | None = None) -> None:
        self.trainer = trainer or BatchedExecutor()
        self.waiting: dict[Member, list[Row]] = {}
        self.done: dict[Member, list[ClientResult] | BaseException] = {}
        self.scheduler: greenlet | None = None
        #: what was trained together: combined chunks, their rows, members per chunk (max)
        self.stats = {"meetings": 0, "rows": 0, "widest": 0}

    def member(self, chunk_size: int = 64, vectorize: str = "auto") -> Member:
        return Member(self, chunk_size, vectorize)

    def run(self, bodies: list[Callable[[], Any]]) -> None:
        """Run every body (a run) to its end, each in its own greenlet, one at a time: a body
        runs until it waits for the others (:meth:`meet`) or ends. Ctrl-C (or any error) in one stops every other at its
        meeting point with KeyboardInterrupt (each keeps its last completed round) and is
        raised here once they have ended."""
        self.scheduler = greenlet.getcurrent()
        lets = [greenlet(b) for b in bodies]
        waiting = self.waiting
        try:
            while any(not g.dead for g in lets):
                for g in lets:
                    if not g.dead and g not in self._blocked():
                        g.switch()
                live = [g for g in lets if not g.dead]
                if live and len(waiting) == len(live):
                    self._train_waiting()
        except BaseException:
            for g in lets:
                if not g.dead:
                    with contextlib.suppress(BaseException):  # it ends, as it should
                        g.throw(KeyboardInterrupt)
            raise

    def _blocked(self) -> set[greenlet]:
        return {m.let for m in self.waiting if m.let is not None}

    def meet(self, member: Member, rows: list[Row]) -> list[ClientResult]:
        """Hand in a member's chunk and return its results once the chunks of every member
        still running have been trained together (a member's torch grad mode is its own)."""
        if self.scheduler is None:
            raise RuntimeError("a lockstep member trains inside Lockstep.run")
        member.let = greenlet.getcurrent()
        self.waiting[member] = rows
        grad = torch.is_grad_enabled()
        while member not in self.done:
            self.scheduler.switch()
        torch.set_grad_enabled(grad)
        out = self.done.pop(member)
        if isinstance(out, BaseException):
            raise out
        return out

    def _train_waiting(self) -> None:
        members = list(self.waiting)
        rows, owner = [], []
        for m in members:
            rows += self.waiting[m]
            owner += [m] * len(self.waiting[m])
        self.waiting.clear()
        self.stats["meetings"] += 1
        self.stats["rows"] += len(rows)
        self.stats["widest"] = max(self.stats["widest"], len(members))
        groups: dict[Member, list[tuple[int, list[tuple[int, ClientResult]]]]] = {
            m: [] for m in members
        }
        try:
            with torch.enable_grad():  # as the engine trains (an evaluation's tuning too)
                for idx, results in self.trainer.train_rows(rows):
                    mine: dict[Member, list[tuple[int, ClientResult]]] = {}
                    for i, r in zip(idx, results, strict=True):
                        mine.setdefault(owner[i], []).append((i, r))
                    for m, part in mine.items():
                        groups[m].append((part[0][0], part))
        except Exception as err:  # every member of this meeting hears of it
            for m in members:
                self.done[m] = err
            return
        for m in members:
            # the order of the member's run alone: its groups by their first row of its own
            ordered = sorted(groups[m], key=lambda g: g[0])
            self.done[m] = [r for _, part in ordered for _, r in part]


class Member(BatchedExecutor):
    """A run's executor in a :class:`Lockstep` (a batched executor: the run's memory plan
    sizes its ``chunk_size`` as for the run alone)."""

    def __init__(self, lockstep: Lockstep, chunk_size: int = 64, vectorize: str = "auto") -> None:
        super().__init__(chunk_size, vectorize)
        self.lockstep = lockstep
        self.let: greenlet | None = None  # the greenlet of the member's run

    def train(self, algo: Algorithm, jobs: Jobs, work: RoundWork) -> Iterator[ClientResult]:
        if not algo.supports_batched:
            raise ValueError(f"{algo.name} does not support the batched executor")
        if not vectorizes(self.vectorize, algo.ops.module, algo.ops.device):
            yield from super().train(algo, jobs, work)  # client by client: nothing to share
            return
        it = iter(jobs)
        while window := list(islice(it, self.chunk_size)):
            rows = [Row(algo, job, work) for job in window]
            window.clear()
            yield from self.lockstep.meet(self, rows)
