"""Adaptive-FedAvg (A-FedAvg; Canonaco et al., IJCNN 2021), as FedDAA compares against it:
FedAvg whose clients' learning rate the server adapts from the drift of the global model.

After each round the server flattens the global model w_t (every float tensor) and keeps
exponential moving averages of its mean and of its variance around the previous mean, both
bias-corrected; the ratio r_t of the current variance to the previous one (1 in the first two
rounds) is smoothed too, and the next round's clients train with lr = min(lr0, lr0 * EMA(r)):
when the model starts moving again (drift), its variance grows and the lr climbs back to lr0.
Constants of the FedDAA code's ``LearningRateUpdater``: β1 = β2 = β3 = 0.5, lr0 = the run's
``train.lr``; as there, the stored mean is the bias-corrected one.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from pydantic import Field

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    Phase,
    RoundContext,
    State,
    as_float,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import GlobalModel


class AFedAvgParams(FedAvgParams):
    beta1: float = Field(default=0.5, ge=0, lt=1, description="EMA of the parameter mean")
    beta2: float = Field(default=0.5, ge=0, lt=1, description="EMA of the parameter variance")
    beta3: float = Field(default=0.5, ge=0, lt=1, description="EMA of the variance ratio")


def adaptive_lr(state: dict, w: torch.Tensor, lr0: float, b1: float, b2: float, b3: float):
    """One server update of the learning-rate state (``state``: ``t``, ``mean``, ``var``,
    ``coeff``; empty at first) from the flattened new global model ``w``: (lr, new state)."""
    t = state.get("t", 0)
    prev_mean = state.get("mean", torch.zeros_like(w))
    prev_var = state.get("var", 0.0)
    mean = (b1 * prev_mean + (1 - b1) * w) / (1 - b1 ** (t + 1))
    var = b2 * prev_var + (1 - b2) * float(((w - prev_mean) ** 2).mean())
    var_hat = var / (1 - b2 ** (t + 1))
    r = 1.0 if t < 2 else abs(var_hat / (prev_var / (1 - b2**t)))
    coeff = b3 * state.get("coeff", 0.0) + (1 - b3) * r
    lr = min(lr0, lr0 * coeff / (1 - b3 ** (t + 1)))
    return lr, {"t": t + 1, "mean": mean, "var": var, "coeff": coeff}


class AFedAvgServer(GlobalModel, total=False):
    lr: float  # the adaptive server lr, from the first aggregation on
    lr_state: dict


@register
class AFedAvg(FedAvg):
    """FedAvg with a server-adapted client learning rate."""

    name = "afedavg"
    paper = (
        'Canonaco et al., "Adaptive Federated Learning in Presence of Concept Drift", IJCNN 2021'
    )
    Params = AFedAvgParams
    ServerState = AFedAvgServer
    hp: AFedAvgParams

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        lr = server.get("lr", self.train_defaults.lr)
        return LocalTask(
            params=[server["params"]], buffers=[server["buffers"]], phases=(Phase(lr=lr),)
        )

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        new = super().aggregate(server, results, ctx)
        if new is server:
            return server
        tensors = [*new["params"].values(), *new["buffers"].values()]
        flat = torch.cat([as_float(t.detach()).flatten() for t in tensors if t.is_floating_point()])
        hp = self.hp
        lr, lr_state = adaptive_lr(
            server.get("lr_state", {}), flat, self.train_defaults.lr, hp.beta1, hp.beta2, hp.beta3
        )
        return {**new, "lr": lr, "lr_state": lr_state}
