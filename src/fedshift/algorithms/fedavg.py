"""FedAvg (McMahan et al., 2017): local SGD from the global model, sample-weighted average."""

from __future__ import annotations

from collections.abc import Iterable

from fedshift.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    LocalTask,
    RunningAverage,
    State,
)
from fedshift.algorithms.registry import register


@register
class FedAvg(Algorithm):
    """One global model; the server averages the clients' models weighted by sample count."""

    name = "fedavg"

    def init_server_state(self, init):
        params, buffers = init[0]
        return {"params": params, "buffers": buffers}

    def client_task(self, server: State, client: State, data: ClientData) -> LocalTask:
        return LocalTask(params=[server["params"]], buffers=[server["buffers"]])

    def aggregate(self, server: State, results: Iterable[ClientResult], rnd: int) -> State:
        params, buffers = RunningAverage(), RunningAverage()
        for r in results:
            params.add(r.params[0], r.num_samples)
            buffers.add(r.buffers[0], r.num_samples)
        if params.sums is None:
            return server
        return {"params": params.result(), "buffers": buffers.result() if buffers.sums else {}}

    def mixture(self, server: State, client: State):
        return [(1.0, server["params"], server["buffers"])]

    def global_model(self, server: State):
        return server["params"], server["buffers"]
