"""FedEM (Marfoq et al., 2021), the soft-clustering EM that FedRC (Guo, Tang & Lin, ICML 2024;
:mod:`~fedshift.algorithms.fedrc`) extends: K cluster models, per-sample responsibilities γ
and per-client cluster weights ω.

Each round a sampled client runs one E-step with the current global models,
``γ = softmax_k(log ω_k − CE_k − log C_{y,k})`` (FedEM drops the label prior C), sets
``ω = mean_j γ``, trains every cluster model on ``(1/B) Σ_b γ_{b,k} CE_k`` and uploads its
models and its label statistics ``S[k, y] = Σ_j 1{y_j=y} γ_{j,k}``. The server runs an
N_i-weighted FedAvg per cluster and rebuilds C from the latest S of every client that ever
participated (one-round lag, as in the official code). Prediction is ``Σ_k ω_k softmax_k``.

Choices where the paper/code leave room (see the spec, §7):

- *Where γ, ω and S live.* ``client_task`` runs the E-step at the round's start models and
  puts γ in the task's extras (the loss weights); ``upload`` computes S and the γ mass from
  that γ; ``client_update`` keeps ω = mean γ as the client's state.
- *Privacy noise* ``N(0, ξ²)`` is added to S in ``aggregate`` (before it is stored) with a
  generator seeded by (run seed, round, client id): deterministic, executor-independent and
  different for every seed. Negative entries are handled by the server clamp at 1e-8.
- *Adaptive K (Alg. 3)* is checked at the end of ``aggregate`` (= the start of the next round)
  on the latest γ mass Σ_j γ_{j,k} of every client that ever participated (uploaded noise-free
  alongside S). Removed clusters vanish from the models, the prior and the stored statistics;
  clients' ω are reconciled lazily through the live ``server["cluster_ids"]``: the removed
  entries are dropped and ω renormalised (γ is not kept between rounds, so this replaces
  Alg. 3's per-sample renormalisation followed by ω = mean γ; the next E-step recomputes γ).
- *Test-only clients* run ``test_em_iters`` E-steps on their labelled adaptation split at each
  evaluation, with the server's C (``test_prior="server"``) or without it (``"none"``: the
  official code never sends C to test clients). ``test_omega="fresh"`` starts those E-steps
  from uniform ω every time (a new client meeting the final models, the paper's reading);
  ``"carried"`` starts from the ω of the previous round, as the code does: the engine runs
  one such E-step after every round (not only at evaluations), so ω is an EM iteration across
  rounds whatever ``eval.every`` is.
- *Time steps* (drift scenarios): each step starts a new EM, as the code rebuilds its clients:
  ω uniform again, the label prior and its statistics dropped; the models carry on.
- ω is not clamped (as in the code): a weight that underflows to 0 stays 0 for that client. A
  cluster with γ = 0 is still "trained" (zero gradient, but weight decay applies), whereas the
  code skips learners whose ω is exactly 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypedDict

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    ModelOps,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.capabilities import AdaptsTestClients, DriftAware, DriftCheckParams
from fedshift.algorithms.clustered import ClusteredAlgorithm, ClusteredParams
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import Clusters
from fedshift.core.seeds import NOISE_STREAM, generator

#: clamp of the aggregated label statistics before normalisation (official code)
STATS_CLAMP = 1e-8


# ---------------------------------------------------------------------- pure math


def e_step(
    losses: torch.Tensor, log_omega: torch.Tensor, log_prior_yk: torch.Tensor | None = None
) -> torch.Tensor:
    """Responsibilities γ [n, K] = softmax_k(log ω_k − f_{j,k} − log C_{y_j,k}) (Eq. 3, log space).

    ``losses`` [n, K] per-sample losses, ``log_omega`` [K], ``log_prior_yk`` [n, K] holding
    log C_{y_j,k} of each sample's label (None: no label prior, i.e. FedEM).
    """
    logits = log_omega.reshape(1, -1) - losses
    if log_prior_yk is not None:
        logits = logits - log_prior_yk
    return torch.softmax(logits, dim=1)


def omega_from_gamma(gamma: torch.Tensor) -> torch.Tensor:
    """Cluster weights ω [K] = mean over samples of γ."""
    return gamma.mean(dim=0)


def label_statistics(gamma: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """S [K, C] with S[k, c] = Σ_j 1{y_j = c} γ_{j,k}."""
    onehot = F.one_hot(y.long(), num_classes).to(gamma.dtype)
    return gamma.T @ onehot


def normalise_label_stats(stats: torch.Tensor, clamp: float = STATS_CLAMP) -> torch.Tensor:
    """Label prior C [K, C]: the (summed) statistics clamped at ``clamp``, normalised over y."""
    a = stats.clamp_min(clamp)
    return a / a.sum(dim=1, keepdim=True)


def log_prior_of_labels(prior: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log C_{y_j, k} of each sample, [n, K], from the prior [K, C]."""
    return prior.log()[:, y.long()].T


