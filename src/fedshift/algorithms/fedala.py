"""FedALA (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023): before local training, each client mixes the downloaded global model
into its old local model element-wise, with mixing weights it learns on its own data.

Adaptive Local Aggregation (ALA) of client ``i`` in round ``t``, with ``theta_i`` its old local
model, ``theta`` the global model and ``W_i`` its weights (one per element of the top ``p``
layers, in [0, 1], ones at the start, kept across rounds)::

    theta_hat_i = theta_i + (theta - theta_i) * W_i      on the top p layers
    theta_hat_i = theta                                    on the lower layers
    W_i <- clip_[0,1]( W_i - eta * grad_W CE(theta_hat_i(W_i)) )   per mini-batch of a random s%
                                                                    of the client's data

``theta_hat_i`` (with the learnt ``W_i``) starts the client's local training (the run's SGD on
cross-entropy); the server averages the trained models (FedAvg, ``weighting`` as there); the
trained model is the client's new local model and its personalised model. At the first ALA of
a client ``W_i`` is trained "until convergence"; afterwards one pass over the s% sample per
round.

Hyper-parameters (the paper's names; defaults of the paper and the authors' code,
TsingZ0/FedALA):

- ``eta`` = 1.0: the learning rate of the weights ``W``.
- ``s`` = 80: the percentage of local data of each ALA pass (``rand_percent`` in the code).
- ``p`` = 1: how many top layers (modules with parameters, e.g. the classifier) get learnt
  weights; the paper's default. The code counts parameter tensors instead
  (``layer_idx`` = 2: one layer's weight and bias).
- ``num_pre_loss`` = 10 and ``threshold`` = 0.1: the first ALA of a client repeats passes
  until the standard deviation of the last ``num_pre_loss`` pass losses (each pass's last
  mini-batch loss, as the code records them) is below ``threshold`` (``Phase.stop_std_below``),
  so after at least ``num_pre_loss + 1`` passes; ``max_passes`` (100) bounds it (the code has
  no bound).

How it is expressed as a local task (four models, two stages):

- models ``[theta_i (frozen), theta (frozen), W (the weights of the top p layers), eps]``; the
  effective model is ``ALA(theta_i, theta, W) + eps``; ``eps`` (zeros at the start) is the
  local training's displacement, so SGD on ``eps`` is SGD on the effective model;
- stage 1 trains ``W`` (plain SGD, lr ``eta``, no momentum, weight decay or clipping) for
  ``ceil(s% n / B)`` steps (``B``: the run's batch size), at the client's first ALA up to
  ``max_passes`` times that, stopping at the code's convergence test;
- stage 2 trains ``eps`` for the run's local epochs with the run's SGD. The run's weight decay
  is applied to the effective model (``wd * theta_eff`` added to the gradient through a
  zero-valued loss term; the stage's own weight decay is 0), which is the decay of SGD on the
  model itself; unlike the engine's decay it is inside the gradient clipped by
  ``train.grad_clip`` (identical when clipping is off, the default).
- The upload (what the server averages) and the client's new model are the effective model.

Projected SGD on ``W``: the model holds an unconstrained ``V``; the loss sees ``W = clip(V)``
with the gradient passed straight through, plus a zero-valued term whose gradient is
``(V - clip(V)) / eta``. One SGD step of lr ``eta`` then gives ``V' = clip(V) - eta * g``, so
``clip(V')`` is exactly the code's ``clip(W - eta * g)`` with ``W = clip(V)``.

Choices and differences from the paper and the authors' code:

- ALA is skipped (stage 1 has no steps) while a client has no local model of its own: its old
  model is the global one and ALA would return it unchanged. The code applies ALA to every
  client every round (selected or not) from its second round on, with the clients' untrained
  initial networks as old models where they never trained; here a client's first ALA is at its
  second participation.
- The first ALA's "until convergence" is the code's test, bounded by ``max_passes``.
- The s% sample: the code takes one contiguous slice of ``int(s% n)`` samples, unshuffled; here
  each pass takes the first ``ceil(s% n / B)`` mini-batches of a fresh shuffle of the client's
  data (the whole batches can exceed s% by less than one batch).
- BatchNorm statistics: stage 1 runs on scratch copies (the code's temporary model is
  discarded); local training starts from the client's own statistics (the code never
  overwrites them), the global ones before it has any. The server averages them with the
  parameters (the code's server averages parameters only).
- The code evaluates every client's model right after ALA, before local training; here the
  personalised model is the client's latest trained local model, and a client that never
  trained (and every test-only client) is answered by the global model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from functools import cached_property
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
    RunningAverage,
    State,
    TensorDict,
    keep_shared,
)
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, client_weight
from fedshift.algorithms.registry import register


class FedALAParams(FedAvgParams):
    eta: float = Field(default=1.0, gt=0, description="learning rate of the ALA weights W")
    s: float = Field(
        default=80.0, gt=0, le=100, description="percent of local data in each ALA pass"
    )
    p: int = Field(default=1, ge=1, description="number of top layers with learnt ALA weights")
    num_pre_loss: int = Field(
        default=10,
        ge=1,
        description="the first ALA stops when the last num_pre_loss pass losses vary less "
        "than threshold",
    )
    threshold: float = Field(
        default=0.1, gt=0, description="std of the last num_pre_loss pass losses to stop at"
    )
    max_passes: int = Field(
        default=100,
        ge=1,
        description="the most passes of the first ALA (the code has no bound; ours must)",
    )


class ALAClient(TypedDict, total=False):
    """A client's local (personalised) model and, after its first ALA, its weights W."""

    params: TensorDict
    buffers: TensorDict
    weights: TensorDict


