"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", 2020): local representations, a global classifier. The mirror of
FedPer: each client keeps its body (the representation layers) private and the server
averages only the heads (the top layers).

Round ``t``, sampled clients ``S_t``, client ``m`` with body ``theta^l_m`` and the global head
``theta^g``::

    start model of m         = (theta^l_m, theta^g)          (own body + current global head)
    (theta^l_m, theta^g_m)  <- local SGD on CE from it         (the run's epochs, lr, ...)
    theta^g                 <- sum_{m in S_t} n_m theta^g_m / sum_{m in S_t} n_m

A client's personalised model is its own body with the current global head: the authors'
code copies the new global layers into every client's model after each round before testing
it. A client that never trained (and every test-only client) is answered by the shared model:
the server's body (the common initialisation, or the FedAvg warm-up's body) with the global
head. The global model (GM) is that shared model too.

Hyper-parameters:

- ``weighting`` (FedAvg's): ``"samples"`` (default, as FedPer here); the authors' code
  divides the sum of the sampled heads by their number (``"uniform"``).
- ``fedavg_rounds`` (default 0): rounds of plain FedAvg (whole models averaged) before the
  local/global split. The paper's experiments start LG-FedAvg from a model trained by FedAvg
  (the code loads a FedAvg checkpoint, ``--load_fed``, as every client's start); 0 starts
  from the common random initialisation, as the other methods of a run do. After the warm-up
  every client starts from the FedAvg model (clients keep nothing during it).

Choices and differences from the paper and the authors' code (pliang279/LG-FedAvg):

- The global part is the configured network's head (``head_param_names``), FedPer's split
  reversed. The code keeps the top ``num_layers_keep`` entries of a per-network layer list
  global (3 of 5 MLP layers on MNIST; on CIFAR-10 its list puts the two convolutions on top, so
  ``num_layers_keep=2`` keeps those global).
- Buffers (BatchNorm statistics, in the body) stay local: a client starts from its own, and the
  server's buffers are averaged only during the warm-up.
- The code keeps, per client, the best local model over rounds for its reported accuracy;
  here every evaluation scores the current models.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
    keep_shared,
)
from fedshift.algorithms.fedavg import FedAvgParams, average_models
from fedshift.algorithms.fedper import FedPer, split_params
from fedshift.algorithms.registry import register


class LGFedAvgParams(FedAvgParams):
    fedavg_rounds: int = Field(
        default=0,
        ge=0,
        description="rounds of plain FedAvg before the local/global split (the paper starts "
        "from a FedAvg-trained model)",
    )


@register
class LGFedAvg(FedPer):
    """Private bodies, averaged heads (FedPer mirrored)."""

    name = "lg-fedavg"
    paper = (
        'Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global '
        'Representations", arXiv 2020'
    )
    Params = LGFedAvgParams
    hp: LGFedAvgParams

    def warming_up(self, rnd: int) -> bool:
        """Whether round ``rnd`` is one of the plain-FedAvg warm-up rounds."""
        return rnd <= self.hp.fedavg_rounds

    def start_params(self, server: State, client: State) -> TensorDict:
        """The client's own body + the global head (the server's model before it first
        trains after the warm-up)."""
        own = client.get("params")
        if own is None:
            return server["params"]
        return {
            **split_params(own, self.head_names)[0],
            **split_params(server["params"], self.head_names)[1],
        }

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        if self.warming_up(ctx.round):
            return LocalTask(
                params=[server["params"]], buffers=[server["buffers"]], info={"warmup": True}
            )
        return LocalTask(
            params=[self.start_params(server, client)],
            buffers=[client.get("buffers", server["buffers"])],
        )

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """After the warm-up only the head leaves the client (the body and its buffers
        stay); during it, the whole model."""
        if task.info.get("warmup"):
            return keep_shared(result)
        return keep_shared(result, names={0: frozenset(self.head_names)}, buffer_names={0: ()})

    def private_state(self, client: State) -> State:
        """The body of the local model and its buffers (the head is uploaded)."""
        params = client.get("params", {})
        body = {k: v for k, v in params.items() if k not in self.head_names}
        return {"params": body, "buffers": client.get("buffers", {})}

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        if task.info.get("warmup"):
            return client  # after the warm-up every client starts from the FedAvg model
        return super().client_update(server, client, task, result)

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        if self.warming_up(ctx.round):
            return average_models(server, results, self.hp.weighting)
        new = average_models(server, results, self.hp.weighting, self.head_names)
        return {**new, "buffers": server["buffers"]}  # buffers belong to the private bodies

    @property
    def averaged_names(self) -> frozenset[str]:
        return self.head_names

    def mixture(self, server: State, client: State, data: ClientData):
        if data.test_only or "params" not in client:
            return [(1.0, server["params"], server["buffers"])]
        return [(1.0, self.start_params(server, client), client["buffers"])]
