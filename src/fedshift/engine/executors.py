"""Executors run the sampled clients' local training.

:class:`SequentialExecutor` is the readable reference: one client after another, each of its K
models trained with the shared functional SGD of :mod:`fedshift.engine.training`. Faster
executors must give the same numbers for the same seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from fedshift.algorithms.base import Algorithm, Batch, ClientData, ClientResult, LocalTask
from fedshift.engine.training import (
    SGDConfig,
    batch_schedule,
    derive_seed,
    num_local_steps,
    sgd_step,
)

#: stream id of the per-client shuffling generator (see derive_seed)
SHUFFLE_STREAM = 12


@dataclass(frozen=True)
class LocalSchedule:
    """How long and in which batches a client trains."""

    batch_size: int
    epochs: int
    drop_last: bool
    steps: int | None = None


def client_generator(seed: int, rnd: int, cid: int) -> torch.Generator:
    """The generator of a client's mini-batch order in a round (independent of everything else)."""
    return torch.Generator().manual_seed(derive_seed(seed, SHUFFLE_STREAM, rnd, cid))


class SequentialExecutor:
    """Trains the sampled clients one after another (the reference executor)."""

    name = "sequential"

    def train(
        self,
        algo: Algorithm,
        jobs: list[tuple[LocalTask, ClientData]],
        sgd: SGDConfig,
        sched: LocalSchedule,
        seed: int,
        rnd: int,
    ) -> Iterator[ClientResult]:
        """Train the jobs' clients; results are yielded as they finish (streamed)."""
        for task, data in jobs:
            yield self.train_one(algo, task, data, sgd, sched, seed, rnd)

    def train_one(
        self,
        algo: Algorithm,
        task: LocalTask,
        data: ClientData,
        sgd: SGDConfig,
        sched: LocalSchedule,
        seed: int,
        rnd: int,
    ) -> ClientResult:
        params = [
            {k: v.detach().clone().requires_grad_(True) for k, v in p.items()} for p in task.params
        ]
        buffers = [{k: v.detach().clone() for k, v in b.items()} for b in task.buffers]
        n = data.num_train
        loss_sum = torch.zeros((), device=data.train_idx.device)
        gen = client_generator(seed, rnd, data.cid)
        module = algo.ops.module
        module.train()
        total = 0
        for phase, plan in zip(task.phases, phase_plans(task, n, sched, gen), strict=True):
            loss_fn = getattr(algo, phase.loss)
            flat = [
                params[m][k] for m in range(len(params)) for k in phase.trained_names(m, params[m])
            ]
            momentum: list[torch.Tensor | None] = [None] * len(flat)
            cfg = sgd.for_phase(phase)
            for pos in plan:
                pos = pos.to(data.train_idx.device)
                batch = Batch(x=data.inputs(data.train_idx[pos]), y=data.y_train[pos], pos=pos)
                loss = loss_fn(params, buffers, batch, task.extras)
                grads = torch.autograd.grad(loss, flat, allow_unused=True)
                sgd_step(flat, list(grads), momentum, cfg)
                loss_sum += loss.detach()
            total += len(plan)
        module.eval()
        mean_loss = float(loss_sum) / total if total else float("nan")
        params = [{k: v.detach() for k, v in p.items()} for p in params]
        return ClientResult(
            cid=data.cid,
            num_samples=n,
            params=params,
            buffers=buffers,
            stats={
                "train_loss": mean_loss,
                "steps": total,
                **algo.local_stats(task, params, buffers, data),
            },
        )


def phase_plans(
    task: LocalTask, n: int, sched: LocalSchedule, gen: torch.Generator
) -> list[list[torch.Tensor]]:
    """Mini-batch positions of every step of every training stage of a task, drawn in order
    from the client's generator (no steps when the task does not train)."""
    plans = []
    for phase in task.phases:
        epochs = sched.epochs if phase.epochs is None else phase.epochs
        fixed = sched.steps if phase.epochs is None else None
        steps = num_local_steps(n, sched.batch_size, epochs, sched.drop_last, fixed)
        if not task.train or epochs == 0:
            steps = 0
        plans.append(batch_schedule(n, sched.batch_size, steps, sched.drop_last, gen))
    return plans
