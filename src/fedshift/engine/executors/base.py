"""Executors run local training tasks: the sampled clients' each round, and the fine-tuning
tasks of an evaluation.

An executor is anything with the :class:`Executor` interface. :class:`SequentialExecutor` is
the readable reference: one client after another, each of its K models trained with the shared
functional SGD of :mod:`fedshift.engine.training`. Faster executors must give the same numbers
for the same seed. After training, an executor calls the algorithm's ``upload`` hook and returns
it in ``ClientResult.upload``, beside its own ``telemetry`` (mean training loss, steps).

Three things every executor does the same way:

- *Stages.* A task's phases run in order; a phase's overrides (lr, epochs or steps, batch size,
  drop_last, momentum, weight decay, clipping) replace the run's settings for that phase. A
  phase's adversary (a min-max stage's critic) takes its own optimiser steps on every
  mini-batch before the phase's step, on scratch copies of the buffers (:class:`AdversaryRun`),
  after its warm-up steps at the start of the stage (``Adversary.warmup_steps``).
- *Recorded values.* A loss may return ``(loss, values)``; each value's mean over the client's
  steps joins its upload (:func:`~fedshift.algorithms.task.loss_and_values`).
- *Randomness.* A client's mini-batch order is drawn first, then (with augmentation on) every
  sample's crop offsets and flip, all from the client's own generator (:func:`task_generator`:
  the engine's per round and client stream, or the task's ``stream``), so they depend on the
  run seed, the round and the client only.
- *Momentum across rounds.* When a task carries ``momentum`` (the engine's
  ``train.keep_momentum``), each trained parameter's SGD momentum buffer starts from the
  client's stored one (a missing buffer is zero, which is exactly torch's first step) and the
  buffers after training come back in ``ClientResult.momentum``. Without it every stage starts
  fresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from fedshift.algorithms.base import (
    Adversary,
    Algorithm,
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Phase,
    TensorDict,
    loss_and_values,
)
from fedshift.config import TrainConfig
from fedshift.core.seeds import SHUFFLE_STREAM, generator
from fedshift.data.augment import CropFlip, draw_crop_flip
from fedshift.engine.training import (
    LossRecords,
    SGDConfig,
    adam_step,
    batch_schedule,
    merged_upload,
    num_local_steps,
    round_lr,
    sgd_step,
)


@dataclass(frozen=True)
class RoundWork:
    """One round's local training, the one value the simulator hands every executor: the
    run's training settings (the config's ``train`` section, resolved), the run seed and the
    round number. Executors read every setting from here: the schedule (``train.batch_size``,
    ``local_epochs``, ``local_steps``, ``drop_last``, ``augment``, ``crop_padding``) from
    ``train`` and the round's SGD settings from :attr:`sgd` (its learning rate decayed to this
    round), so a new training setting is one field of :class:`~fedshift.config.TrainConfig`.
    ``train.lr`` is round 1's rate; :attr:`lr` is this round's."""

    train: TrainConfig
    seed: int = 0
    round: int = 1

    @classmethod
    def of(cls, seed: int = 0, round: int = 1, **settings: Any) -> RoundWork:
        """A round's work from ``train`` settings given by name (validated; the others are
        :class:`~fedshift.config.TrainConfig`'s defaults)."""
        return cls(TrainConfig(**settings), seed, round)

    @property
    def lr(self) -> float:
        """This round's learning rate (``train.lr`` under ``train.lr_decay``)."""
        return round_lr(self.train.lr, self.train.lr_decay, self.round)

    @property
    def sgd(self) -> SGDConfig:
        """The round's SGD settings (a stage's overrides apply on top: ``sgd.for_phase``)."""
        t = self.train
        return SGDConfig(self.lr, t.momentum, t.weight_decay, t.grad_clip)

    def tuning(self) -> RoundWork:
        """The work of an evaluation's fine-tuning: this round's, without augmentation."""
        return replace(self, train=self.train.model_copy(update={"augment": "none"}))

    def to_dict(self) -> dict[str, Any]:
        """Plain values (dicts, numbers, strings), to send to another process or node."""
        return {"train": self.train.model_dump(), "seed": self.seed, "round": self.round}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoundWork:
        """The work of :meth:`to_dict`."""
        return cls(TrainConfig.model_validate(d["train"]), int(d["seed"]), int(d["round"]))


