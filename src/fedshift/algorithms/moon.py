"""MOON (Li, He & Song, "Model-Contrastive Federated Learning", CVPR 2021): FedAvg whose local
loss adds a contrastive term on representations, pulling the local model's representation
towards the global model's and away from the client's previous local model's.

In round ``t`` a sampled client ``i`` trains ``w`` from the global model ``w^t`` on::

    L(w) = CE(w) + mu * l_con
    l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )

per sample, averaged over the mini-batch, with ``sim`` the cosine similarity and ``z``,
``z_glob``, ``z_prev`` the representations of the sample by the model being trained, by the
round's global model ``w^t`` (frozen) and by the client's previous local model ``w_i^{t-1}``
(frozen; the client state). The server averages the trained models as FedAvg does
(``weighting`` as in FedAvg); the client keeps its trained model as its next ``w_i^{t-1}``.

Hyper-parameters (the paper's names and values):

- ``mu`` = 1: the paper's value for CIFAR-100 and Tiny-ImageNet and the default of the
  authors' code (``--mu``); the paper uses 5 on CIFAR-10 (the README's example), and the
  authors advise tuning it in {0.001, 0.01, 0.1, 1, 5, 10} on other settings. On the
  conformance harness's tiny IID scenario (8 rounds, a 32-wide MLP) ``mu`` = 5 stalls at 44%
  against FedAvg's 68% (``mu`` = 1: 66%).
- ``tau`` = 0.5: the temperature of the paper and of the authors' code.

Choices and differences from the paper and the authors' code (QinbinLi/MOON):

- Representation: ``z`` is the output of the configured network's body, the input of its
  classifier (``ops.forward(..., features=True)``). The authors' network appends a projection
  head (Linear-ReLU-Linear, output 256) to the base encoder and puts the classifier on top of
  its output, so their ``z`` is likewise the classifier's input; here no projection layers are
  added, so MOON trains the same network as every other method of the run.
- The frozen models (global and previous) are run in eval mode (BatchNorm running statistics,
  no dropout), as the authors' code runs them; the trained model runs in train mode.
- Before a client has trained, its previous model is the global model. Then ``z_prev = z_glob``
  and ``l_con`` is the constant ``log 2`` with zero gradient: the client trains on plain
  cross-entropy. The authors' code has an empty model pool in its first round (no contrastive
  term, the same training); a party first sampled later is contrasted there with its own
  randomly initialised network.
- One previous model (the authors' default ``model_buffer_size`` = 1).
- Local training is the run's SGD (the authors use SGD with momentum 0.9 and weight decay
  1e-5: the run's settings, not the method's).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

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
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register


class MOONParams(FedAvgParams):
    mu: float = Field(
        default=1.0,
        ge=0,
        description="weight of the model-contrastive loss (paper: 5 on CIFAR-10, 1 on CIFAR-100)",
    )
    tau: float = Field(default=0.5, gt=0, description="temperature of the contrastive loss")


class PreviousModel(TypedDict, total=False):
    """A client's latest local model (its previous model in the next round it trains)."""

    params: TensorDict
    buffers: TensorDict


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float
) -> torch.Tensor:
    """MOON's ``l_con`` per sample: cross-entropy of the logits ``[sim(z, z_glob), sim(z,
    z_prev)] / tau`` with the global model's representation as the positive (index 0)."""
    pos = F.cosine_similarity(z, z_glob, dim=-1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=-1) / tau
    return torch.logsumexp(torch.stack([pos, neg], dim=-1), dim=-1) - pos


@register
class MOON(FedAvg):
    """FedAvg with the model-contrastive term; clients keep their latest local model."""

    name = "moon"
    #: the previous local model is the client's last upload
    shared_state_keys = frozenset({"params", "buffers"})
    paper = 'Li et al., "Model-Contrastive Federated Learning", CVPR 2021'
    premise = "iid"
    Params = MOONParams
    ClientState = PreviousModel
    hp: MOONParams

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        glob, gbuf = server["params"], server["buffers"]
        prev, pbuf = client.get("params", glob), client.get("buffers", gbuf)
        return LocalTask(
            params=[glob, glob, prev],
            buffers=[gbuf, gbuf, pbuf],
            phases=(Phase(trainable=((0, None),)),),
        )

    @contextmanager
    def _eval_mode(self) -> Iterator[None]:
        module = self.ops.module
        was = module.training
        module.eval()
        try:
            yield
        finally:
            module.train(was)

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        z, logits = self.ops.forward(params[0], buffers[0], batch.x, features=True)
        with self._eval_mode():
            z_glob = self.ops.forward(params[1], buffers[1], batch.x, features=True)[0]
            z_prev = self.ops.forward(params[2], buffers[2], batch.x, features=True)[0]
        ce = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        con = model_contrastive_loss(z, z_glob.detach(), z_prev.detach(), self.hp.tau)
        return ce + self.hp.mu * batch.mean(con)

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {"params": result.params[0], "buffers": result.buffers[0]}
