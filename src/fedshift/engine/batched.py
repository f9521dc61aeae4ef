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

Memory is bounded by the chunk: peak use grows with ``chunk_size`` x batch size, not with the
number of clients.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.func import grad_and_value, vmap

from fedshift.algorithms.base import Algorithm, Batch, ClientData, ClientResult, LocalTask
from fedshift.engine.executors import LocalSchedule, SequentialExecutor, client_generator
from fedshift.engine.training import SGDConfig, batch_schedule, num_local_steps, sgd_step


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
        self._fallback = SequentialExecutor()

    def train(
        self,
        algo: Algorithm,
        jobs: list[tuple[LocalTask, ClientData]],
        sgd: SGDConfig,
        sched: LocalSchedule,
        seed: int,
        rnd: int,
    ) -> Iterator[ClientResult]:
        """Train the jobs' clients chunk by chunk, yielding each chunk's results (streamed)."""
        if not algo.supports_batched:
            yield from self._fallback.train(algo, jobs, sgd, sched, seed, rnd)
            return
        plans = [self._plan(task, data, sched, seed, rnd) for task, data in jobs]
        groups: dict[Any, list[int]] = defaultdict(list)
        bn = has_batchnorm(algo.ops.module)
        for i, plan in enumerate(plans):
            groups[tuple(len(p) for p in plan) if bn else 0].append(i)
        for members in groups.values():
            for start in range(0, len(members), self.chunk_size):
                chunk = members[start : start + self.chunk_size]
                yield from self._train_chunk(
                    algo, [jobs[i] for i in chunk], [plans[i] for i in chunk], sgd, sched
                )

    @staticmethod
    def _plan(
        task: LocalTask, data: ClientData, sched: LocalSchedule, seed: int, rnd: int
    ) -> list[torch.Tensor]:
        n = data.num_train
        steps = num_local_steps(n, sched.batch_size, sched.epochs, sched.drop_last, sched.steps)
        if not task.train:
            steps = 0
        return batch_schedule(
            n, sched.batch_size, steps, sched.drop_last, client_generator(seed, rnd, data.cid)
        )

    def _train_chunk(
        self,
        algo: Algorithm,
        jobs: list[tuple[LocalTask, ClientData]],
        plans: list[list[torch.Tensor]],
        sgd: SGDConfig,
        sched: LocalSchedule,
    ) -> list[ClientResult]:
        tasks, views = [j[0] for j in jobs], [j[1] for j in jobs]
        dev = views[0].train_idx.device
        C = len(jobs)
        S = max(len(p) for p in plans)
        B = max((len(b) for p in plans for b in p), default=1)
        # schedules -> [S, C, B] positions, masks; [S, C] activity (one transfer each)
        pos = torch.zeros(S, C, B, dtype=torch.long)
        mask = torch.zeros(S, C, B)
        active = torch.zeros(S, C)
        for c, plan in enumerate(plans):
            for s in range(S):
                b = plan[min(s, len(plan) - 1)] if plan else torch.zeros(0, dtype=torch.long)
                pos[s, c, : len(b)] = b
                mask[s, c, : len(b)] = 1.0
                active[s, c] = float(s < len(plan))
        pos, mask, active = pos.to(dev), mask.to(dev), active.to(dev)
        n_max = max(v.num_train for v in views)
        idx_pad = torch.stack(
            [torch.cat([v.train_idx, v.train_idx.new_zeros(n_max - v.num_train)]) for v in views]
        )
        y_pad = torch.stack(
            [torch.cat([v.y_train, v.y_train.new_zeros(n_max - v.num_train)]) for v in views]
        )

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
        inputs = views[0].inputs

        def client_loss(p, b, x, y, ps, mk, ex):
            return algo.local_loss(p, b, Batch(x=x, y=y, pos=ps, mask=mk), ex)

        use_vmap = self.vectorize == "vmap" or (self.vectorize == "auto" and dev.type != "cpu")
        flat_p = [t for d in params for t in d.values()]
        flat_b = [t for d in buffers for t in d.values()]
        loss_sum = torch.zeros(C, device=dev)
        module = algo.ops.module
        module.train()
        if use_vmap:
            step_fn = vmap(
                grad_and_value(client_loss),
                in_dims=(0, 0, 0, 0, 0, 0, extras_dims),
                randomness="different",
            )
            momentum: list[torch.Tensor | None] = [None] * len(flat_p)
        else:  # CPU: per-client kernels beat grouped ones; same stacked state and arithmetic
            grad_fn = grad_and_value(client_loss)
            mom: list[list[torch.Tensor | None]] = [[None] * len(flat_p) for _ in plans]
        for s in range(S):
            ps, mk, act = pos[s], mask[s], active[s]
            gidx = idx_pad.gather(1, ps)
            x = inputs(gidx.reshape(-1))
            x = x.view(C, B, *x.shape[1:])
            y = y_pad.gather(1, ps)
            if use_vmap:
                old_b = [t.clone() for t in flat_b]
                grads, loss = step_fn(params, buffers, x, y, ps, mk, extras)
                _stacked_sgd(flat_p, [t for d in grads for t in d.values()], momentum, act, sgd)
                for t, o in zip(flat_b, old_b, strict=True):  # finished clients keep buffers
                    t.copy_(torch.where(act.view(-1, *[1] * (t.ndim - 1)) > 0, t, o))
                loss_sum += loss.detach() * act
                continue
            for c, plan in enumerate(plans):
                if s >= len(plan):
                    continue  # this client has finished its steps
                n = len(plan[s])
                g, v = grad_fn(
                    [{k: t[c] for k, t in d.items()} for d in params],
                    [{k: t[c] for k, t in d.items()} for d in buffers],
                    x[c, :n],
                    y[c, :n],
                    ps[c, :n],
                    None,
                    _select(extras, extras_dims, c),
                )
                sgd_step([t[c] for t in flat_p], [t for d in g for t in d.values()], mom[c], sgd)
                loss_sum[c] += v.detach()
        module.eval()
        steps = [len(p) for p in plans]
        losses = (loss_sum.cpu() / torch.tensor(steps).clamp_min(1)).tolist()
        return [
            ClientResult(
                cid=v.cid,
                num_samples=v.num_train,
                params=[{k: t[c].clone() for k, t in params[m].items()} for m in range(K)],
                buffers=[{k: t[c].clone() for k, t in buffers[m].items()} for m in range(K)],
                stats={"train_loss": losses[c] if steps[c] else float("nan"), "steps": steps[c]},
            )
            for c, v in enumerate(views)
        ]


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