#: a client's task and its data
ClientJob = tuple[LocalTask, ClientData]


class LazyJobs:
    """A round's jobs, each built when the executor takes it (``build(cid)``): a client's task
    holds its start models and kept momentum, so only the clients being trained have one, not
    the whole round. Iterate once, in order; ``len`` is the number of clients."""

    def __init__(self, cids: Sequence[int], build: Callable[[int], ClientJob]) -> None:
        self.cids, self.build = list(cids), build

    def __len__(self) -> int:
        return len(self.cids)

    def __iter__(self) -> Iterator[ClientJob]:
        for cid in self.cids:
            yield self.build(cid)


#: what an executor trains: a sized iterable of jobs (a list, or :class:`LazyJobs`)
Jobs = Sequence[ClientJob] | LazyJobs


class Executor(Protocol):
    """What the engine needs of an executor."""

    name: str

    def train(self, algo: Algorithm, jobs: Jobs, work: RoundWork) -> Iterator[ClientResult]:
        """Train every job with the round's settings (``work``) and yield each client's result
        as it is ready (streamed, in any order). Take the jobs as they are needed (``jobs`` may
        build each one on demand) and hold only those of the clients being trained."""
        ...


def client_generator(seed: int, rnd: int, cid: int) -> torch.Generator:
    """The engine's generator of a client's mini-batch order (and augmentation) in a round."""
    return generator(seed, SHUFFLE_STREAM, rnd, cid)


def task_generator(task: LocalTask, seed: int, rnd: int, cid: int) -> torch.Generator:
    """The generator of a task: its own ``stream`` when it names one, else the engine's."""
    return generator(*task.stream) if task.stream is not None else client_generator(seed, rnd, cid)


class SequentialExecutor:
    """Trains the jobs one after another (the reference executor)."""

    name = "sequential"

    def train(
        self, algo: Algorithm, jobs: Iterable[ClientJob], work: RoundWork
    ) -> Iterator[ClientResult]:
        """Train the jobs' clients; results are yielded as they finish (streamed)."""
        for task, data in jobs:
            yield self.train_one(algo, task, data, work)

    def train_one(
        self,
        algo: Algorithm,
        task: LocalTask,
        data: ClientData,
        work: RoundWork,
        float32_mean: bool = False,
    ) -> ClientResult:
        """One client's training. ``float32_mean``: the mean training loss divided in float32,
        as the batched executor's stacked paths compute it (its per-client path gives the same
        telemetry, to the bit, whichever path a chunk takes)."""
        params = [
            {k: v.detach().clone().requires_grad_(True) for k, v in p.items()} for p in task.params
        ]
        buffers = [{k: v.detach().clone() for k, v in b.items()} for b in task.buffers]
        train_idx, y_train = training_data(task, data)
        n = len(train_idx)
        loss_sum = torch.zeros((), device=train_idx.device)
        train, sgd = work.train, work.sgd
        gen = task_generator(task, work.seed, work.round, data.cid)
        plans = phase_plans(task, n, train, gen)
        augs = augment_plans(plans, train, gen)
        momentum = start_momentum(task)
        module = algo.ops.module
        module.train()
        total = done = 0
        records = LossRecords()

        def batch_of(p_i: int, s: int, step: int) -> Batch:
            pos = plans[p_i][s].to(train_idx.device)
            idx = train_idx[pos]
            if augs is None:
                x = data.inputs(idx)
            else:
                x = data.inputs(idx, CropFlip(augs[p_i][s], train.crop_padding))
            return Batch(x=x, y=y_train[pos], pos=pos, step=step)

        for p_i, (phase, plan) in enumerate(zip(task.phases, plans, strict=True)):
            loss_fn = getattr(algo, phase.loss)
            names = [(m, k) for m in range(len(params)) for k in phase.trained_names(m, params[m])]
            flat = [params[m][k] for m, k in names]
            bufs = [None if momentum is None else momentum[m].get(k) for m, k in names]
            cfg = sgd.for_phase(phase)
            stop = EpochStop.of(phase, train, len(plan))
            adversary = AdversaryRun.of(algo, phase, params, records)
            ran = len(plan)
            if adversary is not None and plan:  # warm-up: the adversary alone, batch w mod S
                for w in range(adversary.adv.warmup_steps):
                    adversary.train(
                        params, buffers, batch_of(p_i, w % len(plan), 0), task.extras, 1
                    )
            for s in range(len(plan)):
                batch = batch_of(p_i, s, s)
                if adversary is not None:
                    adversary.train(params, buffers, batch, task.extras)
                loss, values = loss_and_values(loss_fn(params, buffers, batch, task.extras))
                records.add(values)
                grads = torch.autograd.grad(loss, flat, allow_unused=True)
                sgd_step(flat, list(grads), bufs, cfg)
                loss_sum += loss.detach()
                if stop is not None and stop.after(float(loss.detach())):
                    ran = s + 1
                    break
            if momentum is not None:
                store_momentum(momentum, names, bufs)
            total += ran
            done += sample_steps(phase, params, plan[:ran])
        module.eval()
        if not total:
            mean_loss = float("nan")
        elif float32_mean:
            mean_loss = float(loss_sum.cpu() / torch.tensor(total))
        else:
            mean_loss = float(loss_sum) / total
        params = [{k: v.detach() for k, v in p.items()} for p in params]
        return ClientResult(
            cid=data.cid,
            num_samples=n,
            params=params,
            buffers=buffers,
            upload=merged_upload(
                algo.upload(task, params, buffers, data), records.means(), algo.name
            ),
            telemetry={"train_loss": mean_loss, "steps": total, "sample_steps": done},
            momentum=momentum,
            steps=total,
        )


