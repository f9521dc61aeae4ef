"""FedRC (Guo, Tang & Lin, ICML 2024): FedEM's soft-clustering EM
(:mod:`~fedshift.algorithms.fedem`, where the E-step, the label statistics, adaptive K, the
test-only clients and every choice the paper leaves open are described) with the label prior
C_{y,k} in the E-step (``γ = softmax_k(log ω_k − CE_k − log C_{y,k})``), optional privacy noise
on the label statistics, and the prior given to test-only clients. Also FedRC-FT (fine-tuning
before prediction) and FedRC with a shared body.

Two options of every FedRC variant (spec fedrc.md §3.8, §3.9):

- *FedRC-Adam* (``omega_update: adam``, App. H.3): the E-step's γ̃ is a target, not the new γ.
  Each client keeps its per-sample γ [N_i, K] and the Adam moments ν, a of the same shape in its
  state (``gamma``, ``gamma_m``, ``gamma_v``) and moves γ by ``g = γ − γ̃``,
  ``ν ← β₁ν + (1−β₁)g``, ``a ← β₂a + (1−β₂)g²``, ``γ ← γ − α (ν/(1−β₁)) / (√(a/(1−β₂)) + ε)``
  (bias correction by 1−β, not 1−βᵗ: paper and code), clamps at 0 and renormalises per sample;
  ω = mean γ. γ starts uniform and the moments at 0. The target uses ω = mean of the kept γ;
  removed clusters (adaptive K) drop their columns and γ is renormalised per sample (Alg. 3);
  a time step that resets ω resets the Adam state too. Test-only clients keep the plain E-step
  (the paper's new-client rule). Defaults are the paper's (α 1, β₁ 0.9, β₂ 0.99, ε 1e-8); the
  authors' code runs β₁ = β₂ = 0.5 and adds 1/C to each entry of a client's label statistics
  (``smooth_stats: true``).
- *TrHC* (``hard_train: true``, Table 15): after the E-step, γ is one-hot on the client's
  top-ω cluster k* and only model k* is trained (the others are frozen, so they come back
  unchanged, weight decay included); the label statistics and γ mass are those of the one-hot
  γ; ω stays the soft mean of the E-step's γ, so a client can move to another cluster later.
  The server still averages every model over all sampled clients with N_i weights, as for soft
  FedRC (spec §7.11). A single model predicts: it needs ``hard_predict: true`` (TeHC: soft
  training, top-ω prediction), a ConfigError otherwise. This follows the paper's one-sentence
  description (spec §3.8). A hard method in the authors' code (``FedRC_SW``'s
  ``update_learners_weights_single``) sets ω itself one-hot, which would keep a client on its
  first top cluster for good; that is not followed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, ValidationInfo, field_validator

from fedshift.algorithms.base import (
    DEFAULT_PHASES,
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Mixture,
    ModelOps,
    Phase,
    RoundContext,
    RunningAverage,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import FineTunes
from fedshift.algorithms.fedem import EMClient, FedEM, FedEMParams, omega_from_gamma
from fedshift.algorithms.registry import register
from fedshift.core.seeds import FEDRC_FT_STREAM
from fedshift.models import head_param_names

# ---------------------------------------------------------------------- pure math


def adam_gamma_step(
    gamma: torch.Tensor,
    target: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    alpha: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One FedRC-Adam step of the responsibilities (App. H.3, Eqs. 99-103): the new γ [n, K] and
    moments ν, a from the previous γ, the E-step's target γ̃ and the previous moments.

    ``g = γ − γ̃`` is the pseudo-gradient; the bias correction divides by 1−β (not 1−βᵗ), as
    paper and code do. The result is clamped at 0 and renormalised per sample (a row that would
    sum to 0 keeps its previous γ; with Σ_k g = 0 that cannot happen unless ν = 0).
    """
    g = gamma - target
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    step = alpha * (m / (1 - beta1)) / ((v / (1 - beta2)).sqrt() + eps)
    new = (gamma - step).clamp_min(0)
    total = new.sum(dim=1, keepdim=True)
    tiny = torch.finfo(new.dtype).tiny
    return torch.where(total > 0, new / total.clamp_min(tiny), gamma), m, v


def hard_gamma(gamma: torch.Tensor, k: int) -> torch.Tensor:
    """TrHC's responsibilities: every sample one-hot on cluster ``k`` ([n, K] like ``gamma``)."""
    idx = torch.full((gamma.shape[0],), int(k), dtype=torch.long, device=gamma.device)
    return F.one_hot(idx, gamma.shape[1]).to(gamma.dtype)