def layer_groups(names: Iterable[str]) -> list[list[str]]:
    """Parameter names grouped by the module that owns them (in order): one group per layer."""
    groups: list[list[str]] = []
    owner = None
    for name in names:
        mod = name.rsplit(".", 1)[0] if "." in name else ""
        if groups and mod == owner:
            groups[-1].append(name)
        else:
            groups.append([name])
            owner = mod
    return groups


def top_layer_names(names: Iterable[str], p: int) -> tuple[str, ...]:
    """The parameter names of the top ``p`` layers."""
    return tuple(n for group in layer_groups(names)[-p:] for n in group)


def ala_combine(local: TensorDict, glob: TensorDict, weights: TensorDict) -> TensorDict:
    """``theta_hat``: ``local + (glob - local) * W`` where ``weights`` has an entry (the top
    layers), the global tensor elsewhere."""
    return {
        k: (local[k] + (g - local[k]) * weights[k]) if k in weights else g for k, g in glob.items()
    }


def clip_straight_through(v: torch.Tensor) -> torch.Tensor:
    """``clip(v, 0, 1)`` in value, the identity in gradient."""
    return v + (v.clamp(0.0, 1.0) - v).detach()


def projection_term(v: torch.Tensor, eta: float) -> torch.Tensor:
    """Zero in value, gradient ``(v - clip(v, 0, 1)) / eta``: with the straight-through clip,
    one SGD step of lr ``eta`` on ``v`` lands on ``clip(v) - eta * grad``."""
    return ((v - v.clamp(0.0, 1.0)).detach() * (v - v.detach())).sum() / eta


def effective_params(params: list[TensorDict]) -> TensorDict:
    """The model a task's models stand for: ``ALA(theta_i, theta, clip(W)) + eps``."""
    local, glob, weights, eps = params
    hat = ala_combine(local, glob, {k: w.clamp(0.0, 1.0) for k, w in weights.items()})
    return {k: v + eps[k] for k, v in hat.items()}