class AdversaryRun:
    """A phase's adversary on one client (:class:`~fedshift.algorithms.task.Adversary`): its
    parameters, its optimiser's state (fresh per stage) and its steps on each mini-batch."""

    def __init__(
        self, algo: Algorithm, adv: Adversary, params: list[TensorDict], records: LossRecords
    ) -> None:
        self.adv, self.loss_fn, self.records = adv, getattr(algo, adv.loss), records
        names = [(m, k) for m in range(len(params)) for k in adv.trained_names(m, params[m])]
        self.flat = [params[m][k] for m, k in names]
        self.state: list = [None] * len(self.flat)
        self.count = 0

    @classmethod
    def of(
        cls, algo: Algorithm, phase: Phase, params: list[TensorDict], records: LossRecords
    ) -> AdversaryRun | None:
        return None if phase.adversary is None else cls(algo, phase.adversary, params, records)

    def train(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras,
        steps: int | None = None,
    ) -> None:
        """The adversary's steps on one mini-batch (``steps``, default its per-batch steps;
        BatchNorm statistics left untouched)."""
        for _ in range(self.adv.steps if steps is None else steps):
            scratch = [{k: v.clone() for k, v in b.items()} for b in buffers]
            loss, values = loss_and_values(self.loss_fn(params, scratch, batch, extras))
            self.records.add(values)
            grads = list(torch.autograd.grad(loss, self.flat, allow_unused=True))
            self.count += 1
            self.step(self.adv, self.flat, grads, self.state, self.count)

    @staticmethod
    def step(adv: Adversary, flat, grads, state: list, count: int) -> None:
        """One optimiser step of the adversary's parameters (``count``: steps so far, from 1)."""
        if adv.optimizer == "adam":
            adam_step(flat, grads, state, count, adv.lr, adv.betas, adv.eps)
        else:
            sgd_step(flat, grads, state, SGDConfig(lr=adv.lr))


