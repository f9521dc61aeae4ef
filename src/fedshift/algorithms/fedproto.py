"""FedProto (Tan et al., AAAI 2022), as the FedNH paper ran it: clients share class prototypes
(mean body features), never models.

Every client keeps its own full model (body + head) for ever, starting from the common
initialisation; there is no model aggregation at all. The server holds one global prototype per
class, ``[C, d]``, initialised uniform in [0, 1) (``torch.rand``, as the code does, so the
prototype term is active from round 1). A client's local loss is

    CE(head(f(x)), y) + lam * mean_d (f(x) - P[y])^2,

averaged over the batch (``nn.MSELoss()`` over batch x d, the code), with ``P`` the round's
global prototypes. After local training the client uploads its local prototypes, the per-class
mean of its unnormalised body features. The server replaces the prototype of each class by the
**unweighted** mean of the uploads of the participating clients that own the class; classes no
participant owns keep their value.

Prediction (PM, and local accuracy): the class of the global prototype nearest (L2) to the
client's body features, as the code scores FedProto; ``pm_classifier="head"`` uses the client's
own head instead. The prototypes are those the client **received** in its latest round (kept in
its state), not the ones the server aggregated from that round's uploads: a client's personal
classifier is what it holds, as in the code, where a client is scored in its round with the
prototypes sent to it. Probabilities are one-hot (a hard classifier), so the evaluation's train loss
is the eps-clamped NLL of hard predictions, proportional to the train error.

Choices where this differs from the code or the spec:

- *Local prototypes* are computed after local training, in eval mode, over the whole train
  split with the trained model. The code collects the features of the last local epoch while
  training (train mode, features of a model that changes during the epoch). Computing them
  afterwards keeps the local loss pure (both executors run it) and gives prototypes of the model
  the client actually keeps.
- *No global model.* FedProto has none (the paper reports "—"), so ``global_model`` is None and
  GM is absent. Test-only clients have no model of their own either: they predict uniform
  probabilities, so their ``global_acc`` is chance level (the arg-max of a uniform row is class
  0). The code's "global" score uses the untrained initial body with the global prototypes; a
  number from a model nobody trained, or from an average of models that were never meant to be
  averaged, would look like a result, whereas chance level reads as "no global model".
- The initial prototypes are drawn from a generator seeded by the run seed (the code uses the
  global torch seed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypedDict

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Algorithm,
    Batch,
    ClientData,
    ClientResult,
    HyperParams,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
    as_float,
    keep_shared,
    softmax_probs,
)
from fedshift.algorithms.capabilities import Personalised, own_model
from fedshift.algorithms.registry import register
from fedshift.core.seeds import PROTO_STREAM, derive_seed


class FedProtoParams(HyperParams):
    lam: float = Field(default=0.1, ge=0, description="weight of the prototype MSE term")
    pm_classifier: Literal["prototype", "head"] = Field(
        default="prototype",
        description="personal prediction: nearest global prototype (the code) or the local head",
    )


# ---------------------------------------------------------------------- pure math


def init_prototypes(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    """Initial global prototypes [C, d], uniform in [0, 1) from a generator seeded by ``seed``."""
    gen = torch.Generator().manual_seed(derive_seed(PROTO_STREAM, seed))
    return torch.rand(num_classes, dim, generator=gen)


def prototype_mse(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample mean over d of the squared difference [n] (averaged over the batch this is
    ``nn.MSELoss()``)."""
    return (features - targets).pow(2).mean(dim=-1)


