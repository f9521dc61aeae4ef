"""One training stage (:class:`~fedshift.algorithms.task.Phase`) of a chunk of clients whose
parameters are stacked along a leading client dimension (see :mod:`fedshift.engine.executors.batched`).

:func:`run_stage` builds the stage's schedule tensors once (positions, masks and activity
``[S, C, B]``, moved to the device in one transfer), then runs ``S`` steps of
:class:`VmapStage`: each step is one ``vmap(grad_and_value(loss))`` over the clients and one
stacked SGD update (in place on all tensors at once where every client trains); a finished
client computes on its last batch with its update masked and its buffers restored. (A chunk
that is not vectorized, a CNN on a CPU, is trained client by client by the sequential
executor's own code instead: :func:`fedshift.engine.executors.batched.vectorizes`.)

A phase's adversary (:class:`StackedAdversary`) takes its warm-up steps at the start of the
stage (each client's batch ``w mod S``, :meth:`VmapStage.batch_at`), then its steps on each
mini-batch first. The values the losses record (``has_aux``) are summed per client over its
active steps in :attr:`Chunk.records`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.func import grad_and_value, vmap

from fedshift.algorithms.base import (
    Adversary,
    Algorithm,
    Batch,
    Phase,
    TensorDict,
    loss_and_values,
)
from fedshift.data.augment import CropFlip
from fedshift.engine.executors.base import EpochStop, store_momentum
from fedshift.engine.training import LossRecords, SGDConfig, adam_moments, clip_coefficient


@dataclass
class Chunk:
    """A chunk's stacked training state, which its stages read and update in place."""

    params: list[dict[str, torch.Tensor]]  # per model: name -> [C, ...]
    buffers: list[dict[str, torch.Tensor]]
    idx_pad: torch.Tensor  # [C, n_max] pool indices of each client's training data (padded)
    y_pad: torch.Tensor
    inputs: Callable[..., torch.Tensor] | RowInputs  # one pool, or one per row range
    extras: Any  # stacked extras and their vmap in_dims
    extras_dims: Any
    loss_sum: torch.Tensor  # [C] sum of each client's step losses
    moms: list[list[TensorDict]] | None  # kept momentum buffers per client and model (or None)
    records: LossRecords = field(default_factory=LossRecords)  # what the losses recorded, [C]


@dataclass(frozen=True)
class RowInputs:
    """The inputs of a chunk whose rows read different pools (the runs of a grid trained as
    one job, :mod:`fedshift.engine.lockstep`): ``parts`` are (first row, end row, the pool's
    inputs), in row order. Each range gathers from its own pool, the same copies as alone."""

    parts: tuple[tuple[int, int, Callable[..., torch.Tensor]], ...]

    def __call__(self, gidx: torch.Tensor, B: int, crop: CropFlip | None = None) -> torch.Tensor:
        out = []
        for a, b, fn in self.parts:
            rows = gidx[a * B : b * B]
            if crop is None:
                out.append(fn(rows))
            else:
                out.append(fn(rows, CropFlip(crop.params[a * B : b * B], crop.padding)))
        return torch.cat(out)


#: SGD settings per row range of a chunk: (first row, end row, settings), in row order
RowSGD = tuple[tuple[int, int, SGDConfig], ...]


def row_ranges(values: list) -> list:
    """(first row, end row, value) of each run of equal neighbouring ``values``."""
    out: list = []
    for i, v in enumerate(values):
        if out and out[-1][2] == v:
            out[-1] = (out[-1][0], i + 1, v)
        else:
            out.append((i, i + 1, v))
    return out


def as_rows(sgd: SGDConfig | RowSGD, rows: int) -> RowSGD:
    """Per-row-range settings: one config for every row, or already per range."""
    return ((0, rows, sgd),) if isinstance(sgd, SGDConfig) else tuple(sgd)