class EpochStop:
    """A phase's early stopping for one client, checked after each pass over its data (an
    epoch, or ``Phase.pass_steps`` steps of a stage counted in steps):

    - ``Phase.stop_below``: from the second epoch, stop when the epoch's mean loss fell by less
      than the threshold (Flash);
    - ``Phase.stop_std_below``: stop when the standard deviation of the last ``stop_window``
      passes' losses (each pass's last step, as FedALA's code records them) is below the
      threshold, after at least ``stop_window + 1`` passes (FedALA's first weight learning).
    """

    def __init__(self, threshold: float, per_epoch: int, window: int | None = None) -> None:
        self.threshold, self.per_epoch, self.window = threshold, per_epoch, window
        self.steps, self.total, self.prev = 0, 0.0, None
        self.history: list[float] = []

    @classmethod
    def of(cls, phase: Phase, train: TrainConfig, steps: int) -> EpochStop | None:
        """The stopper of a client's stage of ``steps`` steps (None: the stage does not stop
        early, or runs a fixed number of steps without a pass length; ``train``: the run's
        settings, :attr:`RoundWork.train`)."""
        if steps == 0:
            return None
        if phase.stop_std_below is not None:
            epochs = train.local_epochs if phase.epochs is None else phase.epochs
            per = phase.pass_steps or max(1, steps // max(1, epochs))
            return cls(phase.stop_std_below, per, phase.stop_window)
        if phase.stop_below is None or phase.steps is not None:
            return None
        epochs = train.local_epochs if phase.epochs is None else phase.epochs
        if phase.epochs is None and train.local_steps is not None:
            return None
        return cls(phase.stop_below, max(1, steps // max(1, epochs)))

    def after(self, loss: float) -> bool:
        """Count one step's loss; True when the client stops after it."""
        self.steps += 1
        self.total += loss
        if self.steps % self.per_epoch:
            return False
        mean, self.total = self.total / self.per_epoch, 0.0
        if self.window is not None:
            self.history.append(loss)
            return (
                len(self.history) > self.window
                and window_std(self.history[-self.window :]) < self.threshold
            )
        stop = self.prev is not None and self.prev - mean < self.threshold
        self.prev = mean
        return stop


def window_std(values: list[float]) -> float:
    """The population standard deviation of ``values`` (numpy's ``std``)."""
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def sample_steps(phase: Phase, params: list[TensorDict], batches: list[torch.Tensor]) -> int:
    """The samples of a stage's ``batches``, each counted once per model the stage trains (the
    work a plain training loop of the same arithmetic would do)."""
    models = sum(1 for m in range(len(params)) if phase.trained_names(m, params[m]))
    return models * sum(len(b) for b in batches)


def training_data(task: LocalTask, data: ClientData) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool indices and labels a task trains on: its own, or the client's train split."""
    if task.train_idx is not None:
        return task.train_idx, task.y_train
    return data.train_idx, data.y_train


def start_momentum(task: LocalTask) -> list[TensorDict] | None:
    """Copies of the client's stored momentum buffers per model (None: momentum is reset)."""
    if task.momentum is None:
        return None
    if len(task.momentum) != len(task.params):  # the number of models changed: start fresh
        return [{} for _ in task.params]
    return [{k: v.detach().clone() for k, v in m.items()} for m in task.momentum]


def store_momentum(
    momentum: list[TensorDict], names: list[tuple[int, str]], bufs: list[torch.Tensor | None]
) -> None:
    """Write a stage's buffers (of the parameters ``names`` it trained) back into ``momentum``."""
    for (m, k), b in zip(names, bufs, strict=True):
        if b is not None:
            momentum[m][k] = b.detach()


def phase_plans(
    task: LocalTask, n: int, train: TrainConfig, gen: torch.Generator
) -> list[list[torch.Tensor]]:
    """Mini-batch positions of every step of every training stage of a task, drawn in order
    from the client's generator (no steps when the task does not train). A phase's ``steps``,
    ``epochs``, ``batch_size`` and ``drop_last`` override the run's (``train``); the task's own
    ``epochs`` (the engine's draw of unequal local work) replaces the run's epochs and steps."""
    plans = []
    epochs, local_steps = train.local_epochs, train.local_steps
    if task.epochs is not None:
        epochs, local_steps = task.epochs, None
    for phase in task.phases:
        bs = train.batch_size if phase.batch_size is None else phase.batch_size
        drop = train.drop_last if phase.drop_last is None else phase.drop_last
        if phase.steps is not None:
            steps = phase.steps if n else 0
        elif phase.epochs is not None:
            steps = num_local_steps(n, bs, phase.epochs, drop) if phase.epochs else 0
        else:
            steps = num_local_steps(n, bs, epochs, drop, local_steps)
        plans.append(batch_schedule(n, bs, steps if task.train else 0, drop, gen))
    return plans


def augment_plans(
    plans: list[list[torch.Tensor]], train: TrainConfig, gen: torch.Generator
) -> list[list[torch.Tensor]] | None:
    """Per step of every stage, the augmentation parameters of its samples (``[len(batch),
    3]``, see :func:`~fedshift.data.augment.draw_crop_flip`), drawn from the client's
    generator after the batch order; None without augmentation (``train.augment``)."""
    if train.augment == "none":
        return None
    return [[draw_crop_flip(len(b), train.crop_padding, gen) for b in plan] for plan in plans]
