"""One training stage (:class:`~fedshift.algorithms.task.Phase`) of a chunk of clients whose
parameters are stacked along a leading client dimension (see :mod:`fedshift.engine.batched`).

:func:`run_stage` builds the stage's schedule tensors once (positions, masks and activity
``[S, C, B]``, moved to the device in one transfer), then runs ``S`` steps of one of two paths
with the same arithmetic:

- :class:`VmapStage` — each step is one ``vmap(grad_and_value(loss))`` over the clients and one
  stacked SGD update; a finished client computes on its last batch with its update masked and
  its buffers restored;
- :class:`LoopStage` — (the CPU default: per-client kernels beat grouped ones there) each step
  takes every client still training through ``grad_and_value(loss)`` on its real batch and the
  shared :func:`~fedshift.engine.training.sgd_step` on its slice of the stacked tensors.

A phase's adversary (:class:`StackedAdversary`) takes its steps on each mini-batch first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import grad_and_value, vmap

from fedshift.algorithms.base import Adversary, Algorithm, Batch, Phase, TensorDict
from fedshift.data.augment import CropFlip
from fedshift.engine.executors import AdversaryRun, EpochStop, store_momentum
from fedshift.engine.training import SGDConfig, adam_moments, clip_coefficient, sgd_step


@dataclass
class Chunk:
    """A chunk's stacked training state, which its stages read and update in place."""

    params: list[dict[str, torch.Tensor]]  # per model: name -> [C, ...]
    buffers: list[dict[str, torch.Tensor]]
    idx_pad: torch.Tensor  # [C, n_max] pool indices of each client's training data (padded)
    y_pad: torch.Tensor
    inputs: Callable[..., torch.Tensor]
    extras: Any  # stacked extras and their vmap in_dims
    extras_dims: Any
    loss_sum: torch.Tensor  # [C] sum of each client's step losses
    moms: list[list[TensorDict]] | None  # kept momentum buffers per client and model (or None)


@dataclass
class Schedule:
    """A stage's batches as tensors: positions and masks ``[S, C, B]``, activity ``[S, C]``
    and augmentation parameters ``[S, C, B, 3]`` (or None)."""

    pos: torch.Tensor
    mask: torch.Tensor
    active: torch.Tensor
    aug: torch.Tensor | None
    padding: int

    @classmethod
    def of(cls, plans, augs, device: torch.device) -> Schedule:
        """From each client's planned batches (``plans[c][s]``: positions) and augmentation
        parameters (``augs``: (per client and step, crop padding) or None)."""
        C, S = len(plans), max(len(p) for p in plans)
        B = max((len(b) for p in plans for b in p), default=1)
        pos = torch.zeros(S, C, B, dtype=torch.long)
        mask = torch.zeros(S, C, B)
        active = torch.zeros(S, C)
        aug = None if augs is None else torch.zeros(S, C, B, 3, dtype=torch.long)
        for c, plan in enumerate(plans):
            for s in range(S):
                last = min(s, len(plan) - 1)
                b = plan[last] if plan else torch.zeros(0, dtype=torch.long)
                pos[s, c, : len(b)] = b
                mask[s, c, : len(b)] = 1.0
                active[s, c] = float(s < len(plan))
                if aug is not None and plan:
                    aug[s, c, : len(b)] = augs[0][c][last]
        return cls(
            pos.to(device),
            mask.to(device),
            active.to(device),
            None if aug is None else aug.to(device),
            0 if augs is None else augs[1],
        )


def run_stage(
    algo: Algorithm,
    phase: Phase,
    plans: list[list[torch.Tensor]],
    augs: tuple[list[list[torch.Tensor]], int] | None,
    chunk: Chunk,
    sgd: SGDConfig,
    use_vmap: bool,
    stops: list[EpochStop | None],
) -> list[int]:
    """Train ``phase`` on the chunk (updating its stacked state in place); the steps each
    client ran (fewer than planned when it stopped early, ``stops``)."""
    stage = (VmapStage if use_vmap else LoopStage)(algo, phase, plans, chunk, sgd, stops)
    if not stage.num_steps:
        return stage.ran
    sched = Schedule.of(plans, augs, chunk.idx_pad.device)
    extras = (chunk.extras, chunk.extras_dims)
    adversary = (
        None
        if phase.adversary is None
        else StackedAdversary(algo, phase.adversary, chunk.params, extras, use_vmap)
    )
    for s in range(stage.num_steps):
        x, y, ps, mk, act = stage.batch(s, sched)
        if adversary is not None:
            live = [c for c in range(len(plans)) if s < stage.ran[c]]
            lens = [len(p[s]) if s < len(p) else 0 for p in plans]
            adversary.train(chunk.buffers, (x, y, ps, mk), act, live, lens, s)
        stage.step(s, x, y, ps, mk, act, sched)
    stage.finish()
    return stage.ran