@dataclass
class Schedule:
    """A stage's batches as tensors: positions and masks ``[S, C, B]``, activity ``[S, C]``
    and augmentation parameters ``[S, C, B, 3]`` (or None); ``full[s]``: whether every client
    trains at step ``s`` (a host-side copy of ``active``, read without a device sync)."""

    pos: torch.Tensor
    mask: torch.Tensor
    active: torch.Tensor
    aug: torch.Tensor | None
    padding: int
    full: list[bool]

    @classmethod
    def of(cls, plans, augs, device: torch.device) -> Schedule:
        """From each client's planned batches (``plans[c][s]``: positions) and augmentation
        parameters (``augs``: (per client and step, crop padding) or None). A finished client
        repeats its last batch (masked out by ``active``)."""
        C, S = len(plans), max(len(p) for p in plans)
        B = max((len(b) for p in plans for b in p), default=1)
        pos = torch.zeros(S, C, B, dtype=torch.long)
        mask = torch.zeros(S, C, B)
        active = torch.zeros(S, C)
        aug = None if augs is None else torch.zeros(S, C, B, 3, dtype=torch.long)
        for c, plan in enumerate(plans):
            if not plan:
                continue
            n = len(plan)
            active[:n, c] = 1.0
            if all(len(b) == B for b in plan):  # full batches: the whole plan in one copy
                pos[:n, c] = torch.stack(plan)
                mask[:, c] = 1.0
                if aug is not None:
                    aug[:n, c] = torch.stack(augs[0][c])
            else:
                for s, b in enumerate(plan):
                    pos[s, c, : len(b)] = b
                    mask[s, c, : len(b)] = 1.0
                    if aug is not None:
                        aug[s, c, : len(b)] = augs[0][c][s]
            if n < S:  # the last batch again
                pos[n:, c] = pos[n - 1, c]
                mask[n:, c] = mask[n - 1, c]
                if aug is not None:
                    aug[n:, c] = aug[n - 1, c]
        return cls(
            pos.to(device),
            mask.to(device),
            active.to(device),
            None if aug is None else aug.to(device),
            0 if augs is None else augs[1],
            [bool(a) for a in active.min(dim=1).values.gt(0)],
        )


def run_stage(
    algo: Algorithm,
    phase: Phase,
    plans: list[list[torch.Tensor]],
    augs: tuple[list[list[torch.Tensor]], int] | None,
    chunk: Chunk,
    sgd: SGDConfig | RowSGD,
    stops: list[EpochStop | None],
) -> list[int]:
    """Train ``phase`` on the chunk (updating its stacked state in place); the steps each
    client ran (fewer than planned when it stopped early, ``stops``)."""
    stage = VmapStage(algo, phase, plans, chunk, sgd, stops)
    if not stage.num_steps:
        return stage.ran
    sched = Schedule.of(plans, augs, chunk.idx_pad.device)
    extras = (chunk.extras, chunk.extras_dims)
    adversary = (
        None
        if phase.adversary is None
        else StackedAdversary(algo, phase.adversary, chunk.params, extras, chunk.records)
    )
    if adversary is not None:  # warm-up: the adversary alone, each client's batch w mod S
        n = torch.tensor([len(p) for p in plans], device=sched.active.device)
        for w in range(adversary.adv.warmup_steps):
            x, y, ps, mk = stage.batch_at(w % n.clamp_min(1), sched)
            adversary.train(chunk.buffers, (x, y, ps, mk), (n > 0).to(mk.dtype), 0, False, 1)
    for s in range(stage.num_steps):
        x, y, ps, mk, act = stage.batch(s, sched)
        if adversary is not None:
            adversary.train(chunk.buffers, (x, y, ps, mk), act, s, sched.full[s])
        stage.step(s, x, y, ps, mk, act, sched)
    stage.finish()
    return stage.ran


def _client_loss(loss_fn: Callable, at: list[int]) -> Callable:
    """A client's loss over its (trained, frozen) parameters, for ``vmap``: the algorithm's
    loss on the batch of step ``at[0]`` (read when the loss is traced), with the values it
    records as the auxiliary output (``has_aux``)."""

    def client_loss(tp, fp, b, x, y, ps, mk, e):
        p = [{**f, **t} for t, f in zip(tp, fp, strict=True)]
        batch = Batch(x=x, y=y, pos=ps, mask=mk, step=at[0])
        return loss_and_values(loss_fn(p, b, batch, e))

    return client_loss


