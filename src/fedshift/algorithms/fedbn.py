"""FedBN (Li, Jiang, Zhang, Kamp & Dou, ICLR 2021): FedAvg with local BatchNorm layers.

Every BatchNorm layer's affine parameters (weight, bias) and running statistics (running mean
and variance, ``num_batches_tracked``) stay with their client; the server averages every other
parameter and buffer, as FedAvg does. Choices, and how they relate to the paper and its code
(``med-air/FedBN``):

- BN layers are found by module type (every ``nn.modules.batchnorm._BatchNorm``, fedshift's own
  vmap-safe ``BatchNorm2d`` included) in the run's model, never by name patterns.
- A client starts each round from the global non-BN parameters and its own BN state; before it
  first trains, its BN state is the initial one (the code's clients all start from the same
  initial model). Its model is scored with the same combination of its latest BN state.
- Clients that never trained, and test-only clients, are answered by the global parameters
  with the initial BN state (the paper does not treat unseen clients). ``global_model`` returns
  that same model, so GM-style metrics measure what an unseen client gets; it is not a model
  any trained client uses.
- Client weights of the average: ``weighting`` as FedAvg's, default ``"uniform"``, what the
  FedBN code does (``client_weights = 1 / client_num``) and spec dfl.md §4 recommends;
  ``"samples"`` gives FedAvg's sample weighting.

Server state: ``params``/``buffers`` of the whole model, whose BN entries stay the initial ones
(never averaged). Client state: ``bn_params``/``bn_buffers`` once the client has trained.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from typing import Literal, TypedDict

from pydantic import Field
from torch import nn

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    RunningAverage,
    State,
    TensorDict,
    keep_shared,
)
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, client_weight
from fedshift.algorithms.registry import register


class FedBNParams(FedAvgParams):
    weighting: Literal["samples", "uniform"] = Field(
        default="uniform",
        description="client weights of the server average (uniform: the FedBN code)",
    )


def batchnorm_names(module: nn.Module) -> frozenset[str]:
    """Names (as in ``module.named_parameters()``/``named_buffers()``) of every parameter and
    buffer of the BatchNorm layers of ``module``, found by type."""
    out: set[str] = set()
    for prefix, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            tensors = [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]
            out.update(f"{prefix}.{n}" if prefix else n for n, _ in tensors)
    return frozenset(out)


def split(tensors: TensorDict, names: frozenset[str]) -> tuple[TensorDict, TensorDict]:
    """``(entries in names, the others)`` of a tensor dict."""
    inside = {k: v for k, v in tensors.items() if k in names}
    return inside, {k: v for k, v in tensors.items() if k not in names}


class FedBNClient(TypedDict, total=False):
    bn_params: TensorDict  # the client's own normalisation layers
    bn_buffers: TensorDict


@register
class FedBN(Personalised, FedAvg):
    """The server averages all but the BatchNorm layers; each client keeps its own."""

    name = "fedbn"
    paper = (
        'Li et al., "FedBN: Federated Learning on Non-IID Features via Local '
        'Batch Normalization", ICLR 2021'
    )
    ClientState = FedBNClient
    premise = "feature_skew"
    Params = FedBNParams

    @cached_property
    def bn_names(self) -> frozenset[str]:
        """Parameter and buffer names of the model's BatchNorm layers (kept local)."""
        return batchnorm_names(self.ops.module)

    @property
    def averaged_names(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.ops.module.named_parameters()) - self.bn_names

    def _model(self, server: State, client: State) -> tuple[TensorDict, TensorDict]:
        """Global non-BN parameters with the client's BN state (the server's BN entries, the
        initial ones, for a client that has not trained)."""
        return (
            {**server["params"], **client.get("bn_params", {})},
            {**server["buffers"], **client.get("bn_buffers", {})},
        )

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        params, buffers = self._model(server, client)
        return LocalTask(params=[params], buffers=[buffers])

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        """Weighted average of the non-BN parameters and buffers (streamed, one pass); the
        server's BN entries are left as they are."""
        params, buffers = RunningAverage(), RunningAverage()
        for r in results:
            w = client_weight(r, self.hp.weighting)
            if w > 0:
                params.add(split(r.params[0], self.bn_names)[1], w)
                buffers.add(split(r.buffers[0], self.bn_names)[1], w)
        if params.sums is None:
            return server
        return {
            **server,
            "params": {**server["params"], **params.result()},
            "buffers": {**server["buffers"], **(buffers.result() if buffers.sums else {})},
        }

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """The BatchNorm parameters and statistics stay on the client."""

        def shared(m: TensorDict) -> frozenset[str]:
            return frozenset(n for n in m if n not in self.bn_names)

        return keep_shared(
            result,
            names={0: shared(result.params[0])},
            buffer_names={0: shared(result.buffers[0])},
        )

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        if result.num_samples <= 0:  # nothing was trained: the BN state is unchanged
            return client
        return {
            "bn_params": split(result.params[0], self.bn_names)[0],
            "bn_buffers": split(result.buffers[0], self.bn_names)[0],
        }

    def mixture(self, server: State, client: State, data: ClientData):
        return [(1.0, *self._model(server, {} if data.test_only else client))]

    def global_model(self, server: State):
        return self._model(server, {})
