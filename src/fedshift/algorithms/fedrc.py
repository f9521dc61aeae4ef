"""FedRC (Guo, Tang & Lin, ICML 2024) and FedEM (Marfoq et al., 2021): soft clustering with K
cluster models, per-sample responsibilities γ and per-client cluster weights ω.

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
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Mixture,
    ModelOps,
    Params,
    Phase,
    RoundContext,
    RunningAverage,
    State,
)
from fedshift.algorithms.clustered import ClusteredAlgorithm, ClusteredParams
from fedshift.algorithms.registry import register
from fedshift.seeds import FEDRC_FT_STREAM, NOISE_STREAM, generator

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


class FedEMParams(ClusteredParams):
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
class FedRC(ClusteredAlgorithm):
    """FedRC: robust-clustering EM with the label prior C_{y,k} (see the module docstring).

    Server state: ``models`` (K), ``cluster_ids`` (original ids of the live clusters),
    ``prior`` [K, C] or None, ``label_stats`` {cid: S [K, C]}, ``gamma_mass`` {cid: [K]},
    ``round`` (the last aggregated round).
    Client state: ``omega`` [K], ``cluster_ids`` (the clusters ω refers to).
    """

    name = "fedrc"
    Params = FedRCParams
    personalised = False
    supports_batched = True

    def __init__(self, hp: FedEMParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)
        self.use_prior = bool(getattr(hp, "label_prior", False))
        self.noise_std = float(getattr(hp, "noise_std", 0.0))
        self.test_prior = getattr(hp, "test_prior", "none")
        self.test_state_carried = hp.test_omega == "carried"  # one E-step per round (the code)

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
        self, params: list[Params], buffers: list[Params], batch: Batch, extras: dict[str, Any]
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
        self, task: LocalTask, params: list[Params], buffers: list[Params], data: ClientData
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
        """ω starts uniform again at a new time step (the code rebuilds its clients)."""
        if ctx.step <= 1:
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


@register
class FedEM(FedRC):
    """FedEM: FedRC without the label prior (γ ∝ ω·exp(−loss)), no label statistics."""

    name = "fedem"
    Params = FedEMParams


@register
class FedRCFT(FedRC):
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

    def __init__(self, hp: FedRCParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)
        from fedshift.models import head_param_names

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

    def _combine(self, head: Params, body: Params, head_keys: set[str]) -> Params:
        return {k: (head[k] if k in head_keys else body[k]) for k in head}

    def local_loss(
        self, params: list[Params], buffers: list[Params], batch: Batch, extras: dict[str, Any]
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
            hp_ = {**bp, **(heads_p[k].result() if heads_p[k].sums else {})}
            hb = {**bb, **(heads_b[k].result() if heads_b[k].sums else {})}
            tmpl = server["models"][k]
            out.append(
                {
                    "params": {n: hp_[n] for n in tmpl["params"]},
                    "buffers": {n: hb[n] for n in tmpl["buffers"]},
                }
            )
        return out