class VmapStage:
    """A stage of a chunk: the trained/frozen split of the stacked parameters, each client's
    momentum start, and every step one vmapped gradient of all clients and one stacked SGD
    update."""

    def __init__(self, algo, phase, plans, chunk: Chunk, sgd: SGDConfig | RowSGD, stops) -> None:
        self.sgd = as_rows(sgd, len(plans))  # a grid's runs: their own settings per row range
        self.chunk, self.stops, self.plans = chunk, stops, plans
        self.ran = [len(p) for p in plans]
        self.num_steps = max(len(p) for p in plans)
        self.can_stop = any(st is not None for st in stops)
        params = chunk.params
        names = [phase.trained_names(m, params[m]) for m in range(len(params))]
        self.train_p = [{k: params[m][k] for k in names[m]} for m in range(len(params))]
        self.frozen_p = [
            {k: v for k, v in params[m].items() if k not in self.train_p[m]}
            for m in range(len(params))
        ]
        self.flat_names = [(m, k) for m in range(len(params)) for k in names[m]]
        self.flat_p = [t for d in self.train_p for t in d.values()]
        self.flat_b = [t for d in chunk.buffers for t in d.values()]
        self.at = [0]  # the step being run (a Python int, read when the loss is traced)
        self.step_fn = vmap(
            grad_and_value(_client_loss(getattr(algo, phase.loss), self.at), has_aux=True),
            in_dims=(0, 0, 0, 0, 0, 0, 0, chunk.extras_dims),
            randomness="different",
        )
        self.momentum: list[torch.Tensor | None] = [None] * len(self.flat_p)
        if chunk.moms is not None and self.sgd[0][2].momentum:  # stored, zero where none yet
            cols = [
                [chunk.moms[c][m].get(k) for c in range(len(plans))] for m, k in self.flat_names
            ]
            self.momentum = [
                torch.stack([torch.zeros_like(p[c]) if t is None else t for c, t in enumerate(col)])
                for p, col in zip(self.flat_p, cols, strict=True)
            ]

    def batch(self, s: int, sched: Schedule):
        """The chunk's stacked mini-batch of step ``s``: (x, y, positions, mask, activity)."""
        self.at[0] = s
        aug = None if sched.aug is None else sched.aug[s]
        x, y = self._inputs(sched.pos[s], aug, sched.padding)
        return x, y, sched.pos[s], sched.mask[s], sched.active[s]

    def batch_at(self, steps: torch.Tensor, sched: Schedule):
        """A warm-up mini-batch: each client's batch of its step ``steps[c]`` (x, y, positions,
        mask), with ``Batch.step`` 0."""
        self.at[0] = 0
        cs = torch.arange(len(steps), device=steps.device)
        ps, mk = sched.pos[steps, cs], sched.mask[steps, cs]
        x, y = self._inputs(ps, None if sched.aug is None else sched.aug[steps, cs], sched.padding)
        return x, y, ps, mk

    def _inputs(self, ps: torch.Tensor, aug: torch.Tensor | None, padding: int):
        """The stacked inputs and labels ``[C, B, ...]`` of positions ``ps`` ``[C, B]``."""
        ch = self.chunk
        C, B = ps.shape
        gidx = ch.idx_pad.gather(1, ps).reshape(-1)
        crop = None if aug is None else CropFlip(aug.reshape(-1, 3), padding)
        if isinstance(ch.inputs, RowInputs):
            x = ch.inputs(gidx, B, crop)
        else:
            x = ch.inputs(gidx) if crop is None else ch.inputs(gidx, crop)
        return x.view(C, B, *x.shape[1:]), ch.y_pad.gather(1, ps)

    def _stopped(self, c: int, s: int, loss: torch.Tensor) -> bool:
        """Count a step's loss for client ``c``'s early stopping; True when it stops now (the
        loss is read only by a client that can stop early: no device sync otherwise)."""
        stop = self.stops[c]
        if stop is not None and s < self.ran[c] and stop.after(float(loss.detach())):
            self.ran[c] = s + 1
            return True
        return False

    def step(self, s, x, y, ps, mk, act, sched: Schedule) -> None:
        ch = self.chunk
        full = sched.full[s]
        old_b = None if full else [t.clone() for t in self.flat_b]
        grads, (loss, values) = self.step_fn(
            self.train_p, self.frozen_p, ch.buffers, x, y, ps, mk, ch.extras
        )
        ch.records.add(values, act)
        grads = [t for d in grads for t in d.values()]
        if full:
            _stacked_sgd_all(self.flat_p, grads, self.momentum, self.sgd)
            ch.loss_sum += loss.detach()
        else:
            _stacked_sgd(self.flat_p, grads, self.momentum, act, self.sgd)
            for t, o in zip(self.flat_b, old_b, strict=True):  # finished clients keep buffers
                t.copy_(torch.where(act.view(-1, *[1] * (t.ndim - 1)) > 0, t, o))
            ch.loss_sum += loss.detach() * act
        if self.can_stop:
            for c in range(len(self.plans)):  # early stopping: mask the remaining steps
                if self._stopped(c, s, loss[c]):
                    sched.active[s + 1 :, c] = 0.0
                    sched.full[s + 1 :] = [False] * (len(sched.full) - s - 1)

    def finish(self) -> None:
        """Each client's momentum buffers back into its kept momentum (views of the stacked
        buffers: the engine's store copies what it keeps)."""
        if self.chunk.moms is None:
            return
        for c in range(len(self.plans)):
            bufs = [None if t is None else t[c] for t in self.momentum]
            store_momentum(self.chunk.moms[c], self.flat_names, bufs)


