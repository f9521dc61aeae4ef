"""FedRep (Collins et al., 2021): FedPer's split, trained in two stages per round.

Each round a client first trains its private head for ``head_epochs`` epochs (10 in the paper)
with the global body frozen, then the body for the run's local epochs (5) with the head frozen.
Only bodies are averaged. Personalised model: the latest local model; global model: the global
body with the initial head (spec fednh.md §4).
"""

from __future__ import annotations

from pydantic import Field

from fedshift.algorithms.base import (
    ClientData,
    LocalTask,
    Phase,
    RoundContext,
    State,
)
from fedshift.algorithms.fedavg import FedAvgParams
from fedshift.algorithms.fedper import FedPer
from fedshift.algorithms.registry import register


class FedRepParams(FedAvgParams):
    head_epochs: int = Field(default=10, ge=0, description="epochs of head training per round")


@register
class FedRep(FedPer):
    """Head first (body frozen), then body (head frozen); bodies are averaged."""

    name = "fedrep"
    paper = (
        'Collins et al., "Exploiting Shared Representations for Personalized '
        'Federated Learning", ICML 2021'
    )
    Params = FedRepParams

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        task = super().client_task(server, client, data, ctx)
        task.phases = (
            Phase(trainable=((0, tuple(sorted(self.head_names))),), epochs=self.hp.head_epochs),
            Phase(trainable=((0, tuple(sorted(self.body_names))),)),
        )
        return task
