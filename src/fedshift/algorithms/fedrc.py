"""FedRC (Guo, Tang & Lin, ICML 2024): FedEM's soft-clustering EM
(:mod:`~fedshift.algorithms.fedem`, where the E-step, the label statistics, adaptive K, the
test-only clients and every choice the paper leaves open are described) with the label prior
C_{y,k} in the E-step (``γ = softmax_k(log ω_k − CE_k − log C_{y,k})``), optional privacy noise
on the label statistics, and the prior given to test-only clients. Also FedRC-FT (fine-tuning
before prediction) and FedRC with a shared body.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Mixture,
    ModelOps,
    Phase,
    RunningAverage,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import FineTunes
from fedshift.algorithms.fedem import FedEM, FedEMParams
from fedshift.algorithms.registry import register
from fedshift.core.seeds import FEDRC_FT_STREAM
from fedshift.models import head_param_names

# ---------------------------------------------------------------------- hyper-parameters


class FedRCParams(FedEMParams):
    label_prior: bool = Field(default=True, description="divide by C_{y,k} in the E-step")
    noise_std: float = Field(default=0.0, ge=0, description="ξ, std of the noise on S")
    test_prior: Literal["server", "none"] = Field(
        default="server", description="label prior of test-only clients' E-step"
    )


class FedRCFTParams(FedRCParams):
    ft_lr: float | None = Field(default=None, gt=0, description="None: the run's train.lr")
    ft_batch_size: int | None = Field(default=None, ge=1, description="None: train.batch_size")
    ft_epochs: int = Field(default=1, ge=1)
    ft_momentum: float | None = Field(default=None, ge=0, description="None: train.momentum")
    ft_weight_decay: float | None = Field(
        default=None, ge=0, description="None: train.weight_decay"
    )


# ---------------------------------------------------------------------- algorithms


@register
class FedRC(FedEM):
    """FedRC: FedEM's EM with the label prior C_{y,k} in the E-step, optional privacy noise on
    the label statistics and the prior given to test-only clients (``test_prior``)."""

    name = "fedrc"
    paper = (
        'Guo, Tang & Lin, "FedRC: Tackling Diverse Distribution Shifts '
        'Challenge in Federated Learning by Robust Clustering", ICML 2024'
    )
    Params = FedRCParams

    @property
    def use_prior(self) -> bool:
        return self.hp.label_prior

    @property
    def noise_std(self) -> float:
        return self.hp.noise_std

    @property
    def test_prior(self) -> str:
        return self.hp.test_prior


@register
class FedRCFT(FineTunes, FedRC):
    """FedRC-FT: evaluation fine-tunes copies of the K models for ``ft_epochs`` local epochs on
    the client's train split (test-only clients: their adaptation split, as in the code) with
    the γ-weighted loss, then predicts with the ω-mixture of the tuned copies.

    γ for the fine-tuning is recomputed by one E-step at the current global models with the
    client's ω and the server's C (test-only clients: with the prior ``test_prior`` picks); the
    mixture weights are the client's ω. The fine-tuning is a task the engine trains (batched
    where training is): one stage over all K models, plain SGD without clipping, lr, batch size
    (drop_last), momentum and weight decay from ``ft_*`` or else the run's train settings (the
    code fine-tunes with the client's own optimiser); batch order from (run seed, round,
    client id).
    """

    name = "fedrc-ft"
    paper = "Guo, Tang & Lin, FedRC (ICML 2024), its fine-tuned variant"
    Params = FedRCFTParams

    def fine_tune_task(self, server: State, client: State, data: ClientData) -> LocalTask | None:
        """Copies of the K models, tuned on the client's train split (test-only clients: their
        adaptation split, as in the code) with the γ-weighted loss."""
        hp, dflt = self.hp, self.train_defaults
        if data.num_train == 0:
            return None
        use_prior = self.use_prior and (not data.test_only or self.test_prior == "server")
        gamma = self._e_step(server, data, self.live_omega(server, client), use_prior)
        phase = Phase(
            epochs=hp.ft_epochs,
            lr=dflt.lr if hp.ft_lr is None else hp.ft_lr,
            batch_size=dflt.batch_size if hp.ft_batch_size is None else hp.ft_batch_size,
            drop_last=True,
            momentum=dflt.momentum if hp.ft_momentum is None else hp.ft_momentum,
            weight_decay=dflt.weight_decay if hp.ft_weight_decay is None else hp.ft_weight_decay,
            clip=False,
        )
        return LocalTask(
            params=[m["params"] for m in server["models"]],
            buffers=[m["buffers"] for m in server["models"]],
            extras={"gamma": gamma},
            phases=(phase,),
            stream=(self.seed, FEDRC_FT_STREAM, server.get("round", 0), data.cid),
        )

    def tuned_mixture(
        self, server: State, client: State, data: ClientData, result: ClientResult
    ) -> Mixture:
        return [
            (w, result.params[k], result.buffers[k])
            for k, w in self.mixture_weights(server, client)
        ]


@register
class FedRCShared(FedRC):
    """FedRC with one feature extractor shared by the K clusters (K heads, Table 11).

    Simulation: the K models keep separate parameter dicts, but every model's body is read
    from model 0 during local training, so the single body gets the gradient of
    Σ_k (γ_k-weighted CE through head k) — trained *jointly* with the heads (the code
    alternates: heads on frozen features, then the body with heads frozen). The server
    averages the body *uniformly* over the sampled clients (the code) and the heads per cluster
    with N_i weights; all K models then hold the same body tensors. Body buffers (BatchNorm)
    are those of model 0 as well.
    """

    name = "fedrc-shared"
    paper = "Guo, Tang & Lin, FedRC (ICML 2024), its shared-body variant"

    def __init__(self, hp: FedRCParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)

        self.head_names = set(head_param_names(ops.module))
        self.head_buffers = {n for n, _ in ops.module.named_buffers() if n.startswith("head.")}

    def init_server_state(self, init) -> State:
        server = super().init_server_state(init)
        body_p = {
            k: v for k, v in server["models"][0]["params"].items() if k not in self.head_names
        }
        body_b = {
            k: v for k, v in server["models"][0]["buffers"].items() if k not in self.head_buffers
        }
        for m in server["models"]:  # one body for all K models
            m["params"] = {**m["params"], **body_p}
            m["buffers"] = {**m["buffers"], **body_b}
        return server

    def _combine(self, head: TensorDict, body: TensorDict, head_keys: set[str]) -> TensorDict:
        return {k: (head[k] if k in head_keys else body[k]) for k in head}

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        shared_p = [self._combine(p, params[0], self.head_names) for p in params]
        shared_b = [self._combine(b, buffers[0], self.head_buffers) for b in buffers]
        return super().local_loss(shared_p, shared_b, batch, extras)

    def _average_models(self, server: State, results: Iterable[ClientResult]) -> list[dict]:
        K = len(server["models"])
        heads_p = [RunningAverage() for _ in range(K)]
        heads_b = [RunningAverage() for _ in range(K)]
        body_p, body_b = RunningAverage(), RunningAverage()
        for r in results:
            for k in range(K):
                heads_p[k].add(
                    {n: v for n, v in r.params[k].items() if n in self.head_names}, r.num_samples
                )
                heads_b[k].add(
                    {n: v for n, v in r.buffers[k].items() if n in self.head_buffers},
                    r.num_samples,
                )
            body_p.add({n: v for n, v in r.params[0].items() if n not in self.head_names}, 1.0)
            body_b.add({n: v for n, v in r.buffers[0].items() if n not in self.head_buffers}, 1.0)
        if body_p.sums is None:
            return server["models"]
        bp = body_p.result()
        bb = body_b.result() if body_b.sums else {}
        out = []
        for k in range(K):  # keys in the template's order
            head_and_body = {**bp, **(heads_p[k].result() if heads_p[k].sums else {})}
            hb = {**bb, **(heads_b[k].result() if heads_b[k].sums else {})}
            tmpl = server["models"][k]
            out.append(
                {
                    "params": {n: head_and_body[n] for n in tmpl["params"]},
                    "buffers": {n: hb[n] for n in tmpl["buffers"]},
                }
            )
        return out
