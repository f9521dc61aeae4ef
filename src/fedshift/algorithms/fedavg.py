"""FedAvg (McMahan et al., 2017): local SGD from the global model, then the server averages the
clients' models, weighted by sample count (the paper) or uniformly (``weighting="uniform"``,
what the FedNH code does for every method)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from fedshift.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    HyperParams,
    LocalTask,
    RoundContext,
    RunningAverage,
    State,
    keep_shared,
)
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import GlobalModel, NoState


class FedAvgParams(HyperParams):
    weighting: Literal["samples", "uniform"] = Field(
        default="samples", description="client weights of the server average"
    )


def client_weight(result: ClientResult, weighting: str) -> float:
    """A result's weight in the server average: its sample count, or 1 (``"uniform"``);
    0 for a client without samples either way."""
    if result.num_samples <= 0:
        return 0.0
    return 1.0 if weighting == "uniform" else float(result.num_samples)


def average_models(
    server: State,
    results: Iterable[ClientResult],
    weighting: str,
    names: Iterable[str] | None = None,
) -> State:
    """FedAvg's server step on model 0 of the results (one pass): the weighted average of the
    parameters in ``names`` (all when None; the others keep the server's tensors) and of the
    buffers. The server is returned unchanged when no result has a positive weight."""
    keep = None if names is None else frozenset(names)
    params, buffers = RunningAverage(), RunningAverage()
    for r in results:
        w = client_weight(r, weighting)
        if w > 0:
            p = r.params[0] if keep is None else {k: v for k, v in r.params[0].items() if k in keep}
            params.add(p, w)
            buffers.add(r.buffers[0], w)
    if params.sums is None:
        return server
    return {
        **server,
        "params": {**server["params"], **params.result()},
        "buffers": buffers.result() if buffers.sums else {},
    }


@register
class FedAvg(Algorithm):
    """One global model; the server averages the clients' models."""

    name = "fedavg"
    paper = (
        'McMahan et al., "Communication-Efficient Learning of Deep Networks '
        'from Decentralized Data", AISTATS 2017'
    )
    Params = FedAvgParams
    ServerState = GlobalModel
    ClientState = NoState

    def init_server_state(self, init):
        params, buffers = init[0]
        return {"params": params, "buffers": buffers}

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        return LocalTask(params=[server["params"]], buffers=[server["buffers"]])

    #: the parameter names the server averages (None: all; FedPer & co. keep heads private)
    averaged_names: Iterable[str] | None = None

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        return average_models(server, results, self.hp.weighting, self.averaged_names)

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """Of model 0, only the parameters the server averages leave the client."""
        names = self.averaged_names
        return keep_shared(result, names=None if names is None else {0: frozenset(names)})

    def mixture(self, server: State, client: State, data: ClientData):
        return [(1.0, server["params"], server["buffers"])]

    def global_model(self, server: State):
        return server["params"], server["buffers"]