def renormalise_rows(gamma: torch.Tensor) -> torch.Tensor:
    """Each sample's γ divided by its sum (Alg. 3 after a removal); an all-zero row uniform."""
    total = gamma.sum(dim=1, keepdim=True)
    uniform = torch.full_like(gamma, 1.0 / max(1, gamma.shape[1]))
    return torch.where(total > 0, gamma / total.clamp_min(torch.finfo(gamma.dtype).tiny), uniform)


def smooth_label_stats(stats: torch.Tensor) -> torch.Tensor:
    """A client's label statistics S [K, C] with 1/C added to every entry (the FedRC-Adam
    code starts its per-client counts at 1/C)."""
    return stats + 1.0 / stats.shape[1]


# ---------------------------------------------------------------------- hyper-parameters


class FedRCParams(FedEMParams):
    label_prior: bool = Field(default=True, description="divide by C_{y,k} in the E-step")
    noise_std: float = Field(default=0.0, ge=0, description="ξ, std of the noise on S")
    test_prior: Literal["server", "none"] = Field(
        default="server", description="label prior of test-only clients' E-step"
    )
    omega_update: Literal["em", "adam"] = Field(
        default="em",
        description="γ/ω update: the E-step's γ (em) or FedRC-Adam's step toward it (adam, "
        "App. H.3; per-sample γ and moments kept by the client)",
    )
    adam_alpha: float = Field(default=1.0, gt=0, description="FedRC-Adam step size α")
    adam_beta1: float = Field(
        default=0.9, ge=0, lt=1, description="FedRC-Adam β₁ (paper 0.9; the code 0.5)"
    )
    adam_beta2: float = Field(
        default=0.99, ge=0, lt=1, description="FedRC-Adam β₂ (paper 0.99; the code 0.5)"
    )
    adam_eps: float = Field(default=1e-8, gt=0, description="FedRC-Adam ε")
    smooth_stats: bool = Field(
        default=False,
        description="add 1/C to every entry of a client's label statistics (the FedRC-Adam code)",
    )
    hard_train: bool = Field(
        default=False,
        description="TrHC: train only the top-ω model, γ one-hot on it (needs hard_predict)",
    )

    @field_validator("hard_train")
    @classmethod
    def _hard_train_predicts_hard(cls, value: bool, info: ValidationInfo) -> bool:
        """TrHC trains and predicts with one model (Table 15): soft prediction is refused."""
        if value and not info.data.get("hard_predict", False):
            raise ValueError(
                "hard_train (TrHC) predicts with the top-ω model too: set hard_predict: true"
            )
        return value


class FedRCFTParams(FedRCParams):
    ft_lr: float | None = Field(default=None, gt=0, description="None: the run's train.lr")
    ft_batch_size: int | None = Field(default=None, ge=1, description="None: train.batch_size")
    ft_epochs: int = Field(default=1, ge=1)
    ft_momentum: float | None = Field(default=None, ge=0, description="None: train.momentum")
    ft_weight_decay: float | None = Field(
        default=None, ge=0, description="None: train.weight_decay"
    )


# ---------------------------------------------------------------------- algorithms

#: the client-state keys of FedRC-Adam (γ and its two moments, each [N_i, K])
ADAM_KEYS = ("gamma", "gamma_m", "gamma_v")


class RCClient(EMClient, total=False):
    gamma: torch.Tensor  # FedRC-Adam: γ of the client's train samples [N_i, K]
    gamma_m: torch.Tensor  # its first moment ν
    gamma_v: torch.Tensor  # its second moment a


