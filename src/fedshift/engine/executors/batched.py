"""The batched executor: many clients (each with its K models) trained in one stream of kernels.

Clients are processed in chunks of ``chunk_size``. Within a chunk, every parameter is stacked
along a leading client dimension and each local step is one call of
``vmap(grad_and_value(local_loss))`` over the clients — the algorithm's own per-client loss —
followed by one stacked SGD update (the same arithmetic as :func:`~fedshift.engine.training.
sgd_step`). All schedules are built before the first step and moved to the device at once, so
the hot loop has no host-device synchronisation, no per-sample Python and no DataLoader.

Unequal clients:

- *sizes*: a client with fewer samples than the batch size has a shorter batch; batches are
  padded to a common size and the loss averages over the real samples only (``Batch.mask``).
- *steps*: a client that has finished its steps keeps computing on its last batch, but its
  update is masked to zero and its buffers are restored, so it is unchanged.

BatchNorm: the padded rows would enter the batch statistics, so for models with BatchNorm the
clients of a chunk are grouped by their exact sequence of batch sizes (no padding at all). Each
client's running statistics are its own stacked buffers, updated in place by its own forward
passes exactly as in the sequential executor, and averaged by the algorithm like parameters.

CPU: grouped-convolution kernels are slower there than per-client ones (measured 2.7x on the
Fashion-MNIST CNN), and a client loop already runs at the compute limit of a convolutional
model, so with ``vectorize="auto"`` a convolutional model on the CPU trains client by client on
the sequential executor's path (nothing stacked, nothing to gain: the same speed and memory);
models without convolutions (MLPs: small matrices, where one stacked call per step replaces
dozens of small kernels) and every model on a GPU take the vmapped path.

Each stage of a chunk runs in :mod:`fedshift.engine.executors.stage`. A phase's adversary (a min-max
stage's critic) takes its steps on each mini-batch before the phase's step, stacked like the
rest (:class:`~fedshift.engine.executors.stage.StackedAdversary`: per-client Adam moments and step
counts, finished clients masked).

Momentum kept across rounds (``task.momentum``) and augmentation follow the sequential
executor (see :mod:`fedshift.engine.executors.base`): stored buffers are stacked per chunk (a
missing one is zero, the exact equivalent of torch's first step) and the augmentation
parameters are drawn per client from its own generator, then applied to the chunk's batch.

Memory is bounded by the chunk: the executor takes ``chunk_size`` jobs at a time (the engine
builds a client's task only when it is taken), stacks them, and yields results that are views
into the stacked tensors, so a chunk's models exist once; peak use grows with ``chunk_size``
(which the run's memory plan sizes, :mod:`fedshift.engine.memory`), not with the number of
clients.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedshift.algorithms.base import (
    Algorithm,
    ClientResult,
    LocalTask,
)
from fedshift.engine.executors.base import (
    ClientJob,
    EpochStop,
    RoundWork,
    SequentialExecutor,
    augment_plans,
    phase_plans,
    sample_steps,
    task_generator,
    training_data,
)
from fedshift.engine.executors.stage import Chunk, RowInputs, row_ranges, run_stage
from fedshift.engine.training import merged_upload


def has_batchnorm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def stored_momentum(task: LocalTask) -> list[dict[str, torch.Tensor]]:
    """The client's stored momentum buffers per model, not copied: the stacked stage copies
    them into its own tensors (a changed number of models starts fresh)."""
    assert task.momentum is not None
    if len(task.momentum) != len(task.params):
        return [{} for _ in task.params]
    return [dict(m) for m in task.momentum]


def _stack(values: list[Any]) -> tuple[Any, Any]:
    """Stack per-client values along dim 0; shared objects are passed once (in_dims None).

    Tensors of unequal length along dim 0 are zero-padded (e.g. per-sample weights).
    """
    first = values[0]
    if all(v is first for v in values):
        return first, None
    if isinstance(first, dict):
        stacked = {k: _stack([v[k] for v in values]) for k in first}
        return {k: s[0] for k, s in stacked.items()}, {k: s[1] for k, s in stacked.items()}
    if isinstance(first, list | tuple):
        stacked = [_stack([v[i] for v in values]) for i in range(len(first))]
        return [s[0] for s in stacked], [s[1] for s in stacked]
    if isinstance(first, torch.Tensor):
        if first.ndim and any(v.shape != first.shape for v in values):
            n = max(v.shape[0] for v in values)
            values = [torch.cat([v, v.new_zeros((n - v.shape[0], *v.shape[1:]))]) for v in values]
        return torch.stack(values), 0
    return torch.tensor(values), 0


@dataclass(frozen=True)
class Row:
    """One job of a chunk with what trains it: its run's algorithm and round settings."""

    algo: Algorithm
    job: ClientJob
    work: RoundWork


