"""FedBABU (Oh, Kim & Yun, ICLR 2022): federated training of the body only, then per-client
fine-tuning of the whole model for personalisation.

During federated training the head keeps its random initialisation for ever: local SGD trains
only the body (one :class:`~fedshift.algorithms.base.Phase` whose trainable parameters are the
body's), and the server averages only the body, keeping the initial head. The average is
FedAvg's: ``weighting="samples"`` (by sample count) or ``"uniform"`` (the FedNH code's 1/|S|,
spec §7 item 10). The global model (GM) is the averaged body with the initial head, as
the FedNH protocol evaluates methods that do not upload a head.

The personalised model (PM) of a client is its model fine-tuned, *whole* (head included), for
``ft_epochs`` epochs on its train split. As in the code the FedNH paper used (spec §4 and §7
item 16) the fine-tuning starts from the client's **last local model** (its body after its last
local training, with the initial head), not from the final global model; ``ft_from="global"``
starts from the current global model instead. Clients that never trained, and test-only
clients (on their labelled adaptation split, as FedRC-FT does), start from the global model.

Fine-tuning hyper-parameters follow the code: plain SGD with momentum 0.9, weight decay 1e-5
(the CIFAR setting; TinyImageNet used 1e-3), gradient clipping at global norm 10, mini-batches
of 64 without dropping the ragged tail (a PyTorch DataLoader's default). The learning rate is
``0.01 * 0.99**200``: the code fine-tunes in "round 201" of its schedule
``lr_t = 0.01 * 0.99**(t-1)``. The batch order comes from a generator seeded by the run seed
and the client id, so a fine-tuned model is a deterministic function of the seed, its start
model and the client's data. The fine-tuning is a task (:meth:`FedBABU.fine_tune_task`) the
engine trains before each evaluation, batched where training is.

Where this differs from the paper's protocol: the paper fine-tunes once, after the last round.
Here every evaluation scores the fine-tuned models (so PM curves exist over rounds), and the
evaluation fine-tunes every client it scores (local accuracy covers all clients), which costs
``ft_epochs`` local epochs per client and evaluation; use ``eval.every`` to bound it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    Mixture,
    ModelOps,
    Phase,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import FineTunes, Personalised
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import OwnModel
from fedshift.core.seeds import FEDBABU_FT_STREAM, SHUFFLE_STREAM, derive_seed
from fedshift.models.base import body_param_names

#: the code's round-201 learning rate: 0.01 * 0.99**(201 - 1)
FT_LR = 0.01 * 0.99**200


class FedBABUParams(FedAvgParams):
    ft_epochs: int = Field(default=5, ge=0, description="fine-tuning epochs of the PM")
    ft_lr: float = Field(
        default=FT_LR, gt=0, description="fine-tuning lr (default: round-201 lr 0.01*0.99**200)"
    )
    ft_momentum: float = Field(default=0.9, ge=0, lt=1, description="fine-tuning SGD momentum")
    ft_weight_decay: float = Field(default=1e-5, ge=0, description="fine-tuning weight decay")
    ft_batch_size: int = Field(default=64, ge=1, description="fine-tuning batch size")
    ft_grad_clip: float | None = Field(
        default=10.0, gt=0, description="fine-tuning gradient clipping (global L2 norm; None: off)"
    )
    ft_from: Literal["local", "global"] = Field(
        default="local",
        description="fine-tune from the client's last local model (the code) or the global one",
    )


@register
class FedBABU(Personalised, FineTunes, FedAvg):
    """Body-only FedAvg with a frozen random head; PM = the client's model fine-tuned whole."""

    name = "fedbabu"
    #: the local model: its body is uploaded, its head never trained
    shared_state_keys = frozenset({"params", "buffers"})
    paper = (
        'Oh, Kim & Yun, "FedBABU: Toward Enhanced Representation for Federated '
        'Image Classification", ICLR 2022'
    )
    Params = FedBABUParams
    ClientState = OwnModel

    def __init__(self, hp: FedBABUParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)
        self.body_names: tuple[str, ...] = tuple(body_param_names(ops.module))
        self.train_phase = Phase(trainable=((0, self.body_names),))
        self.ft_phase = Phase(
            epochs=hp.ft_epochs,
            lr=hp.ft_lr,
            batch_size=hp.ft_batch_size,
            drop_last=False,  # a PyTorch DataLoader's default, as in the code
            momentum=hp.ft_momentum,
            weight_decay=hp.ft_weight_decay,
            clip=False if hp.ft_grad_clip is None else hp.ft_grad_clip,
        )

    # ------------------------------------------------------------------ federated training
    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        return LocalTask(
            params=[server["params"]], buffers=[server["buffers"]], phases=(self.train_phase,)
        )

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        if self.hp.ft_from != "local":
            return client
        return {"params": result.params[0], "buffers": result.buffers[0]}

    @property
    def averaged_names(self) -> tuple[str, ...]:
        return self.body_names  # the head keeps its random init for ever

    # ------------------------------------------------------------------ personalisation
    def start_model(
        self, server: State, client: State, data: ClientData
    ) -> tuple[TensorDict, TensorDict]:
        """The model a client's fine-tuning starts from (see the module docstring)."""
        if self.hp.ft_from == "local" and "params" in client and not data.test_only:
            return client["params"], client["buffers"]
        return server["params"], server["buffers"]

    def fine_tune_task(self, server: State, client: State, data: ClientData) -> LocalTask | None:
        """The whole start model fine-tuned on the client's train split (test-only clients:
        their adaptation split); batch order from (run seed, client id)."""
        if data.num_train == 0 or self.hp.ft_epochs == 0:
            return None
        p, b = self.start_model(server, client, data)
        seed = derive_seed(self.seed, FEDBABU_FT_STREAM)
        return LocalTask(
            params=[p],
            buffers=[b],
            phases=(self.ft_phase,),
            stream=(seed, SHUFFLE_STREAM, 0, data.cid),
        )

    def mixture(self, server: State, client: State, data: ClientData) -> Mixture:
        """Without fine-tuning (no data, or ``ft_epochs`` 0): the start model itself."""
        p, b = self.start_model(server, client, data)
        return [(1.0, p, b)]
