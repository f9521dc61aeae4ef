"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020): local SGD whose gradient is corrected by control
variates, so that clients drift less towards their own optima.

The server keeps the global model ``x`` and a server control variate ``c``; each client keeps
its own control variate ``c_i``; both start at zero. One round, for each sampled client ``i``
of ``S`` (the paper's Algorithm 1)::

    y_i ← x;  K times:  y_i ← y_i − η (g_i(y_i) − c_i + c)
    option I:   c_i⁺ = ∇f_i(x)                               (full local gradient at x)
    option II:  c_i⁺ = c_i − c + (x − y_i) / (K η)
    server:     x ← x + η_g · mean_{i∈S}(y_i − x)
                c ← c + (|S|/N) · mean_{i∈S}(c_i⁺ − c_i)

``η`` is the round's local lr (``RoundContext.lr``, after the run's decay), ``K`` the client's
local steps (``ClientResult.steps``), ``N`` the federation's training clients
(``RoundContext.num_clients``). For option II the server computes ``c_i⁺ − c_i = −c + (x −
y_i)/(K η)`` from the model alone; option I uploads ``c_i⁺ − c_i``.

Hyper-parameters: ``option`` (``II``: the cheaper one, no extra pass over the client's data),
``server_lr`` ``η_g`` (1: "we always use global step-size η_g = 1", the paper's experiments),
and FedAvg's ``weighting`` of the model average.

Choices and differences from the paper:

- The correction enters as the local loss ``CE(y) + Σ_k <y_k − sg(y_k), (c − c_i)_k>``
  (``sg``: stop-gradient): its gradient is ``∇CE + c − c_i`` and its value ``CE``, so the
  reported training loss stays the cross-entropy. ``c − c_i`` is an extra of the task (stacked
  over clients by the batched executor).
- The paper's local steps are plain SGD. The engine's steps add the run's weight decay
  ``wd·y`` to the gradient, apply momentum ``ρ`` to the corrected gradient and clip it
  (``train.grad_clip``). So that ``c_i⁺`` stays the client's mean gradient under momentum,
  option II divides by the *effective* steps ``a(K, ρ) = [K − ρ(1 − ρ^K)/(1 − ρ)] / (1 − ρ)``
  (FedNova's normaliser, :func:`~fedshift.algorithms.fednova.effective_steps`) instead of
  ``K``: ``(x − y_i)/(a η)`` is then a weighted mean of the corrected gradients. With ``ρ = 0``
  ``a = K``, the paper's formula; dividing by ``K`` under momentum ``ρ = 0.9`` would make
  ``c_i⁺`` up to ten times (``1/(1 − ρ)``) the gradient. With ``train.keep_momentum`` the first steps also carry earlier
  rounds' momentum, which ``a`` does not count.
- Option I's ``c_i⁺`` is the gradient of the objective the local steps descend, the mean
  cross-entropy over the client's train split at ``x`` plus ``wd·x`` (so both options estimate
  the same quantity), in batches of ``eval_batch``, with the model in eval mode (BatchNorm's
  running statistics, no dropout) and no augmentation.
- The model average is weighted by ``weighting`` (sample counts by default, as FedAvg here;
  the paper's mean is uniform, the same on equal clients); ``c``'s update is the paper's
  uniform mean. Buffers (BatchNorm statistics) are FedAvg's average, not moved by ``η_g``.
- A client that took no step keeps its ``c_i`` and does not count in ``c``'s update.
- The global (evaluated) model is ``x``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal, TypedDict

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, average_models
from fedshift.algorithms.fednova import effective_steps
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import GlobalModel


class ScaffoldServer(GlobalModel):
    """The global model and the server control variate ``c`` (one tensor per parameter)."""

    c: TensorDict


class ScaffoldClient(TypedDict, total=False):
    """The client control variate ``c_i``, once the client has trained (absent: zeros)."""

    c: TensorDict


class ScaffoldParams(FedAvgParams):
    option: Literal["I", "II"] = Field(
        default="II",
        description="control variate update: I = local gradient at the server model, "
        "II = c_i - c + (x - y_i)/(K lr)",
    )
    server_lr: float = Field(default=1.0, gt=0, description="global step size eta_g")


def linear_term(params: TensorDict, vec: TensorDict) -> torch.Tensor:
    """``Σ_k <p_k − sg(p_k), v_k>``: value 0, gradient ``v`` with respect to ``params``."""
    terms = [((params[k] - params[k].detach()) * v).sum() for k, v in vec.items()]
    return torch.stack(terms).sum() if terms else torch.zeros(())


def correction(c: TensorDict, c_i: TensorDict | None) -> TensorDict:
    """The drift correction ``c − c_i`` added to a client's gradient (``c_i`` None: zeros)."""
    return dict(c) if c_i is None else {k: v - c_i[k] for k, v in c.items()}


def option2_delta(
    x: TensorDict, y: TensorDict, c: TensorDict, steps: float, lr: float
) -> TensorDict:
    """Option II's ``c_i⁺ − c_i = −c + (x − y_i) / (steps · lr)`` (``steps``: ``K``, or the
    effective steps under momentum)."""
    return {k: (x[k] - y[k]) / (steps * lr) - c[k] for k in c}


def server_model(x: TensorDict, mean_y: TensorDict, server_lr: float) -> TensorDict:
    """``x + η_g (mean_y − x)`` (``mean_y`` itself when ``η_g = 1``)."""
    if server_lr == 1.0:
        return mean_y
    return {
        k: x[k] + server_lr * (v - x[k]) if torch.is_floating_point(v) else v
        for k, v in mean_y.items()
    }


@register
class Scaffold(FedAvg):
    """FedAvg with control variates: local gradients corrected by ``c − c_i``."""

    name = "scaffold"
    paper = (
        'Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated '
        'Learning", ICML 2020'
    )
    Params = ScaffoldParams
    ServerState = ScaffoldServer
    ClientState = ScaffoldClient
    premise = "iid"

    def init_server_state(self, init):
        params, buffers = init[0]
        return {"params": params, "buffers": buffers, "c": zeros_like(params)}

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        return LocalTask(
            params=[server["params"]],
            buffers=[server["buffers"]],
            extras={"correction": correction(server["c"], client.get("c"))},
            info={"lr": ctx.lr, "c_i": client.get("c")},
        )

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        logits = self.ops.forward(params[0], buffers[0], batch.x)
        ce = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        return ce + linear_term(params[0], extras["correction"])

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        """Option I: ``c_i⁺ − c_i`` with ``c_i⁺`` the local gradient at the server model."""
        if self.hp.option != "I" or data.num_train == 0:
            return {}
        grad = self.full_gradient(task.params[0], task.buffers[0], data)
        c_i = task.info.get("c_i")
        return {"delta_c": grad if c_i is None else {k: g - c_i[k] for k, g in grad.items()}}

    def full_gradient(
        self, params: TensorDict, buffers: TensorDict, data: ClientData
    ) -> TensorDict:
        """The gradient at ``params`` of the mean cross-entropy over the client's train split
        plus the run's weight decay ``wd·params`` (eval mode, batches of ``eval_batch``)."""
        x = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        bufs = {k: v.detach().clone() for k, v in buffers.items()}
        total = zeros_like(params)
        module = self.ops.module
        was_training = module.training
        module.eval()
        try:
            with torch.enable_grad():
                n, step = data.num_train, max(1, int(data.eval_batch))
                for start in range(0, n, step):
                    idx = data.train_idx[start : start + step]
                    logits = self.ops.forward(x, bufs, data.inputs(idx))
                    y = data.y_train[start : start + step]
                    loss = F.cross_entropy(logits, y, reduction="sum") / n
                    grads = torch.autograd.grad(loss, list(x.values()), allow_unused=True)
                    for k, g in zip(x, grads, strict=True):
                        if g is not None:
                            total[k] += g
        finally:
            module.train(was_training)
        wd = self.train_defaults.weight_decay
        return {k: g + wd * params[k] if wd else g for k, g in total.items()}

    def _delta_c(self, server: State, result: ClientResult, lr: float | None) -> TensorDict | None:
        """``c_i⁺ − c_i`` of a client's result (None: it took no step)."""
        if result.steps <= 0 or result.num_samples <= 0:
            return None
        if self.hp.option == "I":
            return result.upload["delta_c"]
        a = effective_steps(result.steps, self.train_defaults.momentum)
        eta = self.train_defaults.lr if lr is None else lr
        return option2_delta(server["params"], result.params[0], server["c"], a, eta)

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        delta = self._delta_c(server, result, task.info.get("lr"))
        if delta is None:
            return client
        c_i = client.get("c")
        return {"c": delta if c_i is None else {k: v + delta[k] for k, v in c_i.items()}}

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        sum_delta, count = zeros_like(server["c"]), 0

        def tapped() -> Iterator[ClientResult]:  # one pass: c's sums beside the model average
            nonlocal count
            for r in results:
                delta = self._delta_c(server, r, ctx.lr)
                if delta is not None:
                    for k, v in delta.items():
                        sum_delta[k] += v
                    count += 1
                yield r

        avg = average_models(server, tapped(), self.hp.weighting)
        if count == 0:
            return avg
        n = ctx.num_clients or count  # |S|/N · mean over S = sum over S / N
        c = {k: v + sum_delta[k] / n for k, v in server["c"].items()}
        params = server_model(server["params"], avg["params"], self.hp.server_lr)
        return {**avg, "params": params, "c": c}


def zeros_like(like: TensorDict) -> TensorDict:
    """A dict of zero tensors shaped as ``like`` (a control variate's start)."""
    return {k: torch.zeros_like(v) for k, v in like.items()}