def has_conv(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in module.modules())


def vectorizes(vectorize: str, module: nn.Module, device: torch.device) -> bool:
    """Whether a chunk's clients train in one vmapped call per step: ``vmap`` always, ``loop``
    never, ``auto`` except for convolutional models on the CPU, where grouped-convolution
    kernels are slower than per-client ones (2.7x on the Fashion-MNIST CNN) and a client loop
    already runs at the compute limit."""
    if vectorize == "auto":
        return device.type != "cpu" or not has_conv(module)
    return vectorize == "vmap"


class BatchedExecutor:
    """Trains chunks of clients at once with ``torch.func.vmap``; same numbers as sequential
    (to float tolerance; where it does not vectorise, exactly the sequential executor's)."""

    name = "batched"

    def __init__(self, chunk_size: int = 64, vectorize: str = "auto") -> None:
        if vectorize not in ("auto", "vmap", "loop"):
            raise ValueError(f"vectorize must be auto, vmap or loop, not {vectorize!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, not {chunk_size}")
        self.chunk_size = chunk_size
        self.vectorize = vectorize

    def train(
        self, algo: Algorithm, jobs: Iterable[ClientJob], work: RoundWork
    ) -> Iterator[ClientResult]:
        """Train the jobs' clients a chunk at a time (taking ``chunk_size`` jobs, then training
        them), yielding each chunk's results (streamed)."""
        if not algo.supports_batched:
            raise ValueError(f"{algo.name} does not support the batched executor")
        module = algo.ops.module
        if not vectorizes(self.vectorize, module, algo.ops.device):
            one = SequentialExecutor()
            for task, data in jobs:  # the per-client path: no stacking, one client in memory
                yield one.train_one(algo, task, data, work, float32_mean=True)
            return
        window: list[ClientJob] = []
        for job in jobs:
            window.append(job)
            if len(window) == self.chunk_size:
                yield from self._train_window(algo, window, work)
                window = []
        if window:
            yield from self._train_window(algo, window, work)

    def _train_window(
        self, algo: Algorithm, jobs: list[ClientJob], work: RoundWork
    ) -> Iterator[ClientResult]:
        """Up to ``chunk_size`` jobs: grouped by their stages (and, for BatchNorm models, by
        their exact batch sizes: no padding enters the batch statistics), a chunk per group."""
        rows = [Row(algo, job, work) for job in jobs]
        jobs.clear()  # the rows hold them now, and drop each chunk's once it is trained
        for _, out in self.train_rows(rows):
            yield from out

    def train_rows(self, rows: list[Row]) -> Iterator[tuple[list[int], list[ClientResult]]]:
        """Train ``rows`` (each a job with its algorithm and round settings; the runs of a grid
        trained as one job put theirs side by side, :mod:`fedshift.engine.lockstep`), grouped
        as :meth:`_train_window` says, keeping their order within a group; yields each group's
        row numbers and results. Rows of one algorithm instance and settings train exactly as
        a chunk of their run alone."""
        plans, augs = [], []
        for r in rows:
            (task, data), train = r.job, r.work.train
            gen = task_generator(task, r.work.seed, r.work.round, data.cid)
            plans.append(phase_plans(task, len(training_data(task, data)[0]), train, gen))
            augs.append(augment_plans(plans[-1], train, gen))
        groups: dict[Any, list[int]] = defaultdict(list)
        bn = has_batchnorm(rows[0].algo.ops.module) if rows else False
        for i, r in enumerate(rows):
            sizes = tuple(tuple(len(b) for b in phase) for phase in plans[i])
            groups[(r.job[0].phases, sizes if bn else 0)].append(i)
        padding = rows[0].work.train.crop_padding if rows else 0
        for chunk in groups.values():
            out = self._train_chunk(
                [rows[i] for i in chunk],
                [plans[i] for i in chunk],
                None if augs[0] is None else ([augs[i] for i in chunk], padding),
            )
            for i in chunk:  # this chunk's jobs are done: drop them before the next trains
                rows[i] = None  # type: ignore[call-overload]
            yield chunk, out

    def _train_chunk(
        self,
        rows: list[Row],
        plans: list[list[list[torch.Tensor]]],
        augs: tuple[list[list[list[torch.Tensor]]], int] | None,
    ) -> list[ClientResult]:
        """Train one chunk of clients that share their training stages (``plans[c][phase]``;
        ``augs``: the same structure of augmentation parameters, and the padding). Results
        hold views into the chunk's stacked tensors (what the engine keeps, its store copies).
        The chunk's model and losses are its first row's algorithm's; each row keeps its own
        round settings (SGD settings per range of equal rows) and its algorithm's upload."""
        algo = rows[0].algo
        jobs = [r.job for r in rows]
        tasks, views = [j[0] for j in jobs], [j[1] for j in jobs]
        splits = [training_data(t, v) for t, v in jobs]  # what each client trains on
        dev = splits[0][0].device
        n_max = max(len(i) for i, _ in splits)
        idx_pad = torch.stack([torch.cat([i, i.new_zeros(n_max - len(i))]) for i, _ in splits])
        y_pad = torch.stack([torch.cat([y, y.new_zeros(n_max - len(y))]) for _, y in splits])
        K = len(tasks[0].params)
        params = [
            {k: torch.stack([t.params[m][k] for t in tasks]).detach() for k in tasks[0].params[m]}
            for m in range(K)
        ]
        buffers = [
            {k: torch.stack([t.buffers[m][k] for t in tasks]) for k in tasks[0].buffers[m]}
            for m in range(K)
        ]
        extras, extras_dims = _stack([t.extras for t in tasks])
        moms = None if tasks[0].momentum is None else [stored_momentum(t) for t in tasks]
        pools = row_ranges([v.inputs for v in views])  # a grid's runs of other seeds: their own
        inputs = pools[0][2] if len(pools) == 1 else RowInputs(tuple(pools))
        chunk = Chunk(
            params, buffers, idx_pad, y_pad, inputs, extras, extras_dims,
            loss_sum=torch.zeros(len(jobs), device=dev), moms=moms,
        )  # fmt: skip
        module = algo.ops.module
        module.train()
        steps, done = [0] * len(jobs), [0] * len(jobs)
        for i, phase in enumerate(tasks[0].phases):
            stops = [
                EpochStop.of(phase, r.work.train, len(p[i]))
                for r, p in zip(rows, plans, strict=True)
            ]
            stage_augs = None if augs is None else ([a[i] for a in augs[0]], augs[1])
            sgd = row_ranges([r.work.sgd.for_phase(phase) for r in rows])
            ran = run_stage(
                algo, phase, [p[i] for p in plans], stage_augs, chunk,
                sgd[0][2] if len(sgd) == 1 else tuple(sgd), stops,
            )  # fmt: skip
            steps = [a + b for a, b in zip(steps, ran, strict=True)]
            for c, r in enumerate(ran):
                done[c] += sample_steps(phase, tasks[c].params, plans[c][i][:r])
        module.eval()
        losses = (chunk.loss_sum.cpu() / torch.tensor(steps).clamp_min(1)).tolist()
        out = []
        for c, v in enumerate(views):
            p = [{k: t[c] for k, t in params[m].items()} for m in range(K)]
            b = [{k: t[c] for k, t in buffers[m].items()} for m in range(K)]
            out.append(
                ClientResult(
                    cid=v.cid,
                    num_samples=len(splits[c][0]),
                    params=p,
                    buffers=b,
                    upload=merged_upload(
                        rows[c].algo.upload(tasks[c], p, b, v),
                        chunk.records.means(c),
                        algo.name,
                    ),
                    telemetry={
                        "train_loss": losses[c] if steps[c] else float("nan"),
                        "steps": steps[c],
                        "sample_steps": done[c],
                    },
                    momentum=None if moms is None else moms[c],
                    steps=steps[c],
                )
            )
        return out