class StackedAdversary:
    """A phase's adversary on a chunk: its stacked parameters, optimiser state per client and
    its steps on each mini-batch (see :class:`~fedshift.engine.executors.base.AdversaryRun`, the
    same arithmetic on one client)."""

    def __init__(
        self,
        algo: Algorithm,
        adv: Adversary,
        params: list[dict[str, torch.Tensor]],
        extras: tuple[Any, Any],
        records: LossRecords,
    ) -> None:
        names = [adv.trained_names(m, params[m]) for m in range(len(params))]
        self.own = [{k: params[m][k] for k in names[m]} for m in range(len(params))]
        self.rest = [
            {k: v for k, v in params[m].items() if k not in names[m]} for m in range(len(params))
        ]
        self.flat = [t for d in self.own for t in d.values()]
        self.adv, self.extras, self.records = adv, extras, records
        self.at = [0]  # the local step (read when the loss is traced)
        self.fn = vmap(
            grad_and_value(_client_loss(getattr(algo, adv.loss), self.at), has_aux=True),
            in_dims=(0, 0, 0, 0, 0, 0, 0, extras[1]),
            randomness="different",
        )
        self.moments: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.flat)
        # every client still training has taken the same number of steps (they all start
        # together and a finished one never resumes), so one count serves the chunk
        self.count = 0

    def train(
        self, buffers, batch, act: torch.Tensor, s: int, full: bool, steps: int | None = None
    ) -> None:
        """The adversary's steps on mini-batch ``s`` (``batch``: stacked x, y, positions, mask;
        ``act``: the clients still training, ``full``: all of them; ``steps``: default its
        per-batch steps)."""
        self.at[0] = s
        x, y, ps, mk = batch
        ex = self.extras[0]
        for _ in range(self.adv.steps if steps is None else steps):
            scratch = [{k: t.clone() for k, t in d.items()} for d in buffers]
            self.count += 1
            grads, (_, values) = self.fn(self.own, self.rest, scratch, x, y, ps, mk, ex)
            self.records.add(values, act)
            self._stacked_step([t for d in grads for t in d.values()], act)

    @torch.no_grad()
    def _stacked_step(self, grads: list[torch.Tensor], act: torch.Tensor) -> None:
        adv = self.adv
        if adv.optimizer == "sgd":
            _stacked_sgd(self.flat, grads, [None] * len(grads), act, SGDConfig(lr=adv.lr))
            return
        for i, (p, g) in enumerate(zip(self.flat, grads, strict=True)):
            shape = (-1, *[1] * (p.ndim - 1))
            m, v = self.moments[i] or (torch.zeros_like(p), torch.zeros_like(p))
            m2, v2, d = adam_moments(g, m, v, self.count, adv.lr, adv.betas, adv.eps)
            a = act.view(shape) > 0
            self.moments[i] = (torch.where(a, m2, m), torch.where(a, v2, v))
            p.copy_(torch.where(a, p + d, p))


