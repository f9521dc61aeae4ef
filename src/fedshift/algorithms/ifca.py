"""IFCA (Ghosh et al., 2020): each client picks the cluster model with the lowest loss on its
data and trains only that one; the server averages model k over the clients that picked k.

By default a cluster that no client picked in a round keeps its model (the paper's
description). ``empty_cluster="zero"`` reproduces the authors' code instead, whose aggregator
averages over an empty list and so sets that model to all zeros; a zeroed ReLU network outputs
uniform logits, gets no gradient, and is never picked again, so the method loses that cluster
for good. The FedRC paper's IFCA and FeSEM numbers come from that code.

The pick is made in :meth:`IFCA.client_task` (it needs the client's data) and kept in the task's
``info``; the client uploads it (``upload["cluster"]``: which model its result belongs to) and
keeps it in its state as a one-hot ω.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from pydantic import Field

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    RunningAverage,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import AdaptsTestClients
from fedshift.algorithms.clustered import ClusteredAlgorithm, ClusteredParams
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import HardAssignment


class HardClusterParams(ClusteredParams):
    empty_cluster: Literal["keep", "zero"] = Field(
        default="keep",
        description="a cluster no client picked: keep its model (paper) or zero it (authors' code)",
    )


def lowest_loss_cluster(algo: ClusteredAlgorithm, server: State, data: ClientData) -> int:
    """Index of the server model with the lowest mean loss on the client's labelled split."""
    if data.num_train == 0:
        return 0
    return int(torch.argmin(algo.sample_losses(server, data).mean(dim=0)))


def one_hot(k: int, num: int) -> torch.Tensor:
    """ω of a hard assignment to cluster ``k`` out of ``num``."""
    om = torch.zeros(num)
    om[k] = 1.0
    return om


def zeroed(model: dict) -> dict:
    """A cluster model with every parameter and floating buffer set to zero."""
    return {
        "params": {k: torch.zeros_like(v) for k, v in model["params"].items()},
        "buffers": {
            k: torch.zeros_like(v) if v.is_floating_point() else v
            for k, v in model["buffers"].items()
        },
    }


def average_hard_clusters(
    server: State, results: Iterable[ClientResult], empty: str = "keep"
) -> list[dict]:
    """Per-cluster FedAvg of single-model results tagged with ``upload["cluster"]``, weighted
    by sample count (one pass); a cluster no result was tagged with keeps its model, or is
    zeroed when ``empty == "zero"``."""
    models = server["models"]
    p_avg = [RunningAverage() for _ in models]
    b_avg = [RunningAverage() for _ in models]
    for r in results:
        k = int(r.upload["cluster"])
        if r.num_samples > 0:
            p_avg[k].add(r.params[0], r.num_samples)
            b_avg[k].add(r.buffers[0], r.num_samples)
    return [
        {"params": p.result(), "buffers": b.result() if b.sums else {}}
        if p.sums is not None
        else (zeroed(models[k]) if empty == "zero" else models[k])
        for k, (p, b) in enumerate(zip(p_avg, b_avg, strict=True))
    ]


class HardClusterAlgorithm(AdaptsTestClients, ClusteredAlgorithm):
    """Base of IFCA and FeSEM (not registered): one cluster model trained per client, the
    cluster uploaded as ``upload["cluster"]``, per-cluster FedAvg, test-only clients on their
    lowest-loss cluster."""

    Params = HardClusterParams
    ClientState = HardAssignment

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        return {
            **server,
            "models": average_hard_clusters(server, results, self.hp.empty_cluster),
        }

    def adapt_test_client(self, server: State, data: ClientData, state: State) -> State:
        k = lowest_loss_cluster(self, server, data)
        return {"cluster": k, "omega": one_hot(k, len(server["models"]))}

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        return {"cluster": task.info["cluster"]}

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        k = result.upload["cluster"]
        return {**client, "cluster": k, "omega": one_hot(k, len(server["models"]))}


@register
class IFCA(HardClusterAlgorithm):
    """Hard clustering by lowest loss: one model trained per client per round."""

    name = "ifca"
    paper = 'Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020'

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        k = lowest_loss_cluster(self, server, data)
        m = server["models"][k]
        return LocalTask(params=[m["params"]], buffers=[m["buffers"]], info={"cluster": k})

    def task_logit_models(self, server: State) -> list[tuple[TensorDict, TensorDict]]:
        return self.cluster_models(server)  # the lowest-loss choice
