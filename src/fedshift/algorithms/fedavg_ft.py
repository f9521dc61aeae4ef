"""FedAvg + FT: FedAvg's training, each client scored after fine-tuning the global model on its
own data. The baseline a personalised method must beat under the same scoring: a method that
is scored with each client's own model (DFL, Ditto, FedRep, ...) is compared with FedAvg scored
the same way, not with FedAvg's one global model.

At every evaluation each client's start is the current global model, trained for ``ft_steps``
local SGD steps on its train split (the run's lr and batch size; the batch order from the run
seed and the client id, the same at every evaluation), then scored. Training and aggregation
are FedAvg's, unchanged.
"""

from __future__ import annotations

from pydantic import Field

from fedshift.algorithms.base import ClientData, LocalTask, Phase, State
from fedshift.algorithms.capabilities import FineTunes, Personalised
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register
from fedshift.core.seeds import FEDAVG_FT_STREAM, SHUFFLE_STREAM, derive_seed


class FedAvgFTParams(FedAvgParams):
    ft_steps: int = Field(
        default=20, ge=1, description="local SGD steps of fine-tuning before a client is scored"
    )


@register
class FedAvgFT(Personalised, FineTunes, FedAvg):
    """FedAvg; clients scored with the global model fine-tuned on their own train split."""

    name = "fedavg-ft"
    paper = "baseline: FedAvg, then local fine-tuning before scoring (as in FedRC's tables)"
    Params = FedAvgFTParams

    def fine_tune_task(self, server: State, client: State, data: ClientData) -> LocalTask | None:
        if data.num_train == 0:
            return None
        seed = derive_seed(self.seed, FEDAVG_FT_STREAM)
        return LocalTask(
            params=[server["params"]],
            buffers=[server["buffers"]],
            phases=(Phase(steps=self.hp.ft_steps),),
            stream=(seed, SHUFFLE_STREAM, 0, data.cid),
        )
