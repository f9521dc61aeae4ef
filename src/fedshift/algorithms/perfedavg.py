"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020).

The federation learns an initial model ``w`` from which one step of local gradient descent
personalises well: it minimises ``F(w) = (1/n)·Σ_i f_i(w − α·∇f_i(w))`` (MAML). Each local
step draws independent batches ``D``, ``D'`` (and ``D''``) and moves ``w`` by the stochastic
gradient of ``f_i(w − α·∇f_i(w))``::

    w' = w − α·∇f(w; D)                                  (the inner, adaptation step)
    FO:  w ← w − β·∇f(w'; D')                            (first order: Hessian dropped)
    HF:  w ← w − β·(I − α·∇²f(w; D''))·∇f(w'; D')        (Hessian-free)

and HF estimates the Hessian-vector product with a difference of gradients,
``∇²f(w; D'')·g ≈ [∇f(w + δ·g; D'') − ∇f(w − δ·g; D'')] / (2δ)``, ``g = ∇f(w'; D')``.
The server averages the clients' ``w`` (FedAvg, ``weighting`` as FedAvg's). A client is scored
after ``ft_steps`` (the paper: one) steps of local SGD of size ``α`` from the global model on
its own train split (for a test-only client: its adaptation split), a
:class:`~fedshift.algorithms.capabilities.FineTunes` task.

Within the contract each outer step is one step of the engine's SGD (its lr is the paper's
outer step size β, i.e. the run's lr) on a loss whose gradient with respect to ``w`` is the
update direction: the engine's mini-batch is split into 2 (FO) or 3 (HF) equal parts (random:
the batch's order is), ``D``, ``D'``, ``D''``, and

