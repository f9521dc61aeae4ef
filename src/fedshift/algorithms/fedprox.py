"""FedProx (Li et al., 2020): FedAvg plus a proximal term (mu/2)·||w - w_global||² locally."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register


def proximal_term(params: TensorDict, anchor: TensorDict) -> torch.Tensor:
    """Sum over tensors of the squared L2 distance between ``params`` and ``anchor``."""
    return sum(((params[k] - anchor[k]) ** 2).sum() for k in anchor)  # type: ignore[return-value]


class FedProxParams(FedAvgParams):
    mu: float = Field(default=0.01, ge=0, description="proximal coefficient")


@register
class FedProx(FedAvg):
    """FedAvg whose local loss adds (mu/2)·||w - w_global||² (anchor = the round's global model)."""

    name = "fedprox"
    paper = 'Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020'
    Params = FedProxParams

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        task = super().client_task(server, client, data, ctx)
        task.extras["anchor"] = server["params"]
        return task

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        logits = self.ops.forward(params[0], buffers[0], batch.x)
        ce = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        return ce + 0.5 * self.hp.mu * proximal_term(params[0], extras["anchor"])
