"""Flash (Panchal et al., ICML 2023), as FedDAA compares against it: one global model trained
with client-side early stopping and a server-side adaptive optimiser whose third moment reacts
to drift (spec feddaa.md §4; constants of the FedDAA code's ``average_learners_for_FLASH``).

Server, per parameter tensor, with Δ the mean client update (the average model minus the
global one; unweighted, as the code: ``weighting="uniform"``), in the first round
m = Δ, v = Δ², d = 0, and after it

    m = β1 m + (1-β1) Δ,  v' = β2 v + (1-β2) Δ²,
    β3 = ‖v‖ / (‖Δ² - v'‖ + ‖v‖),  d = β3 d + (1-β3)(Δ² - v'),

then w <- w + η m / (√v' - d + τ); normalisation-layer parameters take w <- w + m, and buffers
(e.g. BatchNorm statistics) the plain average. β1 = β2 = 0.5 and τ = 1e-9 as in the code; the
code's η = 1 moves every coordinate by about ±1 per round (m / √v is scale-free, as in Adam)
and diverges at once, and FedDAA never ran that driver (it is not in its repository), so η
defaults to 0.01 (FedAdam's usual server lr; Flash's paper tunes it). The code's mean update
skips the first client by an indexing slip; here every client counts. Clients stop a round's local epochs early when their epoch loss fell by less than
``early_stop`` (the code's criterion is not published; with one local epoch, FedDAA's setting,
no client ever stops).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    ModelOps,
    Phase,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, average_models
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import GlobalModel


class FlashParams(FedAvgParams):
    weighting: Literal["samples", "uniform"] = Field(default="uniform")
    beta1: float = Field(default=0.5, ge=0, lt=1)
    beta2: float = Field(default=0.5, ge=0, lt=1)
    server_lr: float = Field(default=0.01, gt=0, description="η of the server step")
    tau: float = Field(default=1e-9, gt=0)
    early_stop: float | None = Field(
        default=0.0, ge=0, description="stop local epochs when the loss fell by less (None: off)"
    )


def flash_step(
    w: torch.Tensor,
    delta: torch.Tensor,
    m: torch.Tensor | None,
    v: torch.Tensor | None,
    d: torch.Tensor | None,
    hp: FlashParams,
    norm_layer: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One parameter tensor's server update: (new w, m, v, d); ``m`` None is the first round."""
    sq = delta * delta
    if m is None:
        m_new, v_new, d_new = delta, sq, sq - sq
    else:
        m_new = hp.beta1 * m + (1 - hp.beta1) * delta
        v_new = hp.beta2 * v + (1 - hp.beta2) * sq
        v_norm = torch.linalg.vector_norm(v)
        beta3 = v_norm / (torch.linalg.vector_norm(sq - v_new) + v_norm).clamp_min(1e-30)
        d_new = beta3 * d + (1 - beta3) * (sq - v_new)
    if norm_layer:
        return w + m_new, m_new, v_new, d_new
    return w + hp.server_lr * m_new / (v_new.sqrt() - d_new + hp.tau), m_new, v_new, d_new


class FlashServer(GlobalModel, total=False):
    flash: dict  # the server optimiser's moments, from the first aggregation on


@register
class Flash(FedAvg):
    """FedAvg clients (with early stopping) and Flash's adaptive server step."""

    name = "flash"
    paper = 'Panchal et al., "Flash: Concept Drift Adaptation in Federated Learning", ICML 2023'
    Params = FlashParams
    ServerState = FlashServer
    hp: FlashParams

    def __init__(self, hp: FlashParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)
        norms = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)
        self.norm_params = {
            f"{mod}.{p}" if mod else p
            for mod, layer in ops.module.named_modules()
            if isinstance(layer, norms)
            for p, _ in layer.named_parameters(recurse=False)
        }

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        phases = (Phase(stop_below=self.hp.early_stop),)
        return LocalTask(params=[server["params"]], buffers=[server["buffers"]], phases=phases)

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        avg = average_models(server, results, self.hp.weighting)
        if avg is server:
            return server
        moments = server.get("flash")
        params: TensorDict = {}
        new_moments = {}
        for k, w in server["params"].items():
            delta = avg["params"][k] - w
            m, v, d = moments[k] if moments else (None, None, None)
            params[k], *new_moments[k] = flash_step(
                w, delta, m, v, d, self.hp, k in self.norm_params
            )
        return {**avg, "params": params, "flash": new_moments}
