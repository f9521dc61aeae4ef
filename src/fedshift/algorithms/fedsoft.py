"""FedSoft (Ruan & Joe-Wong, 2022): soft clustering with proximal personal models.

Each round a sampled client computes its importance weights u_{i,k}: the fraction of its
samples whose lowest-loss center is k, floored at σ and renormalised (the paper's rule; FedRC's
code takes the *max*-loss center, a noted bug). It trains its personal model w_i with the local
loss CE + (λ/2)·‖w_i − Σ_k u_{ik} θ_k‖² and the server sets each center to
θ_k = Σ_i u_{ik} N_i w_i / Σ_i u_{ik} N_i over the sampled clients.

Choices: a client's personal model starts (first participation) from its highest-u center;
local accuracy uses the personal model (a client that never trained uses the u-mixture, or all
centers equally); a test-only client uses the center with the lowest mean loss on its labelled
split. The client computes u in its task (``info``), uploads it (``upload["u"]``) and keeps it
as its ω.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    RunningAverage,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import AdaptsTestClients, Personalised
from fedshift.algorithms.clustered import ClusteredAlgorithm, ClusteredParams
from fedshift.algorithms.fedprox import proximal_term
from fedshift.algorithms.ifca import lowest_loss_cluster, one_hot
from fedshift.algorithms.registry import register


class FedSoftParams(ClusteredParams):
    lam: float = Field(default=0.1, ge=0, description="proximal coefficient λ")
    sigma: float = Field(default=1e-4, gt=0, lt=1, description="floor of importance weights")


def importance_weights(losses: torch.Tensor, sigma: float) -> torch.Tensor:
    """u [K] from per-sample losses [n, K]: share of samples whose min-loss cluster is k,
    floored at ``sigma`` and renormalised to sum 1."""
    K = losses.shape[1]
    if losses.shape[0] == 0:
        return torch.full((K,), 1.0 / K)
    counts = torch.bincount(losses.argmin(dim=1).cpu(), minlength=K).double()
    u = (counts / losses.shape[0]).clamp_min(sigma)
    return (u / u.sum()).to(torch.get_default_dtype())


def mix_params(weights: Sequence[float], dicts: Sequence[TensorDict]) -> TensorDict:
    """Σ_k weights_k · dicts_k (float tensors)."""
    out = {k: v * float(weights[0]) for k, v in dicts[0].items()}
    for w, d in zip(weights[1:], dicts[1:], strict=True):
        for k in out:
            out[k] = out[k] + d[k] * float(w)
    return out


class FedSoftClient(TypedDict, total=False):
    u: torch.Tensor  # importance weights over the clusters
    omega: torch.Tensor
    params: TensorDict  # its personal model
    buffers: TensorDict


@register
class FedSoft(Personalised, AdaptsTestClients, ClusteredAlgorithm):
    """K centers plus a personal model per client; one model trained per client per round."""

    name = "fedsoft"
    #: the local model and the cluster weights ``u`` are what the client uploads
    shared_state_keys = frozenset({"params", "buffers", "u", "omega"})
    paper = (
        'Ruan & Joe-Wong, "FedSoft: Soft Clustered Federated Learning with '
        'Proximal Local Updating", AAAI 2022'
    )
    Params = FedSoftParams
    ClientState = FedSoftClient
    hp: FedSoftParams

    def task_logit_models(self, server: State) -> list[tuple[TensorDict, TensorDict]]:
        return self.cluster_models(server)  # the importance weights' losses

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        u = importance_weights(self.sample_losses(server, data), self.hp.sigma)
        centers = [m["params"] for m in server["models"]]
        if "params" in client:
            p, b = client["params"], client["buffers"]
        else:
            m = server["models"][int(torch.argmax(u))]
            p, b = m["params"], m["buffers"]
        return LocalTask(
            params=[p],
            buffers=[b],
            extras={"anchor": mix_params(u.tolist(), centers)},
            info={"u": u},
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
        return ce + 0.5 * self.hp.lam * proximal_term(params[0], extras["anchor"])

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        u = task.info["u"]
        return {
            **client,
            "u": u,
            "omega": u,
            "params": result.params[0],
            "buffers": result.buffers[0],
        }

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        return {"u": task.info["u"]}

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        models = server["models"]
        p_avg = [RunningAverage() for _ in models]
        b_avg = [RunningAverage() for _ in models]
        for r in results:
            for k, uk in enumerate(r.upload["u"].tolist()):
                w = uk * r.num_samples
                if w > 0:
                    p_avg[k].add(r.params[0], w)
                    b_avg[k].add(r.buffers[0], w)
        new = [
            {"params": p.result(), "buffers": b.result() if b.sums else {}}
            if p.sums is not None
            else models[k]
            for k, (p, b) in enumerate(zip(p_avg, b_avg, strict=True))
        ]
        return {**server, "models": new}

    def mixture(self, server: State, client: State, data: ClientData):
        if "params" in client:
            return [(1.0, client["params"], client["buffers"])]
        return super().mixture(server, client, data)

    def adapt_test_client(self, server: State, data: ClientData, state: State) -> State:
        return {"omega": one_hot(lowest_loss_cluster(self, server, data), len(server["models"]))}