class _Stage:
    """What both paths share: the trained/frozen split of the stacked parameters, the loss of
    one client, each client's momentum start and the batch of a step."""

    def __init__(self, algo, phase, plans, chunk: Chunk, sgd: SGDConfig, stops) -> None:
        self.chunk, self.sgd, self.stops, self.plans = chunk, sgd, stops, plans
        self.ran = [len(p) for p in plans]
        self.num_steps = max(len(p) for p in plans)
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
        moms = chunk.moms
        # each client's start buffer of each trained parameter (None: fresh)
        self.mom = [
            [None if moms is None else moms[c][m].get(k) for m, k in self.flat_names]
            for c in range(len(plans))
        ]
        loss_fn = getattr(algo, phase.loss)
        self.at = [0]  # the step being run (a Python int, read when the loss is traced)

        def client_loss(tp, fp, b, x, y, ps, mk, e):
            p = [{**f, **t} for t, f in zip(tp, fp, strict=True)]
            return loss_fn(p, b, Batch(x=x, y=y, pos=ps, mask=mk, step=self.at[0]), e)

        self.client_loss = client_loss

    def batch(self, s: int, sched: Schedule):
        """The chunk's stacked mini-batch of step ``s``: (x, y, positions, mask, activity)."""
        self.at[0] = s
        ch = self.chunk
        ps, mk, act = sched.pos[s], sched.mask[s], sched.active[s]
        gidx = ch.idx_pad.gather(1, ps).reshape(-1)
        if sched.aug is None:
            x = ch.inputs(gidx)
        else:
            x = ch.inputs(gidx, CropFlip(sched.aug[s].reshape(-1, 3), sched.padding))
        C, B = ps.shape
        return x.view(C, B, *x.shape[1:]), ch.y_pad.gather(1, ps), ps, mk, act

    def _stopped(self, c: int, s: int, loss: torch.Tensor) -> bool:
        """Count a step's loss for client ``c``'s early stopping; True when it stops now (the
        loss is read only by a client that can stop early: no device sync otherwise)."""
        stop = self.stops[c]
        if stop is not None and s < self.ran[c] and stop.after(float(loss.detach())):
            self.ran[c] = s + 1
            return True
        return False


class VmapStage(_Stage):
    """Every step: one vmapped gradient of all clients and one stacked SGD update."""

    def __init__(self, algo, phase, plans, chunk: Chunk, sgd: SGDConfig, stops) -> None:
        super().__init__(algo, phase, plans, chunk, sgd, stops)
        self.step_fn = vmap(
            grad_and_value(self.client_loss),
            in_dims=(0, 0, 0, 0, 0, 0, 0, chunk.extras_dims),
            randomness="different",
        )
        self.momentum: list[torch.Tensor | None] = [None] * len(self.flat_p)
        if chunk.moms is not None and sgd.momentum:  # stored buffers, zero where none yet
            self.momentum = [
                torch.stack([torch.zeros_like(p[c]) if t is None else t for c, t in enumerate(col)])
                for p, col in zip(self.flat_p, zip(*self.mom, strict=True), strict=True)
            ]

    def step(self, s, x, y, ps, mk, act, sched: Schedule) -> None:
        ch = self.chunk
        old_b = [t.clone() for t in self.flat_b]
        grads, loss = self.step_fn(self.train_p, self.frozen_p, ch.buffers, x, y, ps, mk, ch.extras)
        grads = [t for d in grads for t in d.values()]
        _stacked_sgd(self.flat_p, grads, self.momentum, act, self.sgd)
        for t, o in zip(self.flat_b, old_b, strict=True):  # finished clients keep buffers
            t.copy_(torch.where(act.view(-1, *[1] * (t.ndim - 1)) > 0, t, o))
        ch.loss_sum += loss.detach() * act
        for c in range(len(self.plans)):  # early stopping: mask the remaining steps
            if self._stopped(c, s, loss[c]):
                sched.active[s + 1 :, c] = 0.0

    def finish(self) -> None:
        if self.chunk.moms is None:
            return
        for c in range(len(self.plans)):
            self.mom[c] = [None if t is None else t[c].clone() for t in self.momentum]
            store_momentum(self.chunk.moms[c], self.flat_names, self.mom[c])


class LoopStage(_Stage):
    """Every step: each client still training, on its real batch, and its own SGD update of
    its slice of the stacked tensors."""

    def __init__(self, algo, phase, plans, chunk: Chunk, sgd: SGDConfig, stops) -> None:
        super().__init__(algo, phase, plans, chunk, sgd, stops)
        self.grad_fn = grad_and_value(self.client_loss)

    def step(self, s, x, y, ps, mk, act, sched: Schedule) -> None:
        ch = self.chunk
        for c, plan in enumerate(self.plans):
            if s >= self.ran[c]:
                continue  # this client has finished (or stopped) this stage's steps
            n = len(plan[s])
            g, v = self.grad_fn(
                [{k: t[c] for k, t in d.items()} for d in self.train_p],
                [{k: t[c] for k, t in d.items()} for d in self.frozen_p],
                [{k: t[c] for k, t in d.items()} for d in ch.buffers],
                x[c, :n],
                y[c, :n],
                ps[c, :n],
                None,
                _select(ch.extras, ch.extras_dims, c),
            )
            grads = [t for d in g for t in d.values()]
            sgd_step([t[c] for t in self.flat_p], grads, self.mom[c], self.sgd)
            ch.loss_sum[c] += v.detach()
            self._stopped(c, s, v)

    def finish(self) -> None:
        if self.chunk.moms is None:
            return
        for c in range(len(self.plans)):
            store_momentum(self.chunk.moms[c], self.flat_names, self.mom[c])


