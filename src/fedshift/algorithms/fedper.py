"""FedPer (Arivazhagan et al., 2019): a shared body, a private head per client.

Clients train body and head together from the global body and their own head; the server
averages only the bodies (FedAvg-style, ``weighting`` as in FedAvg). A client's personalised
model is its latest local model (local body + private head); the global model, scored as GM in
FedNH's protocol, is the global body with the initial head (spec fednh.md §3-4). Private heads
start from the common initial head. :class:`FedPer` is also the base of FedRep.
"""

from __future__ import annotations

from functools import cached_property

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import OwnModel
from fedshift.models.base import head_param_names


def split_params(params: TensorDict, head: frozenset[str]) -> tuple[TensorDict, TensorDict]:
    """(body, head) parts of a parameter dict, by the head's parameter names."""
    return (
        {k: v for k, v in params.items() if k not in head},
        {k: v for k, v in params.items() if k in head},
    )


@register
class FedPer(Personalised, FedAvg):
    """Shared body averaged by the server; each client keeps its head (and latest model)."""

    name = "fedper"
    paper = 'Arivazhagan et al., "Federated Learning with Personalization Layers", arXiv 2019'
    ClientState = OwnModel

    @cached_property
    def head_names(self) -> frozenset[str]:
        return frozenset(head_param_names(self.ops.module))

    @cached_property
    def body_names(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.ops.module.named_parameters()) - self.head_names

    def start_params(self, server: State, client: State) -> TensorDict:
        """Global body + the client's private head (the initial head before it first trains)."""
        own = client.get("params")
        if own is None:
            return server["params"]
        return {**server["params"], **split_params(own, self.head_names)[1]}

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        return LocalTask(params=[self.start_params(server, client)], buffers=[server["buffers"]])

    def private_state(self, client: State) -> State:
        """The head of the local model (its body is uploaded)."""
        params = client.get("params", {})
        return {"params": {k: v for k, v in params.items() if k not in self.averaged_names}}

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {"params": result.params[0], "buffers": result.buffers[0]}

    @property
    def averaged_names(self) -> frozenset[str]:
        return self.body_names

    def mixture(self, server: State, client: State, data: ClientData):
        return self.own_mixture(server, client, data)
