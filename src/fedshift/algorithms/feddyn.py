"""FedDyn (Acar, Zhao, Matas Navarro, Mattina, Whatmough & Saligrama, "Federated Learning Based
on Dynamic Regularization", ICLR 2021): each client's objective gets a linear and a quadratic
term, updated every round, so that the clients' stationary points agree with the global one.

Client ``i`` keeps ``∇L_i(θ_i^{t−1})`` (``grad``, zeros until it first trains); the server keeps
its model ``θ`` and ``h`` (zeros at the start). In round ``t`` the sampled clients ``P``
(Algorithm 1 of the paper)::

    θ_i  ≈ argmin  L_i(θ) − <∇L_i(θ_i^{t−1}), θ> + (α/2) ||θ − θ^{t−1}||²   (local SGD from θ^{t−1})
    ∇L_i(θ_i^t) = ∇L_i(θ_i^{t−1}) − α (θ_i − θ^{t−1})                        (client state)
    h   ← h − α (1/m) Σ_{i∈P} (θ_i − θ^{t−1})                                 (m: all clients)
    θ^t = (1/|P|) Σ_{i∈P} θ_i − h/α

Hyper-parameter: ``alpha`` (α), default 0.01, the value of the authors' public CIFAR-10
example (alpemreacar/FedDyn, ``alpha_coef = 1e-2``); it is tuned per dataset.

The global (evaluated) model is the server model ``θ^t`` above, the one every client starts
from. The authors' code also evaluates the plain mean of the sampled clients' models
(``1/|P| Σ θ_i``, its "sel" model) and of every client's latest model ("all"); those are not
kept here.

Choices and differences from the paper and the authors' code:

- Local training is the run's SGD (its epochs, lr, momentum, weight decay and clipping) on
  ``CE(θ) − Σ_k <θ_k − sg(θ_k), grad_k> + (α/2)||θ − θ^{t−1}||²`` (``sg``: stop-gradient): the
  linear term has FedDyn's gradient ``−grad`` and the value 0, so the reported training loss
  is the cross-entropy plus the quadratic term. The authors' code uses plain SGD with weight
  decay (no momentum) and puts the quadratic into the weight decay; the gradient is the same.
- ``α`` is the same on every client, as in the paper; the authors' code divides it by the
  client's relative sample count ``n_i / mean(n)`` (identical on equal clients).
- ``m`` is ``RoundContext.num_clients`` (the federation's training clients; the number of
  sampled results when a hand-built context leaves it 0). The means over ``P`` are uniform,
  as in the paper and the code; clients without samples are left out. Buffers (BatchNorm
  statistics) are averaged uniformly over ``P`` and take no ``h`` correction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    HyperParams,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.fedavg import FedAvg, average_models
from fedshift.algorithms.fedprox import proximal_term
from fedshift.algorithms.registry import register
from fedshift.algorithms.scaffold import linear_term, zeros_like
from fedshift.algorithms.states import GlobalModel


class FedDynServer(GlobalModel):
    """The server model ``θ`` and ``h`` (one tensor per parameter)."""

    h: TensorDict


class FedDynClient(TypedDict, total=False):
    """The client's ``∇L_i(θ_i)`` of its last round, once it has trained (absent: zeros)."""

    grad: TensorDict


class FedDynParams(HyperParams):
    alpha: float = Field(default=0.01, gt=0, description="dynamic regularisation coefficient alpha")


def feddyn_regulariser(
    params: TensorDict, grad: TensorDict, anchor: TensorDict, alpha: float
) -> torch.Tensor:
    """``−<grad, θ> + (α/2)||θ − anchor||²`` with the linear term's value dropped (it keeps
    its gradient ``−grad``)."""
    neg = {k: -v for k, v in grad.items()}
    return linear_term(params, neg) + 0.5 * alpha * proximal_term(params, anchor)


def client_grad(grad: TensorDict | None, theta: TensorDict, server: TensorDict, alpha: float):
    """The client's new ``∇L_i(θ_i) = grad − α (θ_i − θ_server)`` (``grad`` None: zeros)."""
    return {
        k: (-alpha * (theta[k] - v)) if grad is None else grad[k] - alpha * (theta[k] - v)
        for k, v in server.items()
    }


def server_update(
    mean_theta: TensorDict, drift_sum: TensorDict, h: TensorDict, alpha: float, m: int
) -> tuple[TensorDict, TensorDict]:
    """``h ← h − (α/m) Σ_P (θ_i − θ)`` and ``θ = mean_P θ_i − h/α`` (``drift_sum``: the sum)."""
    new_h = {k: v - (alpha / m) * drift_sum[k] for k, v in h.items()}
    theta = {k: v - new_h[k] / alpha if k in new_h else v for k, v in mean_theta.items()}
    return theta, new_h


@register
class FedDyn(FedAvg):
    """Dynamic regularisation: a linear and a quadratic term per client and round."""

    name = "feddyn"
    paper = 'Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021'
    Params = FedDynParams
    ServerState = FedDynServer
    ClientState = FedDynClient
    premise = "iid"

    def init_server_state(self, init):
        params, buffers = init[0]
        return {"params": params, "buffers": buffers, "h": zeros_like(params)}

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        grad = client.get("grad")
        return LocalTask(
            params=[server["params"]],
            buffers=[server["buffers"]],
            extras={
                "anchor": server["params"],
                "grad": zeros_like(server["params"]) if grad is None else grad,
            },
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
        reg = feddyn_regulariser(params[0], extras["grad"], extras["anchor"], self.hp.alpha)
        return ce + reg

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        if result.num_samples <= 0:
            return client
        new = client_grad(client.get("grad"), result.params[0], server["params"], self.hp.alpha)
        return {"grad": new}

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        x = server["params"]
        drift, count = zeros_like(server["h"]), 0

        def tapped() -> Iterator[ClientResult]:  # one pass: Σ (θ_i − θ) beside the mean
            nonlocal count
            for r in results:
                if r.num_samples > 0:
                    for k in drift:
                        drift[k] += r.params[0][k] - x[k]
                    count += 1
                yield r

        avg = average_models(server, tapped(), "uniform")
        if count == 0:
            return server
        theta, h = server_update(
            avg["params"], drift, server["h"], self.hp.alpha, ctx.num_clients or count
        )
        return {**avg, "params": theta, "h": h}