@register
class FedALA(Personalised, FedAvg):
    """Adaptive local aggregation of the global model into the old local model, then FedAvg."""

    name = "fedala"
    #: the effective local model is the client's upload
    shared_state_keys = frozenset({"params", "buffers"})
    paper = (
        'Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated '
        'Learning", AAAI 2023'
    )
    Params = FedALAParams
    ClientState = ALAClient
    hp: FedALAParams

    @cached_property
    def ala_names(self) -> tuple[str, ...]:
        """The parameters with learnt weights (the top ``p`` layers)."""
        return top_layer_names([n for n, _ in self.ops.module.named_parameters()], self.hp.p)

    def pass_steps(self, n: int) -> int:
        """Steps of one ALA pass over ``s``% of a client's ``n`` samples (0 without data)."""
        if n <= 0:
            return 0
        return max(1, math.ceil(int(self.hp.s / 100 * n) / self.train_defaults.batch_size))

    def ala_phase(self, n: int, first: bool) -> Phase:
        """Stage 1: one pass, or at a client's first ALA passes until the last
        ``num_pre_loss`` pass losses have a standard deviation below ``threshold`` (at most
        ``max_passes``)."""
        per_pass = self.pass_steps(n)
        stop = {}
        if first and per_pass:
            stop = {"stop_std_below": self.hp.threshold, "stop_window": self.hp.num_pre_loss}
            stop["pass_steps"] = per_pass
        steps = per_pass * (self.hp.max_passes if first else 1)
        ala = dict(lr=self.hp.eta, momentum=0.0, weight_decay=0.0, clip=False)
        return Phase(loss="ala_loss", trainable=((2, None),), steps=steps, **ala, **stop)

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        glob, gbuf = server["params"], server["buffers"]
        own = client.get("params")
        ala = own is not None  # before the client has a model of its own, ALA is the identity
        local = own if ala else glob
        buffers = client.get("buffers", gbuf)
        weights = client.get("weights")
        first = weights is None
        if first:
            weights = {k: torch.ones_like(glob[k]) for k in self.ala_names}
        return LocalTask(
            params=[local, glob, weights, {k: torch.zeros_like(v) for k, v in glob.items()}],
            buffers=[{}, {}, {}, buffers],
            info={"ala": ala},
            phases=(
                self.ala_phase(data.num_train if ala else 0, first),
                Phase(loss="local_loss", trainable=((3, None),), weight_decay=0.0),
            ),
        )

    def ala_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """Stage 1: CE of ``theta_hat(W)`` (W clipped, gradient passed through) plus the
        projection term of every weight tensor."""
        local, glob, v = params[0], params[1], params[2]
        hat = ala_combine(local, glob, {k: clip_straight_through(t) for k, t in v.items()})
        scratch = {k: b.clone() for k, b in buffers[3].items()}  # statistics not kept
        logits = self.ops.forward(hat, scratch, batch.x)
        ce = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        return ce + sum(projection_term(t, self.hp.eta) for t in v.values())

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """Stage 2: CE of the effective model, plus the run's weight decay on it (zero in
        value, gradient ``wd * theta_eff`` on ``eps``)."""
        theta = effective_params(params)
        logits = self.ops.forward(theta, buffers[3], batch.x)
        ce = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        wd = self.train_defaults.weight_decay
        if not wd:
            return ce
        eps = params[3]
        decay = sum((theta[k].detach() * (e - e.detach())).sum() for k, e in eps.items())
        return ce + wd * decay

    def local_model(self, result: ClientResult) -> tuple[TensorDict, TensorDict]:
        return effective_params(result.params), result.buffers[3]

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """Only the effective local model leaves the client (its ALA weights stay)."""
        return replace(
            keep_shared(result),
            params=[effective_params(result.params)],
            buffers=[result.buffers[3]],
        )

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        new = {"params": effective_params(result.params), "buffers": result.buffers[3]}
        if task.info["ala"]:
            new["weights"] = {k: w.clamp(0.0, 1.0) for k, w in result.params[2].items()}
        return new

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        params, buffers = RunningAverage(), RunningAverage()
        for r in results:
            w = client_weight(r, self.hp.weighting)
            if w > 0:
                params.add(r.params[0], w)  # the effective model (shared_result)
                buffers.add(r.buffers[0], w)
        if params.sums is None:
            return server
        return {
            **server,
            "params": params.result(),
            "buffers": buffers.result() if buffers.sums else {},
        }

    def mixture(self, server: State, client: State, data: ClientData):
        return self.own_mixture(server, client, data)
