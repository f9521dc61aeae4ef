"""Shared pieces of clustered FL methods (K cluster models): state layout, per-sample losses,
per-cluster FedAvg, ω-mixture prediction and cluster assignment.

Server state: ``{"models": [{"params": ..., "buffers": ...}, ...K]}`` plus method extras.
Client state: ``{"omega": tensor [K]}`` (cluster weights) plus method extras.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    HyperParams,
    RunningAverage,
    State,
    TensorDict,
    as_float,
)
from fedshift.algorithms.states import Clusters


class ClusteredParams(HyperParams):
    num_clusters: int = Field(default=3, ge=1, description="K, the number of cluster models")


class ClusteredAlgorithm(Algorithm):
    """Base of methods that keep K cluster models on the server (not registered itself)."""

    Params = ClusteredParams
    ServerState = Clusters

    def num_initial_models(self) -> int:
        return self.hp.num_clusters

    def init_server_state(self, init) -> State:
        return {"models": [{"params": p, "buffers": b} for p, b in init]}

    def cluster_models(self, server: State) -> list[tuple[TensorDict, TensorDict]]:
        """(params, buffers) of every cluster model: the models :meth:`sample_losses` runs
        (a method whose client task calls it returns these as its task logit models)."""
        return [(m["params"], m["buffers"]) for m in server["models"]]

    # ------------------------------------------------------------------ helpers
    def sample_losses(
        self,
        server: State,
        data: ClientData,
        idx: torch.Tensor | None = None,
        y: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-sample cross-entropy of every cluster model, [n, K] (eval mode, no grad)."""
        idx = data.train_idx if idx is None else idx
        y = data.y_train if y is None else y
        cols = [
            F.cross_entropy(
                as_float(
                    self.ops.logits(m["params"], m["buffers"], data.inputs, idx, data.eval_batch)
                ),
                y,
                reduction="none",
            )
            for m in server["models"]
        ]
        return torch.stack(cols, dim=1)

    @staticmethod
    def average_per_cluster(
        server: State, results: Iterable[ClientResult], weight: Callable[[ClientResult, int], float]
    ) -> list[dict[str, Any]]:
        """FedAvg of each cluster model over the results, client weights ``weight(r, k)``;
        a cluster no client contributed to keeps its model."""
        K = len(server["models"])
        p_avg = [RunningAverage() for _ in range(K)]
        b_avg = [RunningAverage() for _ in range(K)]
        for r in results:
            for k in range(K):
                w = float(weight(r, k))
                if w > 0:
                    p_avg[k].add(r.params[k], w)
                    b_avg[k].add(r.buffers[k], w)
        return [
            {"params": p_avg[k].result(), "buffers": b_avg[k].result() if b_avg[k].sums else {}}
            if p_avg[k].sums is not None
            else server["models"][k]
            for k in range(K)
        ]

    @staticmethod
    def omega(server: State, client: State) -> torch.Tensor:
        """The client's cluster weights (uniform before it first participates)."""
        om = client.get("omega")
        if om is None:
            k = len(server["models"])
            return torch.full((k,), 1.0 / k)
        return om

    # ------------------------------------------------------------------ prediction
    def mixture(self, server: State, client: State, data: ClientData):
        om = self.omega(server, client)
        return [
            (float(om[k]), m["params"], m["buffers"])
            for k, m in enumerate(server["models"])
            if float(om[k]) > 0
        ]

    def cluster_of(self, server: State, client: State) -> int | None:
        if client.get("omega") is None:
            return None
        return int(torch.argmax(client["omega"]))

    def global_model(self, server: State) -> tuple[TensorDict, TensorDict] | None:
        return None
