"""FeSEM (Long et al., 2023, "Multi-center federated learning"): hard clustering by the L2
distance between a client's trained local model and the cluster centers.

A client's first assignment is the center with the lowest loss on its data; each round it
trains from its current center, and its trained model is then assigned to the nearest center
(L2 over all parameters, against the centers it was sent). The server sets center k to the
sample-weighted average of the local models assigned to k (a center nobody was assigned to
keeps its model, or is zeroed as in the authors' code with ``empty_cluster="zero"``, see
:mod:`fedshift.algorithms.ifca`). The assignment after training is the client's upload
``upload["cluster"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedshift.algorithms.base import (
    ClientData,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.ifca import HardClusterAlgorithm, lowest_loss_cluster
from fedshift.algorithms.registry import register


def squared_distance(a: TensorDict, b: TensorDict) -> torch.Tensor:
    """Squared L2 distance between two parameter dicts (all tensors, float64 sum)."""
    return sum(((a[k].double() - b[k].double()) ** 2).sum() for k in b)  # type: ignore[return-value]


def nearest_center(params: TensorDict, centers: Sequence[TensorDict]) -> int:
    """Index of the center closest to ``params`` in L2 distance (first one on ties)."""
    d = torch.stack([squared_distance(params, c) for c in centers])
    return int(torch.argmin(d))


@register
class FeSEM(HardClusterAlgorithm):
    """Multi-center FL: EM on model distances, one local model per client per round."""

    name = "fesem"
    paper = (
        'Long et al., "Multi-Center Federated Learning: Clients Clustering for '
        'Better Personalization", WWW Journal 2023'
    )

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        k = client.get("cluster")
        if k is None:  # first participation: lowest-loss center
            k = lowest_loss_cluster(self, server, data)
        m = server["models"][k]
        centers = [c["params"] for c in server["models"]]  # references, not copies
        return LocalTask(params=[m["params"]], buffers=[m["buffers"]], info={"centers": centers})

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        """The center nearest to the trained model (among those the client was sent)."""
        return {"cluster": nearest_center(params[0], task.info["centers"])}
