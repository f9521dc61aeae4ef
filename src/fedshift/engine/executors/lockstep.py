"""The runs of a grid trained as one job: their chunks side by side in one stacked chunk.

The runs of a grid (``compare --tune``, ``sweep``, ``reproduce --lr-grid``) that differ only
in their learning rate, momentum, weight decay or seed do the same work on models of the same
shape. Trained one after another, each pays the per-step cost of its own small chunk; trained
in lockstep, one vmapped step serves them all. Each run keeps its own simulator, client states,
memory plan, checkpoints and metrics, and runs in its own thread; its executor is a
:class:`Member` of a :class:`Lockstep`. A member's ``train`` hands the lockstep one chunk of
its jobs (``chunk_size`` of them, as the run alone would take) and waits; when every run still
going is waiting, the last to arrive trains all their chunks as one
(:meth:`~fedshift.engine.executors.batched.BatchedExecutor.train_rows`: each run's rows with
its own round settings, SGD settings per range of rows, its own data pool) and each run
continues with its own results, in the order its run alone yields them.

One run at a time: a run's thread holds the lockstep's lock while it runs its own code and
lets go only while it waits, so the runs never touch torch's global state at once and their
numbers do not depend on thread timing. A run that diverges, fails or finishes leaves
(:meth:`Lockstep.leave`) and the others go on without it.

Same numbers: a chunk's rows are computed row by row (``vmap``: per-row matrix products,
reductions and element-wise operations over each row), and the SGD update of a run's rows is
the same operations on a view of the same length as its chunk alone, so a run's metrics are
those of the run alone wherever its rows do not share a kernel call whose result depends on
the other rows (the batched executor's tests compare them bit for bit). Models whose chunks
do not vectorise (a convolutional model on the CPU, trained client by client) have nothing
to share: their members train alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import islice

from fedshift.algorithms.base import Algorithm, ClientResult
from fedshift.engine.executors.base import Jobs, RoundWork
from fedshift.engine.executors.batched import BatchedExecutor, Row, vectorizes


class Lockstep:
    """Where the members of a grid meet: each call of a member's ``train`` hands in one chunk
    of jobs, and the last member to arrive trains every waiting member's chunk at once."""

    def __init__(self, members: int, trainer: BatchedExecutor | None = None) -> None:
        self.cond = threading.Condition()
        self.live = members  # members still running (each leaves once)
        self.trainer = trainer or BatchedExecutor()
        self.waiting: dict[Member, list[Row]] = {}
        self.done: dict[Member, list[ClientResult] | BaseException] = {}
        self.stopping: BaseException | None = None
        #: what was trained together: combined chunks, their rows, members per chunk (max)
        self.stats = {"meetings": 0, "rows": 0, "widest": 0}

    def member(self, chunk_size: int = 64, vectorize: str = "auto") -> Member:
        return Member(self, chunk_size, vectorize)

    def meet(self, member: Member, rows: list[Row]) -> list[ClientResult]:
        """Hand in a member's chunk (with the lock held) and return its results once the
        chunks of every member still running have been trained together."""
        self._check_stop()
        self.waiting[member] = rows
        if len(self.waiting) >= self.live:
            self._train_waiting()
        while member not in self.done:
            self.cond.wait()
            self._check_stop()
        out = self.done.pop(member)
        if isinstance(out, BaseException):
            raise out
        return out

    def leave(self) -> None:
        """A member's run has ended (finished, diverged or failed): the others stop waiting
        for it (with the lock held)."""
        self.live -= 1
        if self.waiting and len(self.waiting) >= self.live:
            self._train_waiting()

    def stop(self, why: BaseException) -> None:
        """Stop every member at its next meeting (e.g. on Ctrl-C in the main thread)."""
        self.stopping = why
        with self.cond:
            self.cond.notify_all()

    def _check_stop(self) -> None:
        if self.stopping is not None:
            raise self.stopping

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
            for idx, results in self.trainer.train_rows(rows):
                mine: dict[Member, list[tuple[int, ClientResult]]] = {}
                for i, r in zip(idx, results, strict=True):
                    mine.setdefault(owner[i], []).append((i, r))
                for m, part in mine.items():
                    groups[m].append((part[0][0], part))
        except BaseException as err:  # every member of this meeting hears of it
            for m in members:
                self.done[m] = err
        else:
            for m in members:
                # the order of the member's run alone: its groups by their first row of its own
                self.done[m] = [
                    r for _, part in sorted(groups[m], key=lambda g: g[0]) for _, r in part
                ]
        self.cond.notify_all()


class Member(BatchedExecutor):
    """A run's executor in a :class:`Lockstep` (a batched executor: the run's memory plan
    sizes its ``chunk_size`` as for the run alone)."""

    def __init__(self, lockstep: Lockstep, chunk_size: int = 64, vectorize: str = "auto") -> None:
        super().__init__(chunk_size, vectorize)
        self.lockstep = lockstep

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