def _clipped(grads: list[torch.Tensor], cfg: SGDConfig) -> list[torch.Tensor]:
    """Client-stacked gradients clipped to each client's global norm ``cfg.grad_clip`` (the
    clipping of :func:`~fedshift.engine.training.sgd_step`, per client); as they are without."""
    if cfg.grad_clip is None or not grads:
        return grads
    sq = sum(g.pow(2).reshape(g.shape[0], -1).sum(1) for g in grads)  # [C]
    coef = clip_coefficient(sq, cfg.grad_clip)
    return [g * coef.view(-1, *[1] * (g.ndim - 1)) for g in grads]


@torch.no_grad()
def _stacked_sgd(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum: list[torch.Tensor | None],
    active: torch.Tensor,
    sgd: SGDConfig | RowSGD,
) -> None:
    """:func:`sgd_step` on client-stacked tensors; clients with ``active`` 0 are left as is."""
    _by_rows(_sgd_masked, params, grads, momentum, sgd, active)


@torch.no_grad()
def _stacked_sgd_all(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum: list[torch.Tensor | None],
    sgd: SGDConfig | RowSGD,
) -> None:
    """:func:`_stacked_sgd` at a step where every client trains (see :func:`_sgd_full`)."""
    _by_rows(_sgd_full, params, grads, momentum, sgd)


def _by_rows(update: Callable, params, grads, momentum, sgd: SGDConfig | RowSGD, *rest) -> None:
    """``update`` with each row range's own settings, on views of its rows (one range: on the
    whole tensors, as a run alone). The element-wise updates of a range's rows are those of
    the same rows alone: the same operations on a view of the same length. Momentum buffers
    a range creates are put together after (every range of a grid has momentum or none)."""
    rows = as_rows(sgd, params[0].shape[0] if params else 0)
    if len(rows) == 1:
        update(params, grads, momentum, *rest, rows[0][2])
        return
    parts = []
    for a, b, cfg in rows:
        sub = [None if m is None else m.narrow(0, a, b - a) for m in momentum]
        cut = [t.narrow(0, a, b - a) for t in params], [t.narrow(0, a, b - a) for t in grads]
        update(*cut, sub, *(t[a:b] for t in rest), cfg)
        parts.append(sub)
    for i, m in enumerate(momentum):
        if m is None and parts[0][i] is not None:
            momentum[i] = torch.cat([sub[i] for sub in parts])


def _sgd_masked(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum: list[torch.Tensor | None],
    active: torch.Tensor,
    cfg: SGDConfig,
) -> None:
    """:func:`_stacked_sgd` with one config."""
    grads = _clipped(grads, cfg)
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        a = active.view(-1, *[1] * (p.ndim - 1))
        d = g.add(p, alpha=cfg.weight_decay) if cfg.weight_decay else g
        if cfg.momentum:
            buf = momentum[i]
            if buf is None:
                buf = momentum[i] = d.clone()
            else:
                buf.copy_(torch.where(a > 0, buf * cfg.momentum + d, buf))
            d = buf
        p.sub_(d * a, alpha=cfg.lr)


def _sgd_full(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum: list[torch.Tensor | None],
    cfg: SGDConfig,
) -> None:
    """:func:`_stacked_sgd` at a step where every client trains, in place and on all tensors
    at once (``torch._foreach_*``: the same per-element operations, a few calls instead of a
    few per tensor): ``grads`` (fresh tensors of this step) take the weight decay and become
    the first momentum buffers. Each value is computed by the same operations in the same
    order (``buf * m + d`` as ``buf.mul_(m).add_(d)``; ``d * 1`` is ``d``), so the numbers are
    those of the masked update, without its temporaries."""
    if not params:
        return
    grads = _clipped(grads, cfg)
    if cfg.weight_decay:
        torch._foreach_add_(grads, params, alpha=cfg.weight_decay)
    steps = grads
    if cfg.momentum:
        fresh = [i for i, b in enumerate(momentum) if b is None]
        for i in fresh:
            momentum[i] = grads[i]
        kept = [i for i, b in enumerate(momentum) if i not in set(fresh)]
        if kept:
            bufs = [momentum[i] for i in kept]
            torch._foreach_mul_(bufs, cfg.momentum)
            torch._foreach_add_(bufs, [grads[i] for i in kept])
        steps = momentum  # type: ignore[assignment]
    torch._foreach_add_(params, steps, alpha=-cfg.lr)
