"""APFL (Deng, Kamani & Mahdavi, "Adaptive Personalized Federated Learning", arXiv 2020).

Each client ``i`` keeps a personal model ``v_i`` and a mixing weight ``α_i ∈ [0, 1]``; its
personalised model is the parameter mix ``v̄_i = α_i·v_i + (1 − α_i)·w_i`` of the personal
model and its copy ``w_i`` of the global model. On every local mini-batch ``ξ`` (the same one
for all three updates; the paper's Algorithm 1, with the gradients all taken at the step's
starting point)::

    w_i ← w_i − η·∇f_i(w_i; ξ)
    v_i ← v_i − η·∇_v f_i(v̄_i; ξ)                     = v_i − η·α_i·∇f_i(v̄_i; ξ)
    α_i ← Π_[0,1]( α_i − η_α·∇_α f_i(v̄_i; ξ) )         ∇_α f_i(v̄_i) = <v_i − w_i, ∇f_i(v̄_i; ξ)>

and the server averages the ``w_i`` (FedAvg, ``weighting`` as FedAvg's). ``v_i`` and ``α_i``
stay on the client.

Within the contract the three updates are one stage of the engine's SGD on three models
``[w (model 0), v (model 1), {"alpha": α} (model 2)]`` with the loss (:func:`apfl_loss`)::

    CE(w; ξ) + CE(α̂·v + (1 − α̂)·sg(w); ξ) + (a − sg(α̂))² / (2η)

``sg`` stops the gradient, so ``w`` gets ``∇f(w)`` only and ``v``, ``α`` get exactly the
gradients above. ``a`` is the stored (trainable) value of α and ``α̂ = clip(a, 0, 1)`` the one
used, carrying the gradient scaled by ``η_α/η`` (:func:`alpha_terms`); the last term's gradient
``(a − α̂)/η`` makes the engine's plain SGD step land on ``α̂ − η_α·g``: with it every step
starts from the projection of the previous one, which is exactly projected SGD on α (and the
value a client keeps is projected, :meth:`APFL.client_update`). α is stored as a one-element
tensor (the batched executor's clipping stacks parameters and needs a dimension).

Hyper-parameters:

- ``alpha`` (0.5): the initial ``α_i``. The authors' code (FedTorch, ``--fed_personal_alpha``)
  defaults to 0.5 and FedRC's code runs APFL with α = 0.5 (spec fedrc.md §4). The paper's
  experiments were not readable in this session, so no separate paper default is claimed.
- ``adaptive`` (true): learn ``α_i`` (the paper's adaptive APFL); false: ``α_i`` stays at
  ``alpha`` (FedTorch's default, ``--fed_adaptive_alpha false``).
- ``alpha_lr`` (None: the round's lr ``η``): ``η_α``; the paper's Algorithm 1 steps α with
  the same ``η_t`` as ``w`` and ``v``, and so does the authors' code (its current lr).

Choices and differences from the paper / the authors' code:

- The engine's optimiser is the run's SGD: with ``train.momentum`` or ``train.weight_decay``
  they apply to all three models, α included (the paper is plain SGD; FedRC's code, whose
  tables run APFL, uses SGD with momentum 0.9 and weight decay 5e-4). The projection of α
  is exact under plain SGD; with momentum the pull term still draws ``a`` back to [0, 1] (a
  stable heavy-ball step on a quadratic of curvature 1/η) and the value used is always
  ``clip(a)``. ``train.grad_clip`` clips the three gradients together.
- The authors' code (FedTorch) updates ``w`` first and then ``v`` against the *updated*
  ``w``, steps α once per round (on its first batch, from the two models' gradients) and
  adds ``0.02·α`` to α's gradient; we follow the paper's simultaneous per-step updates and
  add no regulariser.
- ``v_i`` starts from the common initial model (as Ditto's personal model); its BatchNorm
  statistics are those of the mixed model ``v̄_i`` (the forward passes that train it).
- Scoring: a client's personalised model is ``α_i·v_i + (1 − α_i)·w`` with ``w`` the current
  global model (what the client mixes with when it next trains) and the client's statistics;
  a client that never trained (and every test-only client) is scored with the global model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Phase,
    RoundContext,
    State,
    TensorDict,
    clone_params,
    keep_shared,
)
from fedshift.algorithms.capabilities import Personalised, own_model
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import OwnModel, SharedInit


class APFLParams(FedAvgParams):
    alpha: float = Field(
        default=0.5, ge=0, le=1, description="initial mixing weight alpha_i of the personal model"
    )
    adaptive: bool = Field(
        default=True, description="learn alpha_i by projected SGD (adaptive APFL); false: fixed"
    )
    alpha_lr: float | None = Field(
        default=None, gt=0, description="step size of alpha's update (None: the round's lr)"
    )


class APFLClient(OwnModel, total=False):
    """The personal model ``v_i`` (``params``, the mixed model's ``buffers``) and ``alpha``."""

    alpha: torch.Tensor


def mix_params(v: TensorDict, w: TensorDict, alpha: torch.Tensor | float) -> TensorDict:
    """The parameter mix ``α·v + (1 − α)·w``."""
    return {k: alpha * v[k] + (1 - alpha) * w[k] for k in v}


def alpha_terms(
    a: torch.Tensor, lr: float | torch.Tensor, scale: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixing weight used in a step and the pull term of the projection, from the stored
    value ``a``: ``α̂ = clip(a, 0, 1)`` whose gradient reaches ``a`` times ``scale`` (= η_α/η),
    and ``(a − α̂)²/(2·lr)``, whose gradient ``(a − α̂)/lr`` brings a plain SGD step of size
    ``lr`` back to ``α̂`` before it moves by ``−lr·scale·g``."""
    clipped = a.clamp(0.0, 1.0).detach()
    alpha = clipped + scale * (a - a.detach())
    pull = (a - clipped) ** 2 / (2 * lr)
    return alpha, pull


def apfl_loss(
    ce_w: torch.Tensor, ce_mix: torch.Tensor, pull: torch.Tensor | float = 0.0
) -> torch.Tensor:
    """APFL's one-stage loss: the global copy's CE, the mixed model's CE (``w`` stopped in
    the mix) and α's projection pull."""
    return ce_w + ce_mix + pull


@register
class APFL(Personalised, FedAvg):
    """A personal model and a learnt mixing weight per client; the server averages the
    clients' copies of the global model.

    Server state: FedAvg's ``params``/``buffers`` plus ``init_params``/``init_buffers`` (the
    start of every ``v_i``). Client state: ``v_i`` (``params``, ``buffers``) and ``alpha``.
    """

    name = "apfl"
    paper = 'Deng et al., "Adaptive Personalized Federated Learning", arXiv 2020'
    Params = APFLParams
    ServerState = SharedInit
    ClientState = APFLClient

    def init_server_state(self, init):
        params, buffers = init[0]
        return {
            "params": params,
            "buffers": buffers,
            "init_params": clone_params(params),
            "init_buffers": clone_params(buffers),
        }

    def client_alpha(self, client: State) -> torch.Tensor:
        """The client's α, a one-element tensor (the initial ``alpha`` before it first trains).
        One element, not a 0-d tensor: the batched executor's clipping stacks parameters."""
        a = client.get("alpha")
        return torch.tensor([float(self.hp.alpha)]) if a is None else a

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        v, vb = own_model(client, (server["init_params"], server["init_buffers"]))
        lr = float(ctx.lr if ctx.lr is not None else self.train_defaults.lr)
        scale = 1.0 if self.hp.alpha_lr is None else self.hp.alpha_lr / lr
        models = ((0, None), (1, None), (2, None)) if self.hp.adaptive else ((0, None), (1, None))
        return LocalTask(
            params=[server["params"], v, {"alpha": self.client_alpha(client)}],
            buffers=[server["buffers"], vb, {}],
            extras={"lr": lr, "alpha_scale": scale},
            phases=(Phase(trainable=models),),
        )

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        w, v = params[0], params[1]
        ce_w = batch.mean(
            F.cross_entropy(self.ops.forward(w, buffers[0], batch.x), batch.y, reduction="none")
        )
        a = params[2]["alpha"].reshape(())
        alpha, pull = alpha_terms(a, extras["lr"], extras["alpha_scale"])
        mixed = mix_params(v, {k: t.detach() for k, t in w.items()}, alpha)
        logits = self.ops.forward(mixed, buffers[1], batch.x)
        ce_mix = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        return apfl_loss(ce_w, ce_mix, pull if self.hp.adaptive else 0.0)

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """The personal model ``v_i`` and ``alpha`` (models 1 and 2) stay on the client."""
        return keep_shared(result, private=(1, 2))

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        alpha = result.params[2]["alpha"].detach().clamp(0.0, 1.0)
        return {"params": result.params[1], "buffers": result.buffers[1], "alpha": alpha}

    def mixture(self, server: State, client: State, data: ClientData):
        if data.test_only or "params" not in client:
            return [(1.0, server["params"], server["buffers"])]
        alpha = self.client_alpha(client).reshape(())
        mixed = mix_params(client["params"], server["params"], alpha)
        return [(1.0, mixed, client["buffers"])]
