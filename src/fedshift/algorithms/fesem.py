"""FeSEM (Long et al., 2023, "Multi-center federated learning"): hard clustering by the L2
distance between a client's trained local model and the cluster centers.

A client's first assignment is the center with the lowest loss on its data; each round it
trains from its current center, and its trained model is then assigned to the nearest center
(L2 over all parameters, against the centers it was sent). The server sets center k to the
sample-weighted average of the local models assigned to k (a center nobody was assigned to
keeps its model, or is zeroed as in the authors' code with ``empty_cluster="zero"``, see
:mod:`fedshift.algorithms.ifca`). The assignment is carried to the server as ``stats["cluster"]`` (see
:mod:`fedshift.algorithms.ifca`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedshift.algorithms.base import ClientData, ClientResult, LocalTask, Params, State
from fedshift.algorithms.ifca import HardClusterAlgorithm, lowest_loss_cluster, one_hot
from fedshift.algorithms.registry import register


def squared_distance(a: Params, b: Params) -> torch.Tensor:
    """Squared L2 distance between two parameter dicts (all tensors, float64 sum)."""
    return sum(((a[k].double() - b[k].double()) ** 2).sum() for k in b)  # type: ignore[return-value]


def nearest_center(params: Params, centers: Sequence[Params]) -> int:
    """Index of the center closest to ``params`` in L2 distance (first one on ties)."""
    d = torch.stack([squared_distance(params, c) for c in centers])
    return int(torch.argmin(d))


@register
class FeSEM(HardClusterAlgorithm):
    """Multi-center FL: EM on model distances, one local model per client per round."""

    name = "fesem"

    def client_task(self, server: State, client: State, data: ClientData) -> LocalTask:
        if "cluster" not in client:  # first participation: lowest-loss center
            k = lowest_loss_cluster(self, server, data)
            client["cluster"] = k
            client["omega"] = one_hot(k, self.num_models)
        m = server["models"][client["cluster"]]
        return LocalTask(params=[m["params"]], buffers=[m["buffers"]])

    def client_update(self, server: State, client: State, result: ClientResult) -> State:
        k = nearest_center(result.params[0], [m["params"] for m in server["models"]])
        result.stats["cluster"] = k
        return {**client, "cluster": k, "omega": one_hot(k, self.num_models)}
