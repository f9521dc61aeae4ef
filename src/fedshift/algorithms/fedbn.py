"""FedBN (Li, Jiang, Zhang, Kamp & Dou, ICLR 2021): FedAvg with local BatchNorm layers.

Every BatchNorm layer (affine weight and bias, running mean and variance, batch counter) stays
with its client; the server averages every other parameter. A client starts a round from the
global non-BN parameters and its own BN state (the initial one before it first trains) and is
scored with that same combination of its latest round. A client that never trained (and a
test-only client) is answered by the global parameters with the initial BN state; that model
is also what ``global_model`` returns. Client weights: ``weighting`` as FedAvg's; the FedBN
code averages uniformly, the DFL paper's baselines share FedAvg's sample weights (the default).
BN layers are found by type (every ``_BatchNorm``, fedshift's own included), not by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

from torch import nn

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    Params,
    RoundContext,
    State,
)
from fedshift.algorithms.fedavg import FedAvg, average_models
from fedshift.algorithms.registry import register


def batchnorm_names(module: nn.Module) -> frozenset[str]:
    """Names of every parameter and buffer of the BatchNorm layers of ``module``."""
    out = set()
    for prefix, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            out.update(f"{prefix}.{n}" if prefix else n for n, _ in m.named_parameters())
            out.update(f"{prefix}.{n}" if prefix else n for n, _ in m.named_buffers())
    return frozenset(out)


def local_part(state: Params, names: frozenset[str]) -> Params:
    return {k: v for k, v in state.items() if k in names}


@register
class FedBN(FedAvg):
    """The server averages all but the BatchNorm layers; each client keeps its own."""

    name = "fedbn"
    personalised = True

    @cached_property
    def bn_names(self) -> frozenset[str]:
        return batchnorm_names(self.ops.module)

    @property
    def averaged_names(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.ops.module.named_parameters()) - self.bn_names

    def _model(self, server: State, client: State) -> tuple[Params, Params]:
        """Global non-BN parameters with the client's own BN state; the server's BN entries are
        never averaged, so they stay the initial ones, used before a client first trains."""
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
        new = average_models(server, results, self.hp.weighting, self.averaged_names)
        # BN statistics are not averaged either: the server keeps its non-BN buffers only
        keep = {k: v for k, v in new["buffers"].items() if k not in self.bn_names}
        return {**new, "buffers": {**server["buffers"], **keep}}

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {
            "bn_params": local_part(result.params[0], self.bn_names),
            "bn_buffers": local_part(result.buffers[0], self.bn_names),
        }

    def mixture(self, server: State, client: State, data: ClientData):
        if data.test_only:
            client = {}
        return [(1.0, *self._model(server, client))]

    def global_model(self, server: State):
        return self._model(server, {})
