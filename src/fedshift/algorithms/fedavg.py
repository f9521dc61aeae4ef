"""FedAvg (McMahan et al., 2017): local SGD from the global model, sample-weighted average."""

from __future__ import annotations

import torch

from fedshift.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    LocalTask,
    State,
    clone_params,
    softmax_probs,
    weighted_average,
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
        return LocalTask(
            params=[clone_params(server["params"])], buffers=[clone_params(server["buffers"])]
        )

    def aggregate(self, server: State, results: list[ClientResult], rnd: int) -> State:
        if not results:
            return server
        w = [r.num_samples for r in results]
        return {
            "params": weighted_average([r.params[0] for r in results], w),
            "buffers": weighted_average([r.buffers[0] for r in results], w),
        }

    def predict(self, server: State, client: State, data: ClientData, idx: torch.Tensor):
        logits = self.ops.logits(
            server["params"], server["buffers"], data.inputs, idx, data.eval_batch
        )
        return softmax_probs(logits)

    def global_model(self, server: State):
        return server["params"], server["buffers"]