- FO: :func:`fo_meta_loss` ``= f(w − α·sg(∇f(w; D)); D')``, gradient ``∇f(w'; D')``;
- HF: that loss minus ``α·(<h, w> − sg(<h, w>))`` with ``h`` the product above (computed by
  finite differences, the paper's, or exactly with double back-propagation,
  ``hvp="exact"``): gradient ``∇f(w'; D') − α·h``, loss value ``f(w'; D')``.

The loss differentiates inside itself (``torch.autograd.grad``), so Per-FedAvg runs on the
sequential executor only (``supports_batched = False``).

Hyper-parameters:

- ``alpha`` (0.01): the inner step size, also the step of the evaluation's adaptation. The
  paper's experimental settings could not be read in this session, so this is not claimed
  as the paper's value: it is FLGo's Per-FedAvg default (``alpha`` 0.01). Per-FedAvg needs
  an α large enough for one step to personalise.
- ``delta`` (HF, 0.001): the finite-difference step (FLGo's default too).
- ``ft_steps`` (1): adaptation steps before scoring (the paper evaluates after one step).
- β: the run's lr (``train.lr``), the outer step.

Choices and differences from the paper:

- ``D``, ``D'``, ``D''`` are the halves / thirds of one engine mini-batch (the paper draws
  independent batches of its size ``|D|``): set ``train.batch_size`` to 2 (FO) or 3 (HF) times
  the paper's batch; one local step uses one engine mini-batch. A batch of fewer samples than
  parts leaves a part empty (its loss 0).
- The outer step is the engine's SGD: with ``train.momentum`` or ``weight_decay`` they apply
  (the paper: plain SGD); the evaluation's adaptation steps are plain SGD of size ``α`` on
  batches of the part size (the run's batch size over 2 or 3), in the batch order of FedAvg +
  FT's fine-tuning (the same seed stream).
- BatchNorm statistics are updated by the passes on ``D`` and ``D'``; the passes on ``D''``
  use scratch copies.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    LocalTask,
    Phase,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import FineTunes, Personalised
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register
from fedshift.core.seeds import FEDAVG_FT_STREAM, SHUFFLE_STREAM, derive_seed

Loss = Any  # (params, buffers, x, y) -> scalar


class PerFedAvgParams(FedAvgParams):
    alpha: float = Field(
        default=0.01, gt=0, description="inner (adaptation) step size, also at evaluation"
    )
    ft_steps: int = Field(
        default=1, ge=1, description="steps of local adaptation (lr alpha) before scoring"
    )


class PerFedAvgHFParams(PerFedAvgParams):
    delta: float = Field(
        default=0.001, gt=0, description="finite-difference step of the Hessian-vector product"
    )
    hvp: Literal["finite_difference", "exact"] = Field(
        default="finite_difference",
        description="Hessian-vector product: the paper's finite difference, or exact autograd",
    )


# ---------------------------------------------------------------------- the math


def split_batch(x: torch.Tensor, y: torch.Tensor, parts: int) -> list[tuple]:
    """``parts`` consecutive, (nearly) equal parts of a batch (some empty when it is smaller)."""
    n = len(y)
    cuts = [(i * n) // parts for i in range(parts + 1)]
    return [(x[a:b], y[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def ce_loss(ops, params: TensorDict, buffers: TensorDict, x, y) -> torch.Tensor:
    """Mean cross-entropy of a (possibly empty: 0) batch."""
    logits = ops.forward(params, buffers, x)
    return F.cross_entropy(logits, y, reduction="sum") / max(len(y), 1)


def gradient(
    loss: torch.Tensor, params: TensorDict, create_graph: bool = False, retain: bool = False
) -> TensorDict:
    """``∇loss`` per parameter (zeros where it does not depend on one); ``retain``: keep the
    graph of ``loss`` for a later backward pass (the engine's)."""
    names = list(params)
    if not loss.requires_grad:
        return {k: torch.zeros_like(params[k]) for k in names}
    grads = torch.autograd.grad(
        loss, [params[k] for k in names], create_graph=create_graph, allow_unused=True,
        retain_graph=retain or create_graph,
    )  # fmt: skip
    return {
        k: torch.zeros_like(params[k]) if g is None else g
        for k, g in zip(names, grads, strict=True)
    }


def adapted(w: TensorDict, g: TensorDict, alpha: float) -> TensorDict:
    """The inner step ``w − α·sg(g)`` (differentiable in ``w`` with identity Jacobian)."""
    return {k: w[k] - alpha * g[k].detach() for k in w}


def fo_meta_loss(f_d: Loss, f_d2: Loss, w: TensorDict, alpha: float) -> torch.Tensor:
    """``f(w − α·sg(∇f(w; D)); D')``: its gradient in ``w`` is FO's direction ``∇f(w'; D')``
    (``f_d``, ``f_d2``: the losses on ``D`` and ``D'`` as functions of the parameters)."""
    return f_d2(adapted(w, gradient(f_d(w), w), alpha))


def fd_hvp(f_d3: Loss, w: TensorDict, v: TensorDict, delta: float) -> TensorDict:
    """The paper's Hessian-vector product estimate
    ``[∇f(w + δ·v; D'') − ∇f(w − δ·v; D'')] / (2δ)`` (detached)."""
    out = []
    for sign in (1.0, -1.0):
        p = {k: (w[k].detach() + sign * delta * v[k]).requires_grad_(True) for k in w}
        out.append(gradient(f_d3(p), p))
    return {k: ((out[0][k] - out[1][k]) / (2 * delta)).detach() for k in w}


def grad_only(t: torch.Tensor) -> torch.Tensor:
    """``t − sg(t)``: value 0, gradient that of ``t``."""
    return t - t.detach()


def hf_meta_loss(
    f_d: Loss, f_d2: Loss, f_d3: Loss, w: TensorDict, alpha: float, delta: float, exact: bool
) -> torch.Tensor:
    """A loss with value ``f(w'; D')`` and gradient HF's direction
    ``∇f(w'; D') − α·∇²f(w; D'')·∇f(w'; D')`` (the product by finite differences of step
    ``delta``, or ``exact`` by double back-propagation)."""
    w1 = adapted(w, gradient(f_d(w), w), alpha)
    meta = f_d2(w1)
    g1 = {k: g.detach() for k, g in gradient(meta, w1, retain=True).items()}
    if exact:
        g3 = gradient(f_d3(w), w, create_graph=True)
        inner = sum((g3[k] * g1[k]).sum() for k in w)  # its gradient in w: H(w; D'') g1
    else:
        h = fd_hvp(f_d3, w, g1, delta)
        inner = sum((w[k] * h[k]).sum() for k in w)  # its gradient in w: h
    return meta - alpha * grad_only(inner)


# ---------------------------------------------------------------------- the algorithms


@register
class PerFedAvgFO(Personalised, FineTunes, FedAvg):
    """Per-FedAvg, first order: local steps on the MAML objective without its Hessian term;
    clients scored after one adaptation step from the global model."""

    name = "per-fedavg-fo"
    paper = (
        'Fallah et al., "Personalized Federated Learning with Theoretical Guarantees: A '
        'Model-Agnostic Meta-Learning Approach", NeurIPS 2020'
    )
    Params = PerFedAvgParams
    supports_batched = False
    #: the parts of an engine mini-batch: D and D' (HF adds D'')
    parts = 2

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        return LocalTask(
            params=[server["params"]],
            buffers=[server["buffers"]],
            phases=(Phase(loss="meta_loss"),),
        )

    def batch_losses(self, buffers: TensorDict, batch: Batch) -> list[Loss]:
        """The loss on each part of the batch as a function of the parameters (the last part,
        HF's D'', on scratch copies of the buffers)."""
        parts = split_batch(batch.x, batch.y, self.parts)
        fns = []
        for i, (x, y) in enumerate(parts):
            b = buffers if i < 2 else {k: v.clone() for k, v in buffers.items()}
            fns.append(lambda p, x=x, y=y, b=b: ce_loss(self.ops, p, b, x, y))
        return fns

    def meta_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        f_d, f_d2 = self.batch_losses(buffers[0], batch)
        return fo_meta_loss(f_d, f_d2, params[0], self.hp.alpha)

    def fine_tune_task(self, server: State, client: State, data: ClientData) -> LocalTask | None:
        if data.num_train == 0:
            return None
        phase = Phase(
            steps=self.hp.ft_steps,
            lr=self.hp.alpha,
            momentum=0.0,
            weight_decay=0.0,
            batch_size=max(1, self.train_defaults.batch_size // self.parts),
        )
        return LocalTask(
            params=[server["params"]],
            buffers=[server["buffers"]],
            phases=(phase,),
            stream=(derive_seed(self.seed, FEDAVG_FT_STREAM), SHUFFLE_STREAM, 0, data.cid),
        )


@register
class PerFedAvgHF(PerFedAvgFO):
    """Per-FedAvg, Hessian-free: the first-order direction corrected by the Hessian-vector
    product on a third batch."""

    name = "per-fedavg-hf"
    Params = PerFedAvgHFParams
    parts = 3

    def meta_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        f_d, f_d2, f_d3 = self.batch_losses(buffers[0], batch)
        hp = self.hp
        return hf_meta_loss(f_d, f_d2, f_d3, params[0], hp.alpha, hp.delta, exact=hp.hvp == "exact")
