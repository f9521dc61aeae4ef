"""DFL (Luo et al., ICML 2022): disentangled federated learning for attribute skew.

Each client holds a two-branch network (:class:`~fedshift.models.two_branch.TwoBranchModel`):
an invariant extractor E_c, the only part the server averages (*invariant aggregation*), a
specific extractor E_s that never leaves the client except to help others, and a classifier P on
``[E_c(x); E_s(x)]``. A sampled client trains in two stages (spec dfl.md §2.6-2.7):

1. *specific stage* (E_c frozen at the received global weights): E_s and P minimise
   ``CE + λ·DT + β_s·Î(E_s; E_c)`` while the critic T_s maximises Î(E_s; E_c) (min-max);
2. *invariant stage* (E_s, P frozen): E_c minimises ``CE + λ·DT − β_c·Î(E_c; E_c^G)`` with
   E_c^G the frozen received global extractor, and the critic T_c maximises the same estimate.

The critics are each stage's adversary (:class:`~fedshift.algorithms.task.Adversary`): at the
start of a stage ``critic_warmup_steps`` critic-only steps (default 0), then on every mini-batch
first ``critic_steps`` Adam steps (lr ``critic_lr``) of the critic on its estimate, encoders
fixed, then the encoders' step against the updated critic, the min-max order of the paper.
Trained by the client's own SGD step instead (lr 0.01, the same step as the encoders), the
critics stayed at the independence value (Î + log 4 ≈ 0.005 after 100 participations; those
runs were not kept: a note, not a measurement).

Î is the Deep InfoMax Jensen-Shannon estimate (:func:`jsd_mutual_information`) on a critic's
score matrix (``critic_kind``: separable, the default, or concat; :mod:`fedshift.models.
two_branch`); ``mi_estimator_s="club"`` replaces the minimised Î_s by CLUB's upper bound, which
is not in the paper (:mod:`fedshift.algorithms.dfl_critics`). DT is *diversity transferring*:
the mean cross-entropy of ``P([E_c(x); E_s^j(x)])`` over other sampled clients j, with their
latest uploaded (frozen) specific extractors E_s^j run on the client's own data. The server
averages E_c (``n_k``- or uniformly weighted) and banks each client's E_s for the others.

The paper leaves these open (spec §7); each is a parameter with the spec's default:

- the classifier is local and trained in stage 1 only (``classifier_in_stage2``), Î_s is not in
  stage 2 (``is_in_stage2``); the critics are local and persistent; donors: every other sampled
  client with a banked E_s (``dt_num_donors`` caps them, drawn per client and round);
- frozen modules run in eval mode (BatchNorm on their running statistics) and are not changed:
  E_c in stage 1, E_s in stage 2, the donors and E_c^G; E_c's BatchNorm statistics are averaged
  with its weights (FedAvg semantics);
- how E_s *minimises* Î(E_s; E_c) (``mi_minimisation``). ``minimax`` (the default) is the
  spec's literal reading: E_s descends the critic's estimate itself while the critic ascends
  it. It is unbounded below on raw features (an earlier version, critics trained by the
  client's SGD on unnormalised features, diverged on Colored-MNIST within ~10 steps: Î_s
  −1.4 → −2e5 → NaN); with the critics' own Adam steps and unit-norm critic inputs it stays
  finite. ``confusion`` has E_s drive the critic to "cannot tell joint from shuffled pairs"
  (:func:`~fedshift.algorithms.mi.critic_confusion`): the same fixed point with a bounded
  gradient. On Colored-MNIST after 100 rounds (``benchmarks/results/
  cpu2_dfl_colored_mnist_reduced``) the runs logged ``mi_s`` = 0.12 (minimax) and −0.32
  (confusion), both read with the stale critic (see the read-outs below); a fresh critic
  pooled over all 20 clients' features (it can read client identity: ceiling 1.185 for 20
  equal clients) read 1.14 for both. The within-client dependence the Î_s term sees was
  measured on 40-round runs (``benchmarks/results/cpu2_dfl_mechanism_reduced``, verdict by
  :mod:`fedshift.tools.dfl_verdict`): E_s depended on E_c within a client as much as in the
  ``beta_s = 0`` control, also under each option tried (critic warm-up with 5 critic steps a
  batch, CLUB, I_s in stage 2);
- the critics read unit-norm features (``critic_normalise``): with that fix alone, a
  bilinear critic on raw features still diverged in round 10 (scores 24 → 1e3 → inf within five
  steps as the features grew), since its scores and SGD steps scale with the features;
- one shared initialisation of the whole network; E_s starts as a fresh draw, not a copy of E_c;
- a client is scored with its own latest model (``eval_invariant="local"``) or with the global
  E_c in place of its own (``"global"``); a client that never trained uses the global E_c with the
  initial E_s and P;
- the ablation of Table 2: ``diversity=False`` is "invariant aggregation only". The paper
  does not say what "diversity transferring only" turns off; three readings are parameters:
  ``aggregation="all"`` (the server averages the whole two-branch model, critics too),
  ``beta_c=0`` (invariant aggregation kept, no I_c term) and ``aggregation="none"`` (nothing
  averaged, clients exchange only E_s; E_c^G is then the client's own start E_c).

Read-outs, per client and averaged over the round (:meth:`DFL.upload`, the server's ``mi``,
the run's history): ``mi_s``, ``mi_c``: the final critics on the client's final features.
``mi_s`` is stale: T_s was trained against the received E_c in eval mode and is read against the E_c
after stage 2, whose weights and BatchNorm statistics moved. ``mi_s_game``: T_s's estimate on
each stage-1 batch right before E_s's step (what the game sees), the mean over stage 1's steps
(recorded by the loss, :func:`~fedshift.algorithms.task.loss_and_values`, so the batched
executor reports it too). ``mi_s_refit``: T_s refitted on the final stage-1 features
(``mi_refit_steps``), read on held-out samples of the client. JSD values are shifted by
log 4, CLUB's are in nats.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedshift.algorithms.base import (
    Adversary,
    Algorithm,
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Phase,
    RoundContext,
    RunningAverage,
    State,
    TensorDict,
    keep_shared,
)
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.dfl_critics import LOG4, critic_loss, estimate, readout, refit_readout
from fedshift.algorithms.dfl_params import DFLParams
from fedshift.algorithms.mi import critic_confusion, jsd_mutual_information
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import GlobalModel, OwnModel
from fedshift.core.seeds import DFL_REFIT_STREAM, generator
from fedshift.models.two_branch import TwoBranchModel

__all__ = ["LOG4", "DFL", "DFLParams", "critic_confusion", "jsd_mutual_information"]


def _sub(params: TensorDict, prefix: str) -> TensorDict:
    """The entries of ``params`` under ``prefix.`` (prefix kept)."""
    return {k: v for k, v in params.items() if k.startswith(prefix + ".")}


def _strip(params: TensorDict, prefix: str) -> TensorDict:
    n = len(prefix) + 1
    return {k[n:]: v for k, v in params.items() if k.startswith(prefix + ".")}


def _detached(params: TensorDict) -> TensorDict:
    return {k: v.detach() for k, v in params.items()}


class _DFLServerRequired(GlobalModel):
    bank: dict  # client id -> its latest (E_s params, buffers), for diversity transferring


class DFLServer(_DFLServerRequired, total=False):
    mi: dict[str, float]  # the last round's mean critic estimates


@register
class DFL(Personalised, Algorithm):
    """Invariant aggregation, MI disentanglement and diversity transferring (two stages)."""

    name = "dfl"
    paper = (
        'Luo et al., "Disentangled Federated Learning for Tackling Attributes '
        'Skew via Invariant Aggregation and Diversity Transferring", ICML 2022'
    )
    ServerState = DFLServer
    ClientState = OwnModel
    premise = "feature_skew"
    Params = DFLParams

    @classmethod
    def adapt_model(cls, model: nn.Module, hp: DFLParams) -> nn.Module:
        kind_s = "club" if hp.mi_estimator_s == "club" else hp.critic_kind
        kinds = (kind_s, hp.critic_kind)
        return TwoBranchModel(model, hp.critic_hidden, hp.critic_out, hp.critic_normalise, kinds)

    @cached_property
    def frozen_body(self) -> nn.Module:
        """An eval-mode copy of the extractor architecture for frozen branches (BatchNorm on
        running statistics, nothing updated)."""
        return copy.deepcopy(self.ops.module.spec).eval()

    def _frozen(self, params: TensorDict, buffers: TensorDict, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.frozen_body, (params, buffers), (x,))

    # ------------------------------------------------------------------ server
    def init_server_state(self, init):
        params, buffers = init[0]
        return {"params": params, "buffers": buffers, "bank": {}}

    def _averaged(self, entries: TensorDict) -> TensorDict:
        """The part of ``entries`` the server averages: E_c (``invariant``), everything
        (``all``) or nothing (``none``)."""
        mode = self.hp.aggregation
        return entries if mode == "all" else _sub(entries, "inv") if mode == "invariant" else {}

    def _global_part(self, state: TensorDict, shared: TensorDict) -> TensorDict:
        """``state`` with the server's averaged entries in place of its own."""
        return {**state, **self._averaged(shared)}

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        params, buffers = RunningAverage(), RunningAverage()
        bank = dict(server["bank"])
        mi: dict[str, list[float]] = {}
        for r in results:
            for k, v in r.upload.items():
                mi.setdefault(k, []).append(v)
            p, b = r.params[0], r.buffers[0]
            if self.hp.diversity:
                bank[r.cid] = (_detached(_strip(p, "spec")), _detached(_strip(b, "spec")))
            w = 0.0 if r.num_samples <= 0 else 1.0
            w = w * (1.0 if self.hp.weighting == "uniform" else r.num_samples)
            if w > 0 and self.hp.aggregation != "none":
                params.add(self._averaged(p), w)
                buffers.add(self._averaged(b), w)
        mi_mean = {k: float(np.mean(v)) for k, v in mi.items()}
        if params.sums is None:
            return {**server, "bank": bank, "mi": mi_mean}
        return {
            "params": {**server["params"], **params.result()},
            "buffers": {**server["buffers"], **(buffers.result() if buffers.sums else {})},
            "bank": bank,
            "mi": mi_mean,
        }

    # ------------------------------------------------------------------ client
    def _start(self, server: State, client: State) -> tuple[TensorDict, TensorDict]:
        """The client's own model (the shared init before it first trains) with the server's
        averaged part received."""
        if "params" not in client:
            return server["params"], server["buffers"]
        return (
            self._global_part(client["params"], server["params"]),
            self._global_part(client["buffers"], server["buffers"]),
        )

    def _donors(self, server: State, cid: int, ctx: RoundContext) -> list[int]:
        """Other sampled clients with a banked E_s, capped at ``dt_num_donors`` (a random
        subset drawn from the run seed, round and client)."""
        donors = [j for j in ctx.sampled if j != cid and j in server["bank"]]
        cap = self.hp.dt_num_donors
        if cap is not None and len(donors) > cap:
            rng = np.random.default_rng([self.seed, 12, ctx.round, cid])
            donors = [donors[i] for i in sorted(rng.permutation(len(donors))[:cap])]
        return donors

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        params, buffers = self._start(server, client)
        ref_p, ref_b = (
            (params, buffers)
            if self.hp.aggregation == "none"
            else (server["params"], server["buffers"])
        )
        donors = self._donors(server, data.cid, ctx) if self.hp.diversity else []
        if donors:
            banked = [server["bank"][j] for j in donors]
            weight = torch.ones(len(donors))
        else:  # one placeholder slot of weight 0 keeps the extras' structure fixed
            banked = [(_strip(params, "spec"), _strip(buffers, "spec"))]
            weight = torch.zeros(1)
        dev = next(iter(params.values())).device
        extras = {
            # E_c^G: the received average (without aggregation: the client's own start E_c)
            "global_inv": (_strip(ref_p, "inv"), _strip(ref_b, "inv")),
            "donor_params": {k: torch.stack([p[k] for p, _ in banked]) for k in banked[0][0]},
            "donor_buffers": {k: torch.stack([b[k] for _, b in banked]) for k in banked[0][1]},
            "donor_weight": weight.to(dev),
        }
        names = [n for n, _ in self.ops.module.named_parameters()]

        def named(*prefixes: str) -> tuple[str, ...]:
            return tuple(n for n in names if n.split(".")[0] in prefixes)

        stage2 = ("inv", "head") if self.hp.classifier_in_stage2 else ("inv",)
        phases = (
            Phase(
                loss="specific_loss",
                trainable=((0, named("spec", "head")),),
                steps=self.hp.specific_steps,
                lr=self.hp.lr_s,
                adversary=self._critic("critic_s_loss", named("critic_s"), self.hp.beta_s),
            ),
            Phase(
                loss="invariant_loss",
                trainable=((0, named(*stage2)),),
                steps=self.hp.invariant_steps,
                lr=self.hp.lr_c,
                adversary=self._critic("critic_c_loss", named("critic_c"), self.hp.beta_c),
            ),
        )
        info = {"round": ctx.round}  # the refit read-out's random stream
        return LocalTask([params], [buffers], extras=extras, info=info, phases=phases)

    def _critic(self, loss: str, names: tuple[str, ...], beta: float) -> Adversary | None:
        """A stage's critic as its adversary (None when its MI term is off)."""
        if beta <= 0:
            return None
        hp = self.hp
        return Adversary(
            loss=loss,
            trainable=((0, names),),
            steps=hp.critic_steps,
            lr=hp.critic_lr,
            optimizer=hp.critic_optimizer,
            warmup_steps=hp.critic_warmup_steps,
        )

    def _classify(self, params: TensorDict, zc: torch.Tensor, zs: torch.Tensor) -> torch.Tensor:
        """``P([zc; zs])``; ``zs`` may be ``[J, B, d]`` (J donors' features of the batch)."""
        return self.ops.call("head", params, {}, zc, zs)

    def _ce(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))

    def _transfer(
        self, params: TensorDict, zc: torch.Tensor, batch: Batch, extras: dict[str, Any]
    ) -> torch.Tensor:
        """Diversity transferring: the donor-weighted mean CE of ``P([zc; E_s^j(x)])``."""
        if not self.hp.diversity or self.hp.lam == 0:
            return zc.new_zeros(())
        zs_d = vmap(self._frozen, in_dims=(0, 0, None))(
            extras["donor_params"], extras["donor_buffers"], batch.x
        )
        ce = vmap(lambda logits: self._ce(logits, batch))(self._classify(params, zc, zs_d))
        w = extras["donor_weight"]
        return (ce * w).sum() / w.sum().clamp_min(1)

    def _mi(self, critic: str, params: TensorDict, a: torch.Tensor, b: torch.Tensor, batch: Batch):
        scores = self.ops.call(critic, params, {}, a, b)
        return jsd_mutual_information(scores, batch.mask)

    def _mi_min(self, params: TensorDict, zs: torch.Tensor, zc: torch.Tensor, batch: Batch):
        """The encoders' term for minimising Î(E_s; E_c) (critic T_s frozen here) and T_s's
        estimate as this step sees it (detached, shifted like ``mi_s``)."""
        out = self.ops.call("critic_s", params, {}, zs, zc)
        est = estimate(self.hp.mi_estimator_s, out, batch.mask)
        seen = est.detach() + (0.0 if self.hp.mi_estimator_s == "club" else LOG4)
        if self.hp.mi_minimisation == "minimax":
            return est, seen
        return critic_confusion(out, batch.mask), seen

    def specific_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """Stage 1: E_s, P and T_s; E_c frozen (eval mode). Records ``mi_s_game``: T_s's
        estimate on the batch right before E_s's step (after T_s's steps on it)."""
        p, b = params[0], buffers[0]
        zc = self._frozen(_strip(p, "inv"), _strip(b, "inv"), batch.x).detach()
        zs = self.ops.call("spec", p, b, batch.x)
        loss = self._ce(self._classify(p, zc, zs), batch)
        loss = loss + self.hp.lam * self._transfer(p, zc, batch, extras)
        if self.hp.beta_s <= 0:
            return loss
        # E_s minimises (T_s, maximising, is the stage's adversary)
        term, seen = self._mi_min(_detached(p), zs, zc, batch)
        loss = loss + self.hp.beta_s * term
        return loss, {"mi_s_game": seen}

    def _stage1_features(self, p: TensorDict, b: TensorDict, x: torch.Tensor):
        """(E_s(x), E_c(x)) of stage 1, both without gradient (what T_s reads)."""
        zc = self._frozen(_strip(p, "inv"), _strip(b, "inv"), x)
        return self.ops.call("spec", p, b, x).detach(), zc.detach()

    def critic_s_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """T_s's step: it ascends Î(E_s; E_c) on the stage-1 features (encoders fixed); with
        CLUB, q(E_c | E_s) ascends its log-likelihood."""
        zs, zc = self._stage1_features(params[0], buffers[0], batch.x)
        if self.hp.mi_estimator_s == "club":
            out = self.ops.call("critic_s", params[0], {}, zs, zc)
            return critic_loss("club", out, batch.mask)
        return -self._mi("critic_s", params[0], zs, zc, batch)

    def critic_c_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """T_c's step: it ascends Î(E_c; E_c^G) (encoders fixed)."""
        p, b = params[0], buffers[0]
        zc = self.ops.call("inv", p, b, batch.x).detach()
        zg = self._frozen(*extras["global_inv"], batch.x).detach()
        return -self._mi("critic_c", p, zc, zg, batch)

    def invariant_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """Stage 2: E_c and T_c (and P with ``classifier_in_stage2``); E_s, E_c^G frozen."""
        p, b = params[0], buffers[0]
        zc = self.ops.call("inv", p, b, batch.x)
        zs = self._frozen(_strip(p, "spec"), _strip(b, "spec"), batch.x).detach()
        loss = self._ce(self._classify(p, zc, zs), batch)
        loss = loss + self.hp.lam * self._transfer(p, zc, batch, extras)
        if self.hp.beta_c > 0:  # E_c maximises (T_c, the stage's adversary, too)
            zg = self._frozen(*extras["global_inv"], batch.x).detach()
            loss = loss - self.hp.beta_c * self._mi("critic_c", _detached(p), zc, zg, batch)
        if self.hp.is_in_stage2 and self.hp.beta_s > 0:
            loss = loss + self.hp.beta_s * self._mi_min(_detached(p), zs, zc, batch)[0]
        return loss

    @torch.no_grad()
    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        """The trained critics' estimates on the client's first ``mi_probe_samples`` train
        samples, shifted by log 4 (0: independent, up to log 4 ≈ 1.386; CLUB's unshifted):
        ``mi_s`` = Î(E_s; E_c), ``mi_c`` = Î(E_c; E_c^G), all branches in eval mode, and
        ``mi_s_refit`` (:meth:`_refit`). ``mi_s`` is stale: T_s was trained in stage 1 against
        the received E_c, but is read here against the E_c after stage 2, whose weights and
        BatchNorm statistics moved; its values (negative ones included) are no measurement of
        the dependence stage 1 minimised. ``mi_s_game`` (recorded by :meth:`specific_loss`)
        and ``mi_s_refit`` are."""
        n = min(self.hp.mi_probe_samples, data.num_train)
        if n < 2:
            return {}
        x = data.inputs(data.train_idx[:n])
        p, b = params[0], buffers[0]
        zc = self._frozen(_strip(p, "inv"), _strip(b, "inv"), x)
        zs = self._frozen(_strip(p, "spec"), _strip(b, "spec"), x)
        zg = self._frozen(*task.extras["global_inv"], x)
        mi_s = readout(self.hp.mi_estimator_s, self.ops.call("critic_s", p, {}, zs, zc))
        mi_c = jsd_mutual_information(self.ops.call("critic_c", p, {}, zc, zg))
        return {"mi_s": mi_s, "mi_c": float(mi_c) + LOG4, **self._refit(task, p, b, data)}

    def _refit(self, task: LocalTask, p: TensorDict, b: TensorDict, data: ClientData):
        """``mi_s_refit``: T_s's final weights trained ``mi_refit_steps`` more Adam steps on the
        final stage-1 features, E_s after stage 1 (unchanged by stage 2) against the E_c that
        stage 1 saw (the received one, in eval mode), of the client's train samples after its
        first ``min(mi_probe_samples, n / 2)``, then read on those held-out first ones. Any
        critic's held-out JSD estimate is a lower bound: one that overfits a small fit set
        reads below 0 (a loose bound, not negative dependence)."""
        hp, n = self.hp, data.num_train
        n_read = min(hp.mi_probe_samples, n // 2)
        if hp.mi_refit_steps == 0 or n_read < 2 or n - n_read < 2:
            return {}
        e_s = (_strip(p, "spec"), _strip(b, "spec"))
        e_c = (_strip(task.params[0], "inv"), _strip(task.buffers[0], "inv"))

        def features(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            xs = [data.inputs(i) for i in idx.split(data.eval_batch)]
            return tuple(torch.cat([self._frozen(*e, x) for x in xs]) for e in (e_s, e_c))

        gen = generator(self.seed, DFL_REFIT_STREAM, task.info.get("round", 0), data.cid)
        critic = self.ops.module.get_submodule("critic_s")
        fit, held_out = features(data.train_idx[n_read:]), features(data.train_idx[:n_read])
        args = (hp.mi_refit_steps, hp.mi_refit_batch, hp.critic_lr, gen)
        est = refit_readout(critic, _strip(p, "critic_s"), hp.mi_estimator_s, fit, held_out, *args)
        return {"mi_s_refit": est}

    def shared_result_names(self, entries: TensorDict) -> frozenset[str]:
        """The names of the entries that leave the client: what the server averages (E_c, by
        ``aggregation``) and, with ``diversity``, E_s for the bank."""
        bank, averaged = self.hp.diversity, self._averaged(entries)
        return frozenset(k for k in entries if (bank and k.startswith("spec.")) or k in averaged)

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """See :meth:`shared_result_names`; the classifier and the critics stay on the client."""
        names = self.shared_result_names
        return keep_shared(
            result,
            names={0: names(result.params[0])},
            buffer_names={0: names(result.buffers[0])},
        )

    def private_state(self, client: State) -> State:
        """The local model's entries that are not uploaded (the classifier, the critics)."""

        def own(m: TensorDict) -> TensorDict:
            sent = self.shared_result_names(m)
            return {k: v for k, v in m.items() if k not in sent}

        return {"params": own(client.get("params", {})), "buffers": own(client.get("buffers", {}))}

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {"params": result.params[0], "buffers": result.buffers[0]}

    def round_diagnostics(self, server: State) -> dict[str, Any]:
        """The mean over the last round's clients of their uploaded estimates (``mi_s``,
        ``mi_c``, ``mi_s_game``, ``mi_s_refit``; see :meth:`upload`)."""
        return dict(server.get("mi", {}))

    # ------------------------------------------------------------------ prediction
    def mixture(self, server: State, client: State, data: ClientData):
        if self.hp.eval_invariant == "global" and "params" in client and not data.test_only:
            return [(1.0, *self._start(server, client))]
        return self.own_mixture(server, client, data)