class StackedAdversary:
    """A phase's adversary on a chunk: its stacked parameters, optimiser state per client and
    its steps on each mini-batch (see :class:`~fedshift.engine.executors.AdversaryRun`, the
    same arithmetic on one client)."""

    def __init__(
        self,
        algo: Algorithm,
        adv: Adversary,
        params: list[dict[str, torch.Tensor]],
        extras: tuple[Any, Any],
        use_vmap: bool,
    ) -> None:
        names = [adv.trained_names(m, params[m]) for m in range(len(params))]
        self.own = [{k: params[m][k] for k in names[m]} for m in range(len(params))]
        self.rest = [
            {k: v for k, v in params[m].items() if k not in names[m]} for m in range(len(params))
        ]
        self.flat = [t for d in self.own for t in d.values()]
        self.adv, self.extras, self.use_vmap = adv, extras, use_vmap
        loss_fn = getattr(algo, adv.loss)
        self.at = [0]  # the local step (read when the loss is traced)

        def client_loss(own, rest, b, x, y, ps, mk, e):
            p = [{**r, **o} for o, r in zip(own, rest, strict=True)]
            return loss_fn(p, b, Batch(x=x, y=y, pos=ps, mask=mk, step=self.at[0]), e)

        if use_vmap:
            self.fn = vmap(
                grad_and_value(client_loss),
                in_dims=(0, 0, 0, 0, 0, 0, 0, extras[1]),
                randomness="different",
            )
            self.moments: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.flat)
        else:
            self.fn = grad_and_value(client_loss)
            C = self.flat[0].shape[0] if self.flat else 0
            self.states = [[None] * len(self.flat) for _ in range(C)]
        # every client still training has taken the same number of steps (they all start
        # together and a finished one never resumes), so one count serves the chunk
        self.count = 0

    def train(self, buffers, batch, act: torch.Tensor, live: list[int], lens: list[int], s: int):
        """The adversary's steps on mini-batch ``s`` (``batch``: stacked x, y, positions, mask;
        ``act``/``live``: the clients still training; ``lens``: each client's batch length)."""
        self.at[0] = s
        x, y, ps, mk = batch
        ex, ex_dims = self.extras
        for _ in range(self.adv.steps):
            scratch = [{k: t.clone() for k, t in d.items()} for d in buffers]
            self.count += 1
            if self.use_vmap:
                grads, _ = self.fn(self.own, self.rest, scratch, x, y, ps, mk, ex)
                self._stacked_step([t for d in grads for t in d.values()], act)
                continue
            for c in live:
                n = lens[c]
                g, _ = self.fn(
                    [{k: t[c] for k, t in d.items()} for d in self.own],
                    [{k: t[c] for k, t in d.items()} for d in self.rest],
                    [{k: t[c] for k, t in d.items()} for d in scratch],
                    x[c, :n],
                    y[c, :n],
                    ps[c, :n],
                    None,
                    _select(ex, ex_dims, c),
                )
                flat_c = [t[c] for t in self.flat]
                grads_c = [t for d in g for t in d.values()]
                AdversaryRun.step(self.adv, flat_c, grads_c, self.states[c], self.count)

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


def _select(tree: Any, dims: Any, c: int) -> Any:
    """Client ``c``'s slice of a stacked pytree (``dims`` None marks shared leaves)."""
    if dims is None:
        return tree
    if isinstance(tree, dict):
        return {k: _select(tree[k], dims[k], c) for k in tree}
    if isinstance(tree, list | tuple):
        return [_select(t, d, c) for t, d in zip(tree, dims, strict=True)]
    return tree[c]


@torch.no_grad()
def _stacked_sgd(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum: list[torch.Tensor | None],
    active: torch.Tensor,
    cfg: SGDConfig,
) -> None:
    """:func:`sgd_step` on client-stacked tensors; clients with ``active`` 0 are left as is."""
    if cfg.grad_clip is not None and grads:
        sq = sum(g.pow(2).reshape(g.shape[0], -1).sum(1) for g in grads)  # [C] tensors too
        coef = clip_coefficient(sq, cfg.grad_clip)
        grads = [g * coef.view(-1, *[1] * (g.ndim - 1)) for g in grads]
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