def class_means(
    features: torch.Tensor, y: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of ``features`` [n, d] and the class counts [C] (rows of absent classes
    are zero)."""
    counts = torch.bincount(y, minlength=num_classes).to(features.dtype)
    sums = features.new_zeros(num_classes, features.shape[1]).index_add_(0, y, features)
    return sums / counts.clamp_min(1).unsqueeze(1), counts


def aggregate_prototypes(
    old: torch.Tensor, uploads: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """New global prototypes [C, d] from the clients' (local prototypes [C, d], counts [C]).

    Class c becomes the unweighted mean of the local prototypes of the clients with a positive
    count for c; classes no client owns keep their ``old`` row. ``uploads`` is iterated once.
    """
    sums = torch.zeros_like(old)
    owners = old.new_zeros(old.shape[0])
    for protos, counts in uploads:
        owned = (counts > 0).to(old.dtype)
        sums += protos.to(old) * owned.unsqueeze(1)
        owners += owned
    mean = sums / owners.clamp_min(1).unsqueeze(1)
    return torch.where(owners.unsqueeze(1) > 0, mean, old)


def nearest_prototype(features: torch.Tensor, protos: torch.Tensor) -> torch.Tensor:
    """The class of the prototype nearest in L2 distance to each row of ``features`` [n]."""
    return torch.cdist(features, protos, p=2.0).argmin(dim=1)


# ---------------------------------------------------------------------- the algorithm


class FedProtoServer(TypedDict):
    protos: torch.Tensor
    init_params: TensorDict
    init_buffers: TensorDict


class FedProtoClient(TypedDict, total=False):
    params: TensorDict
    buffers: TensorDict
    protos: torch.Tensor  # the global prototypes it last received


@register
class FedProto(Personalised, Algorithm):
    """Own full model per client; the server aggregates class prototypes only."""

    name = "fedproto"
    paper = (
        'Tan et al., "FedProto: Federated Prototype Learning across '
        'Heterogeneous Clients", AAAI 2022'
    )
    Params = FedProtoParams
    ServerState = FedProtoServer
    ClientState = FedProtoClient

    def init_server_state(self, init):
        params, buffers = init[0]
        dim = int(self.ops.module.feature_dim)
        protos = init_prototypes(self.num_classes, dim, self.seed)
        device = next(iter(params.values())).device
        return {"protos": protos.to(device), "init_params": params, "init_buffers": buffers}

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        p, b = own_model(client, (server["init_params"], server["init_buffers"]))
        return LocalTask(params=[p], buffers=[b], extras={"protos": server["protos"]})

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        feats, logits = self.ops.forward(params[0], buffers[0], batch.x, features=True)
        ce = F.cross_entropy(logits, batch.y, reduction="none")
        mse = prototype_mse(feats, extras["protos"][batch.y])
        return batch.mean(ce + self.hp.lam * mse)

    @torch.no_grad()
    def features(
        self, params: TensorDict, buffers: TensorDict, data: ClientData, idx: torch.Tensor
    ) -> torch.Tensor:
        """Eval-mode body features [n, d] of pool indices ``idx``."""
        module = self.ops.module
        was = module.training
        module.eval()
        step = data.eval_batch
        try:
            outs = [
                self.ops.forward(params, buffers, data.inputs(idx[i : i + step]), True)[0]
                for i in range(0, len(idx), step)
            ]
        finally:
            module.train(was)
        if not outs:
            return torch.zeros(0, int(module.feature_dim), device=idx.device)
        return torch.cat(outs)

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        feats = self.features(params[0], buffers[0], data, data.train_idx)
        protos, counts = class_means(feats, data.y_train.to(feats.device), self.num_classes)
        return {"protos": protos, "proto_counts": counts}

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """Only the prototypes (the upload) leave the client; its model stays."""
        return keep_shared(result, private=(0,))

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        # ``server`` is the round's start state: these are the prototypes the client received
        return {
            "params": result.params[0],
            "buffers": result.buffers[0],
            "protos": server["protos"],
        }

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        uploads = ((r.upload["protos"], r.upload["proto_counts"]) for r in results)
        return {**server, "protos": aggregate_prototypes(server["protos"], uploads)}

    # ------------------------------------------------------------------ prediction
    def predict(
        self, server: State, client: State, data: ClientData, idx: torch.Tensor
    ) -> torch.Tensor:
        if data.test_only:  # no model: chance level (see the module docstring)
            return torch.full(
                (len(idx), self.num_classes), 1.0 / self.num_classes, device=idx.device
            )
        p, b = own_model(client, (server["init_params"], server["init_buffers"]))
        if self.hp.pm_classifier == "head":
            return softmax_probs(self.ops.logits(p, b, data.inputs, idx, data.eval_batch))
        protos = client.get("protos", server["protos"])  # received; never trained: current
        labels = nearest_prototype(self.features(p, b, data, idx), protos)
        return as_float(F.one_hot(labels, self.num_classes))

    def global_model(self, server: State):
        return None