@register
class FedRC(FedEM):
    """FedRC: FedEM's EM with the label prior C_{y,k} in the E-step, optional privacy noise on
    the label statistics and the prior given to test-only clients (``test_prior``).

    ``omega_update: adam`` is FedRC-Adam (App. H.3: ``adam_alpha``, ``adam_beta1``,
    ``adam_beta2``, ``adam_eps``; paper defaults, the code's β₁ = β₂ = 0.5 and
    ``smooth_stats``); ``hard_train`` with ``hard_predict`` is TrHC and ``hard_predict`` alone
    TeHC (Table 15). See the module docstring.

    Client state: FedEM's ``omega`` and ``cluster_ids``, plus FedRC-Adam's per-sample ``gamma``
    and its moments ``gamma_m``, ``gamma_v`` [N_i, K] (over the clusters of ``cluster_ids``).
    """

    name = "fedrc"
    paper = (
        'Guo, Tang & Lin, "FedRC: Tackling Diverse Distribution Shifts '
        'Challenge in Federated Learning by Robust Clustering", ICML 2024'
    )
    Params = FedRCParams
    ClientState = RCClient

    @property
    def use_prior(self) -> bool:
        return self.hp.label_prior

    @property
    def noise_std(self) -> float:
        return self.hp.noise_std

    @property
    def test_prior(self) -> str:
        return self.hp.test_prior

    # ------------------------------------------------------------------ FedRC-Adam state
    def live_adam(
        self, server: State, client: State, num_train: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The client's FedRC-Adam state (γ, ν, a), each [N_i, K], over the server's live
        clusters: removed clusters' columns dropped and γ renormalised per sample (Alg. 3);
        None (start afresh) without one, when clusters were added or its sample count changed."""
        gamma = client.get("gamma")
        if gamma is None or gamma.shape[0] != num_train:
            return None
        ids = list(server["cluster_ids"])
        own = list(client.get("cluster_ids", ids))
        if not set(ids) <= set(own):
            return None
        m, v = client["gamma_m"], client["gamma_v"]
        if own == ids:
            return gamma, m, v
        cols = [own.index(i) for i in ids]
        return renormalise_rows(gamma[:, cols]), m[:, cols], v[:, cols]

    def hard_trainable(
        self, server: State, k: int
    ) -> tuple[tuple[int, tuple[str, ...] | None], ...]:
        """What TrHC trains when cluster ``k`` is the client's top one: model ``k`` only."""
        return ((k, None),)

    # ------------------------------------------------------------------ client side
    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        """FedEM's E-step, then (``omega_update: adam``) FedRC-Adam's step toward its γ and
        (``hard_train``) TrHC's one-hot γ on the top-ω model, the only one trained."""
        hp = self.hp
        adam = hp.omega_update == "adam"
        prev = self.live_adam(server, client, data.num_train) if adam else None
        omega = self.live_omega(server, client) if prev is None else omega_from_gamma(prev[0])
        gamma = self._e_step(server, data, omega, self.use_prior)
        info: dict[str, Any] = {}
        if adam and len(gamma):
            if prev is None:  # γ⁰ = 1/K, ν⁰ = a⁰ = 0
                zeros = torch.zeros_like(gamma)
                prev = (torch.full_like(gamma, 1.0 / gamma.shape[1]), zeros, zeros)
            g0, m0, v0 = (t.to(device=gamma.device, dtype=gamma.dtype) for t in prev)
            gamma, m, v = adam_gamma_step(
                g0, gamma, m0, v0, hp.adam_alpha, hp.adam_beta1, hp.adam_beta2, hp.adam_eps
            )
            info["adam"] = (gamma, m, v)
        new_omega = omega_from_gamma(gamma) if len(gamma) else omega
        phases = DEFAULT_PHASES
        if hp.hard_train and len(gamma):
            k = int(torch.argmax(new_omega))
            gamma = hard_gamma(gamma, k)
            phases = (Phase(trainable=self.hard_trainable(server, k)),)
        return LocalTask(
            params=[m["params"] for m in server["models"]],
            buffers=[m["buffers"] for m in server["models"]],
            extras={"gamma": gamma},
            info={"omega": new_omega, **info},
            phases=phases,
        )

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        """FedEM's upload, the label statistics smoothed by 1/C with ``smooth_stats``."""
        up = super().upload(task, params, buffers, data)
        if self.hp.smooth_stats and "label_stats" in up:
            up["label_stats"] = smooth_label_stats(up["label_stats"])
        return up

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        """ω as FedEM keeps it and, for FedRC-Adam, the per-sample γ and its moments."""
        out = super().client_update(server, client, task, result)
        if "adam" in task.info:
            gamma, m, v = task.info["adam"]
            out = {**out, "gamma": gamma, "gamma_m": m, "gamma_v": v}
        return out

    def step_update(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> State:
        """FedEM's reset of ω at a new time step, which resets the FedRC-Adam state too."""
        out = super().step_update(server, client, data, ctx)
        if "omega" in out:
            return out
        return {k: v for k, v in out.items() if k not in ADAM_KEYS}


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
        omega = self.live_omega(server, client)
        gamma = self._e_step(server, data, omega, use_prior)
        trainable = None
        if hp.hard_train:  # TrHC: only the top-ω model is tuned (and predicts)
            k = int(torch.argmax(omega))
            gamma, trainable = hard_gamma(gamma, k), self.hard_trainable(server, k)
        phase = Phase(
            trainable=trainable,
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

    def hard_trainable(
        self, server: State, k: int
    ) -> tuple[tuple[int, tuple[str, ...] | None], ...]:
        """TrHC with one body: the body (read from model 0) and head ``k``."""
        if k == 0:
            return ((0, None),)
        names = list(server["models"][k]["params"])
        body = tuple(n for n in names if n not in self.head_names)
        return ((0, body), (k, tuple(n for n in names if n in self.head_names)))

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
