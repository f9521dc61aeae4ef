"""Oracle (FedDAA's upper bound, spec feddaa.md §4): clustered FL that knows the truth.

One model per true concept (models are added as concepts appear: 2, 3, 4, 4, 4, 4 in FedDAA's
schedule), every client hard-assigned to its true concept's model, a test task to its concept's
model, and a client's previous data used iff its concept did not change. It reads the ground
truth in ``ClientData.concept`` / ``prev_concept``, which no other method does.
"""

from __future__ import annotations

from typing import Any

import torch

from fedshift.algorithms.base import ClientData, LocalTask, Mixture, RoundContext, State
from fedshift.algorithms.capabilities import DriftAware, DriftCheckParams
from fedshift.algorithms.ifca import HardClusterAlgorithm, HardClusterParams, one_hot
from fedshift.algorithms.registry import register
from fedshift.core.seeds import FEDDAA_STREAM, derive_seed


class OracleParams(HardClusterParams, DriftCheckParams):
    pass


@register
class Oracle(DriftAware, HardClusterAlgorithm):
    """A model per true concept, true assignments, history iff the concept stayed."""

    name = "oracle"
    paper = "baseline: one model per true concept (ground truth, an upper bound)"
    premise = "drift"
    Params = OracleParams

    def num_initial_models(self) -> int:
        return 1  # more are added as concepts appear (start_step)

    def step_upload(self, server: State, client: State, data: ClientData, ctx: RoundContext):
        return {"concept": data.concept}

    def start_step(self, server: State, uploads: dict[int, Any], ctx: RoundContext) -> State:
        """A fresh model for every concept index that appears (up to the largest one seen)."""
        models = list(server["models"])
        need = max([u["concept"] for u in uploads.values()], default=0) + 1
        dev = next(iter(models[0]["params"].values())).device
        for k in range(len(models), need):
            p, b = self.ops.init(derive_seed(self.seed, FEDDAA_STREAM, ctx.step, 1000 + k))
            models.append({"params": {n: v.to(dev) for n, v in p.items()}, "buffers": b})
        return {**server, "models": models}

    def step_update(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> State:
        k = int(data.concept)
        return {"cluster": k, "omega": one_hot(k, len(server["models"]))}

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        k = int(data.concept)
        m = server["models"][k]
        keep = data.prev_idx is not None and data.prev_concept == data.concept
        idx, y = (
            (torch.cat([data.prev_idx, data.train_idx]), torch.cat([data.prev_y, data.y_train]))
            if keep
            else (None, None)
        )
        return LocalTask(
            params=[m["params"]],
            buffers=[m["buffers"]],
            info={"cluster": k},
            train_idx=idx,
            y_train=y,
        )

    def adapt_test_client(self, server: State, data: ClientData, state: State) -> State:
        return {"cluster": int(data.concept)}

    def mixture(self, server: State, client: State, data: ClientData) -> Mixture:
        k = min(int(client.get("cluster", data.concept or 0)), len(server["models"]) - 1)
        m = server["models"][k]
        return [(1.0, m["params"], m["buffers"])]
