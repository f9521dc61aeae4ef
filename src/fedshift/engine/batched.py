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
Fashion-MNIST CNN), so with ``vectorize="auto"`` the gradients of a chunk's clients are computed
in a loop on the CPU (real batch lengths, finished clients skipped, the shared
:func:`~fedshift.engine.training.sgd_step` on each client's slice) and with ``vmap`` elsewhere.

A phase's adversary (a min-max stage's critic) takes its steps on each mini-batch before the
phase's step, stacked like the rest (:class:`StackedAdversary`: per-client Adam moments and
step counts, finished clients masked).

Momentum kept across rounds (``task.momentum``) and augmentation follow the sequential
executor (see :mod:`fedshift.engine.executors`): stored buffers are stacked per chunk (a
missing one is zero, the exact equivalent of torch's first step) and the augmentation
parameters are drawn per client from its own generator, then applied to the chunk's batch.

Memory is bounded by the chunk: peak use grows with ``chunk_size`` x batch size, not with the
number of clients.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import grad_and_value, vmap

from fedshift.algorithms.base import (
    Adversary,
    Algorithm,
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Params,
    Phase,
)
from fedshift.data.augment import CropFlip
from fedshift.engine.executors import (
    AdversaryRun,
    EpochStop,
    Job,
    LocalSchedule,
    augment_plans,
    phase_plans,
    start_momentum,
    store_momentum,
    task_generator,
    training_data,
)
from fedshift.engine.training import SGDConfig, adam_moments, clip_coefficient, sgd_step


def has_batchnorm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


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


class BatchedExecutor:
    """Trains chunks of clients at once with ``torch.func.vmap``; same numbers as sequential."""

    name = "batched"

    def __init__(self, chunk_size: int = 64, vectorize: str = "auto") -> None:
        if vectorize not in ("auto", "vmap", "loop"):
            raise ValueError(f"vectorize must be auto, vmap or loop, not {vectorize!r}")
        self.chunk_size = chunk_size
        self.vectorize = vectorize

    def train(
        self,
        algo: Algorithm,
        jobs: Sequence[Job],
        sgd: SGDConfig,
        sched: LocalSchedule,
        seed: int,
        rnd: int,
    ) -> Iterator[ClientResult]:
        """Train the jobs' clients chunk by chunk, yielding each chunk's results (streamed)."""
        if not algo.supports_batched:
            raise ValueError(f"{algo.name} does not support the batched executor")
        plans, augs = [], []
        for task, data in jobs:
            gen = task_generator(task, seed, rnd, data.cid)
            plans.append(phase_plans(task, len(training_data(task, data)[0]), sched, gen))
            augs.append(augment_plans(plans[-1], sched, gen))
        groups: dict[Any, list[int]] = defaultdict(list)
        bn = has_batchnorm(algo.ops.module)
        for i, (task, _) in enumerate(jobs):
            sizes = tuple(tuple(len(b) for b in phase) for phase in plans[i])
            groups[(task.phases, sizes if bn else 0)].append(i)
        for members in groups.values():
            for start in range(0, len(members), self.chunk_size):
                chunk = members[start : start + self.chunk_size]
                yield from self._train_chunk(
                    algo,
                    [jobs[i] for i in chunk],
                    [plans[i] for i in chunk],
                    None if augs[0] is None else ([augs[i] for i in chunk], sched.crop_padding),
                    sgd,
                    sched,
                )

    def _train_chunk(
        self,
        algo: Algorithm,
        jobs: list[tuple[LocalTask, ClientData]],
        plans: list[list[list[torch.Tensor]]],
        augs: tuple[list[list[list[torch.Tensor]]], int] | None,
        sgd: SGDConfig,
        sched: LocalSchedule,
    ) -> list[ClientResult]:
        """Train one chunk of clients that share their training stages (``plans[c][phase]``;
        ``augs``: the same structure of augmentation parameters, and the padding)."""
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
        moms = None if tasks[0].momentum is None else [start_momentum(t) for t in tasks]
        loss_sum = torch.zeros(len(jobs), device=dev)
        use_vmap = self.vectorize == "vmap" or (self.vectorize == "auto" and dev.type != "cpu")
        module = algo.ops.module
        module.train()
        steps = [0] * len(jobs)
        for i, phase in enumerate(tasks[0].phases):
            stops = [EpochStop.of(phase, sched, len(p[i])) for p in plans]
            ran = self._run_phase(
                algo,
                phase,
                [p[i] for p in plans],
                None if augs is None else ([a[i] for a in augs[0]], augs[1]),
                params,
                buffers,
                (idx_pad, y_pad, views[0].inputs),
                (extras, extras_dims),
                sgd.for_phase(phase),
                loss_sum,
                use_vmap,
                moms,
                stops,
            )
            steps = [a + b for a, b in zip(steps, ran, strict=True)]
        module.eval()
        losses = (loss_sum.cpu() / torch.tensor(steps).clamp_min(1)).tolist()
        out = []
        for c, v in enumerate(views):
            p = [{k: t[c].clone() for k, t in params[m].items()} for m in range(K)]
            b = [{k: t[c].clone() for k, t in buffers[m].items()} for m in range(K)]
            out.append(
                ClientResult(
                    cid=v.cid,
                    num_samples=len(splits[c][0]),
                    params=p,
                    buffers=b,
                    upload=algo.upload(tasks[c], p, b, v),
                    telemetry={
                        "train_loss": losses[c] if steps[c] else float("nan"),
                        "steps": steps[c],
                    },
                    momentum=None if moms is None else moms[c],
                )
            )
        return out

    @staticmethod
    def _run_phase(
        algo: Algorithm,
        phase: Phase,
        plans: list[list[torch.Tensor]],
        augs: tuple[list[list[torch.Tensor]], int] | None,
        params: list[dict[str, torch.Tensor]],
        buffers: list[dict[str, torch.Tensor]],
        data: tuple[torch.Tensor, torch.Tensor, Any],
        extras: tuple[Any, Any],
        sgd: SGDConfig,
        loss_sum: torch.Tensor,
        use_vmap: bool,
        moms: list[list[Params]] | None,
        stops: list[EpochStop | None],
    ) -> list[int]:
        """One training stage of a chunk, updating the stacked ``params``/``buffers`` (and the
        clients' kept momentum buffers ``moms``) in place; the steps each client ran (fewer
        than planned when it stopped early, ``stops``)."""
        idx_pad, y_pad, inputs = data
        ex, ex_dims = extras
        dev = idx_pad.device
        C = len(plans)
        S = max(len(p) for p in plans)
        ran = [len(p) for p in plans]
        if S == 0:
            return ran
        B = max((len(b) for p in plans for b in p), default=1)
        # schedules -> [S, C, B] positions, masks; [S, C] activity (one transfer each)
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
        pos, mask, active = pos.to(dev), mask.to(dev), active.to(dev)
        aug = None if aug is None else aug.to(dev)
        loss_fn = getattr(algo, phase.loss)
        names = [phase.trained_names(m, params[m]) for m in range(len(params))]
        train_p = [{k: params[m][k] for k in names[m]} for m in range(len(params))]
        frozen_p = [
            {k: v for k, v in params[m].items() if k not in train_p[m]} for m in range(len(params))
        ]

        step = [0]  # the step being run (a Python int, read when the loss is traced)

        def client_loss(tp, fp, b, x, y, ps, mk, e):
            p = [{**f, **t} for t, f in zip(tp, fp, strict=True)]
            return loss_fn(p, b, Batch(x=x, y=y, pos=ps, mask=mk, step=step[0]), e)

        flat_names = [(m, k) for m in range(len(params)) for k in names[m]]
        flat_p = [t for d in train_p for t in d.values()]
        flat_b = [t for d in buffers for t in d.values()]
        # each client's start buffer of each trained parameter (None: fresh)
        mom = [
            [None if moms is None else moms[c][m].get(k) for m, k in flat_names] for c in range(C)
        ]
        if use_vmap:
            step_fn = vmap(
                grad_and_value(client_loss),
                in_dims=(0, 0, 0, 0, 0, 0, 0, ex_dims),
                randomness="different",
            )
            momentum: list[torch.Tensor | None] = [None] * len(flat_p)
            if moms is not None and sgd.momentum:  # stored buffers, zero where none yet
                momentum = [
                    torch.stack(
                        [torch.zeros_like(p[c]) if t is None else t for c, t in enumerate(col)]
                    )
                    for p, col in zip(flat_p, zip(*mom, strict=True), strict=True)
                ]
        else:  # CPU: per-client kernels beat grouped ones; same stacked state and arithmetic
            grad_fn = grad_and_value(client_loss)
        adversary = None
        if phase.adversary is not None:
            adversary = StackedAdversary(algo, phase.adversary, params, extras, use_vmap)
        for s in range(S):
            step[0] = s
            ps, mk, act = pos[s], mask[s], active[s]
            gidx = idx_pad.gather(1, ps).reshape(-1)
            if aug is None:
                x = inputs(gidx)
            else:
                x = inputs(gidx, CropFlip(aug[s].reshape(-1, 3), augs[1]))
            x = x.view(C, B, *x.shape[1:])
            y = y_pad.gather(1, ps)
            if adversary is not None:
                live = [c for c in range(C) if s < ran[c]]
                lens = [len(p[s]) if s < len(p) else 0 for p in plans]
                adversary.train(buffers, (x, y, ps, mk), act, live, lens, s)
            if use_vmap:
                old_b = [t.clone() for t in flat_b]
                grads, loss = step_fn(train_p, frozen_p, buffers, x, y, ps, mk, ex)
                _stacked_sgd(flat_p, [t for d in grads for t in d.values()], momentum, act, sgd)
                for t, o in zip(flat_b, old_b, strict=True):  # finished clients keep buffers
                    t.copy_(torch.where(act.view(-1, *[1] * (t.ndim - 1)) > 0, t, o))
                loss_sum += loss.detach() * act
                for c, stop in enumerate(stops):  # early stopping: mask the remaining steps
                    if stop is not None and s < ran[c] and stop.after(float(loss[c].detach())):
                        ran[c] = s + 1
                        active[s + 1 :, c] = 0.0
                continue
            for c, plan in enumerate(plans):
                if s >= ran[c]:
                    continue  # this client has finished (or stopped) this stage's steps
                n = len(plan[s])
                g, v = grad_fn(
                    [{k: t[c] for k, t in d.items()} for d in train_p],
                    [{k: t[c] for k, t in d.items()} for d in frozen_p],
                    [{k: t[c] for k, t in d.items()} for d in buffers],
                    x[c, :n],
                    y[c, :n],
                    ps[c, :n],
                    None,
                    _select(ex, ex_dims, c),
                )
                sgd_step([t[c] for t in flat_p], [t for d in g for t in d.values()], mom[c], sgd)
                loss_sum[c] += v.detach()
                if stops[c] is not None and stops[c].after(float(v.detach())):
                    ran[c] = s + 1
        if moms is None:
            return ran
        for c in range(C):
            if use_vmap:
                mom[c] = [None if t is None else t[c].clone() for t in momentum]
            store_momentum(moms[c], flat_names, mom[c])
        return ran


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
        sq = sum(g.pow(2).flatten(1).sum(1) for g in grads)
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
