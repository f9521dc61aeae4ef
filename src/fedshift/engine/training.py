"""Local SGD as small pure functions: batch schedules, the SGD update and the Adam update of a
stage's adversary.

The SGD update matches ``torch.optim.SGD`` (momentum without dampening, weight decay added to
the gradient, the first momentum buffer equal to the gradient) and the Adam one
``torch.optim.Adam`` (no weight decay, no AMSGrad), written functionally so that the sequential
and batched executors share the exact same arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SGDConfig:
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None  # max global L2 norm of a client's gradient (None: off)

    def for_phase(self, phase) -> SGDConfig:
        """This config with a training stage's overrides (lr, momentum, weight decay and
        clipping: ``clip`` True keeps this config's, False turns it off, a number sets it)."""
        if isinstance(phase.clip, bool):
            clip = self.grad_clip if phase.clip else None
        else:
            clip = float(phase.clip)
        return SGDConfig(
            lr=self.lr if phase.lr is None else phase.lr,
            momentum=self.momentum if phase.momentum is None else phase.momentum,
            weight_decay=self.weight_decay if phase.weight_decay is None else phase.weight_decay,
            grad_clip=clip,
        )


class LossRecords:
    """The values a client's losses record (:func:`~fedshift.algorithms.task.loss_and_values`):
    per name, their sum and the number of steps that returned them. Values are scalars for one
    client, or ``[C]`` for a stacked chunk with ``active`` (1 for the clients that stepped)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor | int] = {}

    def add(self, values: dict[str, torch.Tensor], active: torch.Tensor | None = None) -> None:
        for k, v in values.items():
            v = v.detach()
            v, n = (v, 1) if active is None else (v * active, active)
            self.sums[k] = self.sums[k] + v if k in self.sums else v
            self.counts[k] = self.counts[k] + n if k in self.counts else n

    def means(self, client: int | None = None) -> dict[str, float]:
        """Each name's mean over its steps (of stacked client ``client``); none before any."""
        out = {}
        for k, s in self.sums.items():
            n = self.counts[k]
            if client is not None:
                s, n = s[client], n[client]
            if float(n) > 0:
                out[k] = float(s) / float(n)
        return out


def merged_upload(upload: dict, recorded: dict[str, float], algo: str = "") -> dict:
    """A client's upload: the algorithm's, with the means its losses recorded."""
    clash = set(upload) & set(recorded)
    if clash:
        raise ValueError(f"{algo}: the upload and a loss both name {sorted(clash)}")
    return {**upload, **recorded}


def round_lr(lr: float, decay: float, rnd: int) -> float:
    """The learning rate of round ``rnd`` (1-based) under per-round exponential decay."""
    return lr * decay ** (rnd - 1)


def clip_coefficient(sq_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Factor that scales a gradient of squared norm ``sq_norm`` to norm at most ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``'s rule: max_norm / (norm + 1e-6), capped at 1)."""
    return (max_norm / (sq_norm.sqrt() + 1e-6)).clamp(max=1.0)


def num_local_steps(
    n: int, batch_size: int, epochs: int, drop_last: bool, steps: int | None = None
) -> int:
    """Local steps of a client with ``n`` samples (at least one step when n > 0)."""
    if n == 0:
        return 0
    if steps is not None:
        return steps
    per_epoch = n // batch_size if drop_last else -(-n // batch_size)
    return max(1, per_epoch) * epochs


def batch_schedule(
    n: int, batch_size: int, num_steps: int, drop_last: bool, generator: torch.Generator
) -> list[torch.Tensor]:
    """Positions (into a client's train split) of each local step's mini-batch.

    Each epoch is a fresh permutation; with ``drop_last`` the ragged tail is dropped, except
    that a client with fewer than ``batch_size`` samples trains on all of them.
    """
    out: list[torch.Tensor] = []
    bs = min(batch_size, n)
    while len(out) < num_steps:
        perm = torch.randperm(n, generator=generator)
        stop = (n // bs) * bs if drop_last else n
        for i in range(0, stop, bs):
            out.append(perm[i : i + bs])
            if len(out) == num_steps:
                break
    return out


@torch.no_grad()
def sgd_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum_bufs: list[torch.Tensor | None],
    cfg: SGDConfig,
) -> None:
    """In-place SGD update of ``params`` (and of the momentum buffers), after clipping the
    gradient's global norm when ``cfg.grad_clip`` is set."""
    if cfg.grad_clip is not None:
        present = [g for g in grads if g is not None]
        if present:
            coef = clip_coefficient(sum(g.pow(2).sum() for g in present), cfg.grad_clip)
            grads = [None if g is None else g * coef for g in grads]
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        if g is None:
            continue
        d = g.add(p, alpha=cfg.weight_decay) if cfg.weight_decay else g
        if cfg.momentum:
            buf = momentum_bufs[i]
            if buf is None:
                buf = momentum_bufs[i] = d.clone()
            else:
                buf.mul_(cfg.momentum).add_(d)
            d = buf
        p.add_(d, alpha=-cfg.lr)


def adam_moments(
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Adam step as values: the new first and second moments and the parameter change
    (to add). ``step``: the step count after this one (from 1)."""
    b1, b2 = betas
    m = exp_avg * b1 + grad * (1 - b1)
    v = exp_avg_sq * b2 + grad * grad * (1 - b2)
    c1, c2 = 1 - b1**step, (1 - b2**step) ** 0.5
    return m, v, -(lr / c1) * m / (v.sqrt() / c2 + eps)


@torch.no_grad()
def adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor | None],
    state: list[tuple[torch.Tensor, torch.Tensor] | None],
    step: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """In-place Adam update of ``params`` (``state``: each one's moments, None before its first
    step, filled in here; ``step``: the count after this update, from 1). The arithmetic of
    :func:`adam_moments`, done in place on all tensors at once (``torch._foreach_*``): a DFL
    round spent a sixth of its time in the out-of-place version."""
    live = [i for i, g in enumerate(grads) if g is not None]
    if not live:
        return
    for i in live:
        if state[i] is None:
            state[i] = (torch.zeros_like(params[i]), torch.zeros_like(params[i]))
    ps = [params[i] for i in live]
    gs = [grads[i] for i in live]
    ms = [state[i][0] for i in live]
    vs = [state[i][1] for i in live]
    b1, b2 = betas
    torch._foreach_mul_(ms, b1)
    torch._foreach_add_(ms, gs, alpha=1 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, gs, gs, value=1 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, (1 - b2**step) ** 0.5)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(ps, ms, denom, value=-(lr / (1 - b1**step)))
