"""Ditto (Li, Hu, Beirami & Smith, ICML 2021), as run by the FedNH paper's code.

Each sampled client trains two models in two stages of one local task:

1. *Global copy* ``w`` (model 0): the run's local epochs of FedAvg-style SGD (the run's
   momentum and weight decay) on plain cross-entropy, starting from the global model.
2. *Personal model* ``v_k`` (model 1): ``personal_epochs`` epochs of plain SGD (no momentum, no
   weight decay, the round's lr) on ``CE(v) + (lam/2)·||v − w_k||²``, where ``w_k`` is the
   client's **locally updated** global copy from stage 1 (frozen in stage 2), i.e. the update
   ``v ← v − lr·(∇CE(v) + lam·(v − w_k))``.

The server averages the global copies exactly as FedAvg does (so the global model, and GM,
equal FedAvg's for the same seed: stage 1 draws the same mini-batches first). ``v_k`` persists
in the client state across rounds and is updated only when the client is sampled; it starts
from the common initial model.

Choices and differences from the paper / the FedNH code:

- ``init_server_state`` receives two fresh inits (``num_initial_models() = 2``); only ``init[0]`` is
  used, both as the global model and as every client's initial ``v_k`` (the code deep-copies the
  client's initial model into its personal model).
- Gradient clipping (``train.grad_clip``) applies in stage 2 to the whole gradient
  ``∇CE + lam·(v − w_k)``; the code clips ``∇CE`` alone and adds the proximal pull afterwards
  (its ``DittoOptimizer``). Identical when the clip is inactive.
- PM is ``v_k``; a client that has not trained yet (and every test-only client) is answered by
  the global model.
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
from fedshift.algorithms.fedprox import proximal_term
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import OwnModel, SharedInit


class DittoParams(FedAvgParams):
    lam: float = Field(
        default=0.75, ge=0, description="proximal coefficient lambda of the personal objective"
    )
    personal_epochs: int | None = Field(
        default=None, ge=1, description="epochs of the personal model (None: train.local_epochs)"
    )


def ditto_personal_loss(
    ce: torch.Tensor, personal: TensorDict, global_copy: TensorDict, lam: float
) -> torch.Tensor:
    """Ditto's personal objective ``CE(v) + (lam/2)·||v − w||²`` (``w`` treated as constant)."""
    anchor = {k: v.detach() for k, v in global_copy.items()}
    return ce + 0.5 * lam * proximal_term(personal, anchor)


@register
class Ditto(Personalised, FedAvg):
    """FedAvg for the global model plus a proximally regularised personal model per client.

    Server state: FedAvg's ``params``/``buffers`` plus ``init_params``/``init_buffers`` (the
    start of every ``v_k``). Client state: ``params``/``buffers`` of ``v_k`` once trained.
    """

    name = "ditto"
    paper = (
        'Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning '
        'Through Personalization", ICML 2021'
    )
    Params = DittoParams
    ServerState = SharedInit
    ClientState = OwnModel

    def num_initial_models(self) -> int:
        return 2

    def init_server_state(self, init):
        params, buffers = init[0]  # init[1] is unused: v_k starts from the global init
        return {
            "params": params,
            "buffers": buffers,
            "init_params": clone_params(params),
            "init_buffers": clone_params(buffers),
        }

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        v, vb = own_model(client, (server["init_params"], server["init_buffers"]))
        return LocalTask(
            params=[server["params"], v],
            buffers=[server["buffers"], vb],
            phases=(
                Phase(loss="local_loss", trainable=((0, None),)),
                Phase(
                    loss="personal_loss",
                    trainable=((1, None),),
                    epochs=self.hp.personal_epochs,
                    momentum=0.0,
                    weight_decay=0.0,
                ),
            ),
        )

    def personal_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """Stage 2: the personal model's CE plus the pull towards the updated global copy."""
        logits = self.ops.forward(params[1], buffers[1], batch.x)
        ce = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        return ditto_personal_loss(ce, params[1], params[0], self.hp.lam)

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """The personal model ``v_k`` (model 1) stays on the client."""
        return keep_shared(result, private=(1,))

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {"params": result.params[1], "buffers": result.buffers[1]}

    def mixture(self, server: State, client: State, data: ClientData):
        return self.own_mixture(server, client, data)