def add_noise(stats: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Label statistics plus N(0, std²) noise (privacy extension, App. E)."""
    if std <= 0:
        return stats
    noise = torch.randn(stats.shape, generator=generator, dtype=stats.dtype)
    return stats + std * noise.to(stats.device)


def adaptive_keep(gamma_mass: torch.Tensor, delta: float) -> torch.Tensor:
    """Alg. 3: keep cluster k unless (1/N) Σ_{i,j} γ_{i,j;k} < δ (bool mask [K]).

    ``gamma_mass`` [K] is Σ_{i,j} γ_{i,j;k}; since Σ_k γ = 1 per sample, N = its sum. The
    heaviest cluster is always kept.
    """
    frac = gamma_mass / gamma_mass.sum().clamp_min(1e-30)
    keep = frac >= delta
    keep[torch.argmax(frac)] = True
    return keep


def drop_clusters(omega: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """ω restricted to the kept clusters and renormalised (uniform if nothing is left)."""
    om = omega[keep]
    s = om.sum()
    if float(s) <= 0:
        return torch.full_like(om, 1.0 / max(1, om.numel()))
    return om / s


# ---------------------------------------------------------------------- hyper-parameters


class FedEMParams(ClusteredParams, DriftCheckParams):
    adaptive_delta: float | None = Field(
        default=None, gt=0, lt=1, description="Alg. 3 threshold δ (None: fixed K)"
    )
    adaptive_after: int = Field(
        default=0, ge=0, description="rounds to wait before the removal check starts"
    )
    hard_predict: bool = Field(default=False, description="predict with the top-ω model (TeHC)")
    test_em_iters: int = Field(default=1, ge=1, description="E-steps of a test-only client")
    test_omega: Literal["fresh", "carried"] = Field(
        default="fresh",
        description="test-only clients' E-steps start from uniform ω at every evaluation "
        "(fresh) or from their ω of the previous evaluation (carried, the code)",
    )


# ---------------------------------------------------------------------- algorithms


class EMServer(Clusters):
    cluster_ids: list[int]  # the original ids of the live clusters
    prior: torch.Tensor | None  # C [K, classes] (FedRC), None before the first round
    label_stats: dict  # client id -> its latest S [K, classes]
    gamma_mass: dict  # client id -> its latest sum of γ [K]
    round: int  # the last aggregated round


class EMClient(TypedDict, total=False):
    omega: torch.Tensor
    cluster_ids: list[int]  # the clusters omega refers to


@register
class FedEM(AdaptsTestClients, DriftAware, ClusteredAlgorithm):
    """FedEM: soft-clustering EM (γ ∝ ω·exp(−loss)), the core FedRC extends with its label
    prior, its noise on the label statistics and the test-only clients' prior (see the module
    docstring). Those three are off here: :attr:`use_prior`, :attr:`noise_std` and
    :attr:`test_prior` are what FedRC overrides.

    Server state: ``models`` (K), ``cluster_ids`` (original ids of the live clusters),
    ``prior`` [K, C] or None, ``label_stats`` {cid: S [K, C]}, ``gamma_mass`` {cid: [K]},
    ``round`` (the last aggregated round).
    Client state: ``omega`` [K], ``cluster_ids`` (the clusters ω refers to).
    """

    name = "fedem"
    paper = (
        'Marfoq et al., "Federated Multi-Task Learning under a Mixture of '
        'Distributions", NeurIPS 2021'
    )
    Params = FedEMParams
    supports_batched = True
    ServerState = EMServer
    ClientState = EMClient
    # FedEM's code and FedRC's, a fork of it (``utils/optim.py``), load each round's models
    # into the client's own learners, whose SGD optimisers (momentum 0.9) live for the whole
    # run; FedDAA's code, a fork of FedRC's, rebuilds its clients at every time step
    reference_train = {"keep_momentum": True}
    reference_train_source = (
        "the FedEM, FedRC and FedDAA code keep each client's SGD optimiser (and its momentum) "
        "across rounds (FedRC's utils/optim.py; FedDAA: within a time step)"
    )

    def __init__(self, hp: FedEMParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)
        self.test_state_carried = hp.test_omega == "carried"  # one E-step per round (the code)

    @property
    def use_prior(self) -> bool:
        """Whether the E-step divides by the label prior C_{y,k} (FedRC)."""
        return False

    @property
    def noise_std(self) -> float:
        """ξ, the std of the privacy noise on the uploaded label statistics (FedRC)."""
        return 0.0

    @property
    def test_prior(self) -> str:
        """The label prior of test-only clients' E-step: ``server`` or ``none`` (FedRC)."""
        return "none"

    def init_server_state(self, init) -> State:
        server = super().init_server_state(init)
        server.update(
            cluster_ids=list(range(len(server["models"]))),
            prior=None,
            label_stats={},
            gamma_mass={},
            round=0,
        )
        return server

    # ------------------------------------------------------------------ ω bookkeeping
    def live_omega(self, server: State, client: State) -> torch.Tensor:
        """The client's ω over the server's live clusters (removed ones dropped, renormalised);
        uniform when it has none or clusters were added since (a new EM, as at a time step)."""
        ids = server["cluster_ids"]
        om = client.get("omega")
        own = client.get("cluster_ids", ids)
        if om is None or not set(ids) <= set(own):
            return torch.full((len(ids),), 1.0 / len(ids))
        if list(own) == list(ids):
            return om
        keep = torch.tensor([i in ids for i in own], device=om.device)
        return drop_clusters(om, keep)

    def _e_step(
        self,
        server: State,
        data: ClientData,
        omega: torch.Tensor,
        use_prior: bool,
        idx: torch.Tensor | None = None,
        y: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """γ over the client's train split (or the samples ``idx`` with labels ``y``)."""
        y = data.y_train if y is None else y
        losses = self.sample_losses(server, data, idx, y)
        log_prior = None
        if use_prior and server.get("prior") is not None:
            log_prior = log_prior_of_labels(server["prior"], y.to(losses.device))
        return e_step(losses, omega.to(losses.device).log(), log_prior)

    def task_logit_models(self, server: State) -> list[tuple[TensorDict, TensorDict]]:
        return self.cluster_models(server)  # the E-step's losses

    # ------------------------------------------------------------------ client side
    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        omega = self.live_omega(server, client)
        gamma = self._e_step(server, data, omega, self.use_prior)
        return LocalTask(
            params=[m["params"] for m in server["models"]],
            buffers=[m["buffers"] for m in server["models"]],
            extras={"gamma": gamma},
            info={"omega": omega_from_gamma(gamma) if len(gamma) else omega},
        )

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """Σ_k (1/B) Σ_b γ_{b,k} CE(model_k(x_b), y_b) (divided by B, not by Σγ: the code)."""
        g = extras["gamma"][batch.pos]
        total = torch.zeros((), device=batch.x.device)
        for k in range(len(params)):
            logits = self.ops.forward(params[k], buffers[k], batch.x)
            ce = F.cross_entropy(logits, batch.y, reduction="none")
            total = total + batch.mean(ce * g[:, k])
        return total

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        """The γ mass per cluster and (FedRC) the label statistics S of the round's E-step."""
        gamma = task.extras["gamma"]
        y = data.y_train if task.y_train is None else task.y_train  # what the client trained on
        up: dict[str, Any] = {"gamma_mass": gamma.sum(dim=0)}
        if self.use_prior:
            up["label_stats"] = label_statistics(gamma, y, self.num_classes)
        return up

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {**client, "omega": task.info["omega"], "cluster_ids": list(server["cluster_ids"])}

    # ------------------------------------------------------------------ time steps
    def start_step(self, server: State, uploads: dict[int, Any], ctx: RoundContext) -> State:
        """A new time step starts a new EM: the label prior and the statistics behind it are
        dropped (the FedRC/FedDAA code rebuilds them at every step)."""
        if ctx.step <= 1:
            return server
        return {**server, "prior": None, "label_stats": {}, "gamma_mass": {}}

    def step_update(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> State:
        """ω starts uniform again at a new time step (the code rebuilds its clients), for a
        client whose data changed (under ``scenario.drift`` the others keep theirs)."""
        if ctx.step <= 1 or data.prev_idx is None:
            return client
        return {k: v for k, v in client.items() if k not in ("omega", "cluster_ids")}

    # ------------------------------------------------------------------ server side
    def _average_models(self, server: State, results: Iterable[ClientResult]) -> list[dict]:
        """Per-cluster FedAvg weighted by N_i over all sampled clients (η_g = 1)."""
        return self.average_per_cluster(server, results, lambda r, k: r.num_samples)

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        uploads: list[tuple[int, Any, Any]] = []

        def tap():
            for r in results:
                uploads.append((r.cid, r.upload.get("label_stats"), r.upload.get("gamma_mass")))
                yield r

        models = self._average_models(server, tap())
        label_stats = dict(server["label_stats"])
        gamma_mass = dict(server["gamma_mass"])
        for cid, stats, mass in uploads:
            if stats is not None:
                gen = generator(self.seed, NOISE_STREAM, ctx.round, cid)
                label_stats[cid] = add_noise(stats, self.noise_std, gen)
            if mass is not None:
                gamma_mass[cid] = mass
        prior = server["prior"]
        if self.use_prior and label_stats:
            prior = normalise_label_stats(torch.stack(list(label_stats.values())).sum(0))
        new = {
            "models": models,
            "cluster_ids": list(server["cluster_ids"]),
            "prior": prior,
            "label_stats": label_stats,
            "gamma_mass": gamma_mass,
            "round": ctx.round,
        }
        if self.hp.adaptive_delta is not None and ctx.round > self.hp.adaptive_after and gamma_mass:
            new = self._remove_clusters(new)
        return new

    def _remove_clusters(self, server: State) -> State:
        """Alg. 3 on the latest γ mass of every client that ever participated."""
        total = torch.stack([m.cpu() for m in server["gamma_mass"].values()]).sum(0)
        keep = adaptive_keep(total, float(self.hp.adaptive_delta))
        if bool(keep.all()):
            return server
        idx = [k for k in range(len(keep)) if keep[k]]
        return {
            "models": [server["models"][k] for k in idx],
            "cluster_ids": [server["cluster_ids"][k] for k in idx],
            "prior": None if server["prior"] is None else server["prior"][idx],
            "label_stats": {c: s[idx] for c, s in server["label_stats"].items()},
            "gamma_mass": {c: m[idx] for c, m in server["gamma_mass"].items()},
            "round": server["round"],
        }

    def round_diagnostics(self, server: State) -> dict[str, Any]:
        """The live clusters by their original ids, and each one's share of the γ mass of every
        client that ever participated (Σ_ij γ_ij;k / Σ_ijk γ_ij;k, what the paper plots for
        adaptive K and what Alg. 3 compares with δ)."""
        out: dict[str, Any] = {
            "num_models": len(server["models"]),
            "cluster_ids": list(server["cluster_ids"]),
        }
        mass = server.get("gamma_mass") or {}
        if mass:
            total = torch.stack([m.detach().cpu().double() for m in mass.values()]).sum(0)
            out["cluster_share"] = [round(float(v), 6) for v in total / total.sum()]
        return out

    # ------------------------------------------------------------------ prediction
    def mixture_weights(self, server: State, client: State) -> list[tuple[int, float]]:
        """(cluster index, weight) pairs of the prediction (soft, or top-ω with hard_predict)."""
        om = self.live_omega(server, client)
        if self.hp.hard_predict:
            return [(int(torch.argmax(om)), 1.0)]
        return [(k, float(w)) for k, w in enumerate(om.tolist()) if w > 0]

    def mixture(self, server: State, client: State, data: ClientData):
        return [
            (w, server["models"][k]["params"], server["models"][k]["buffers"])
            for k, w in self.mixture_weights(server, client)
        ]

    def cluster_of(self, server: State, client: State) -> int | None:
        if client.get("omega") is None:
            return None
        return int(torch.argmax(self.live_omega(server, client)))

    def adapt_test_client(self, server: State, data: ClientData, state: State) -> State:
        """``test_em_iters`` E-steps on the labelled adaptation split, from uniform ω or from
        the previous evaluation's ω (``test_omega``; within a time step, as a new step starts a
        new EM)."""
        K = len(server["models"])
        omega = torch.full((K,), 1.0 / K, device=data.train_idx.device)
        carry = self.hp.test_omega == "carried" and state.get("step", data.step) == data.step
        if carry and state.get("omega") is not None:
            omega = self.live_omega(server, state).to(omega.device)
        out = {"cluster_ids": list(server["cluster_ids"]), "step": data.step}
        if data.num_train == 0:
            return {**out, "omega": omega}
        use_prior = self.use_prior and self.test_prior == "server"
        losses = self.sample_losses(server, data)
        log_prior = None
        if use_prior and server.get("prior") is not None:
            log_prior = log_prior_of_labels(server["prior"], data.y_train.to(losses.device))
        omega = omega.to(losses.device)
        for _ in range(self.hp.test_em_iters):
            omega = omega_from_gamma(e_step(losses, omega.log(), log_prior))
        return {**out, "omega": omega}
