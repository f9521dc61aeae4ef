"""StoCFL (Zeng et al., 2023): stochastic clustered FL. Clients are represented by how a fixed
anchor model moves on their data; clusters merge when their representations point the same
way; cluster models are trained with a proximal pull towards a global model trained alongside.

Facts from the paper (arXiv 2303.00897: its abstract; its full text could not be read where
this was written) and mainly from its authors' code (``dunzeng/StoCFL``, ``StoCFL-FCC+CFL.py``,
``trainer.py``, ``functional.py``) and the FedRC authors' stoCFL (``LINs-lab/FedRC``):

- **Representation.** The server keeps the initial model as a fixed anchor ω_a. The first time
  client i is sampled it trains ω_a on its data for ``obep`` epochs (plain SGD, batch ``obbs``)
  and its representation is ψ_i = ω_a − ω_a^(i), flattened over all parameters. It is computed
  once and kept.
- **Clustering** (stochastic: only on the sampled clients). Every client starts in a cluster
  of its own. In a round, each cluster with sampled members is represented by the mean ψ of
  those members, r_k = mean_{i in S ∩ C_k} ψ_i; every pair of these clusters with
  cos(r_k, r_l) >= ``tau`` is merged (the code sorts the pairs and unites down the list until
  the first pair below τ: the connected components of the graph cos >= τ, single linkage).
- **Training** (the bi-level objective). Each sampled client trains its cluster's model θ_k on

      CE(θ_k; x, y) + lam/2 · ||θ_k − ω||²

  for the run's local epochs, with ω the global model it received, and, separately, the global
  model ω on plain CE (FedAvg). The server averages ω over the sampled clients and θ_k over
  each cluster's sampled members; a cluster with no sampled member keeps its model.
- **New clients** (here: the test-only clients) compute ψ the same way on their labelled split
  and join the cluster whose representation (the mean ψ of all its members) is closest in
  cosine.

Hyper-parameters (the paper's names): ``tau`` = 0.15 (the FedRC authors' stoCFL, ``tol``; the
StoCFL code uses 0.65 on rotated CIFAR-10, 0.2 on its FCC runs and 0.3 as the default of its
command line); ``lam`` = 0.05 (``--mu``, the code's default and its README's CIFAR run);
``obep`` = 10 (the command line's default); ``obbs`` None = the run's batch size (the README:
50); ``weighting`` = ``uniform`` (the code's ``Aggregators.fedavg_aggregate`` without weights).

Choices and differences from the code (documented simplifications):

- *One task per round.* The code first lets new clients compute ψ, merges, then trains from
  the merged clusters' models. Here the client's round is one task: a new client computes ψ
  (on model 2 of its task, the anchor) and trains its singleton cluster's model (which starts
  from the global model, as a new cluster does in the code) in the same round; the merge
  happens at aggregation, where a merged cluster's model is the average of all its sampled
  members' trained models (the code keeps the larger cluster's model and then trains it).
  From the next round on the merged cluster trains as one.
- The ψ phase uses the run's base lr (``train.lr``), no momentum and no weight decay (the
  code's ``torch.optim.SGD(lr)``), for training and test-only clients alike, so every ψ is
  measured the same way.
- ψ lives in the client's state (sent with each upload); the server keeps each cluster's sum
  and count of ψ for the test-only clients. The assignment is server state
  (``assign``: client id -> cluster), because merges happen during aggregation (as CFL).
- Test-only clients join their closest cluster through a fine-tuning task that trains the
  anchor on their adaptation split (``FineTunes``); the FedRC code's stoCFL instead gives them
  the lowest-loss cluster model.
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
    HyperParams,
    LocalTask,
    Phase,
    RoundContext,
    RunningAverage,
    State,
    TensorDict,
    as_float,
)
from fedshift.algorithms.capabilities import FineTunes
from fedshift.algorithms.clustered import ClusteredAlgorithm
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import Clusters


class StoCFLParams(HyperParams):
    tau: float = Field(
        default=0.15, ge=-1, le=1, description="merge clusters whose cosine similarity is >= tau"
    )
    lam: float = Field(default=0.05, ge=0, description="weight of the proximal term to ω")
    obep: int = Field(default=10, ge=1, description="epochs of the anchor training (ψ)")
    obbs: int | None = Field(
        default=None, ge=1, description="batch size of the anchor training (None: the run's)"
    )
    weighting: Literal["samples", "uniform"] = Field(
        default="uniform", description="client weights of the global and cluster averages"
    )


# ---------------------------------------------------------------------- pure math


def flatten(params: TensorDict) -> torch.Tensor:
    """All float parameters as one vector (float32, or the run's float64; in the dict's order)."""
    return torch.cat([as_float(v.detach()).reshape(-1) for v in params.values()])


def representation(anchor: TensorDict, trained: TensorDict) -> torch.Tensor:
    """ψ = ω_a − ω_a^(i): how the anchor moved on the client's data, flattened."""
    return flatten(anchor) - flatten(trained)


def cosine_matrix(reps: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarities of the rows of ``reps`` [m, d] (float64)."""
    u = reps.double()
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return u @ u.T


def connected_groups(adjacent: torch.Tensor) -> list[list[int]]:
    """The connected components of a symmetric boolean adjacency [m, m], each sorted, in the
    order of their smallest member."""
    m = adjacent.shape[0]
    seen: set[int] = set()
    groups = []
    for start in range(m):
        if start in seen:
            continue
        group, todo = [], [start]
        seen.add(start)
        while todo:
            i = todo.pop()
            group.append(i)
            for j in torch.nonzero(adjacent[i]).flatten().tolist():
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        groups.append(sorted(group))
    return groups


def merge_groups(reps: torch.Tensor, tau: float) -> list[list[int]]:
    """StoCFL's merge of clusters with representations ``reps`` [m, d]: groups of rows linked
    by a chain of pairs with cos >= ``tau`` (single linkage)."""
    return connected_groups(cosine_matrix(reps) >= tau)


def proximal_term(params: TensorDict, ref: TensorDict) -> torch.Tensor:
    """sum over parameters of ||w − w_ref||²."""
    return sum(((params[k] - ref[k].detach()) ** 2).sum() for k in ref)


# ---------------------------------------------------------------------- the algorithm


class StoCFLServer(Clusters):
    params: TensorDict  # the global model ω
    buffers: TensorDict
    anchor_params: TensorDict  # the fixed anchor ω_a (the initial model)
    anchor_buffers: TensorDict
    assign: dict  # client id -> cluster index
    rep_sum: list  # per cluster: sum of its members' ψ
    rep_count: list  # per cluster: how many ψ are in the sum


class _StoCFLClientRequired(TypedDict):
    cid: int


class StoCFLClient(_StoCFLClientRequired, total=False):
    rep: torch.Tensor  # ψ, once computed


@register
class StoCFL(FineTunes, ClusteredAlgorithm):
    """Clusters merged by the cosine of anchor-model movements; proximal cluster training."""

    name = "stocfl"
    #: the representation the client uploads
    shared_state_keys = frozenset({"rep"})
    paper = 'Zeng et al., "Stochastic Clustered Federated Learning", arXiv 2023'
    premise = "concepts"
    Params = StoCFLParams
    ServerState = StoCFLServer
    ClientState = StoCFLClient
    hp: StoCFLParams

    def num_initial_models(self) -> int:
        return 1

    def init_server_state(self, init) -> State:
        p, b = init[0]
        return {
            "models": [],
            "params": p,
            "buffers": b,
            "anchor_params": p,
            "anchor_buffers": b,
            "assign": {},
            "rep_sum": [],
            "rep_count": [],
        }

    def init_client_state(self, cid: int) -> State:
        return {"cid": cid}

    # ------------------------------------------------------------------ client side
    def _rep_phase(self) -> Phase:
        t = self.train_defaults
        return Phase(
            loss="rep_loss",
            trainable=((2, None),),
            epochs=self.hp.obep,
            batch_size=self.hp.obbs or t.batch_size,
            lr=t.lr,
            momentum=0.0,
            weight_decay=0.0,
        )

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        k = server["assign"].get(data.cid)
        start = server["models"][k] if k is not None else server
        params = [start["params"], server["params"]]
        buffers = [start["buffers"], server["buffers"]]
        phases = [
            Phase(loss="cluster_loss", trainable=((0, None),)),
            Phase(loss="global_loss", trainable=((1, None),)),
        ]
        rep = client.get("rep")
        if rep is None:  # first participation: the anchor's movement on its data
            params.append(server["anchor_params"])
            buffers.append(server["anchor_buffers"])
            phases.insert(0, self._rep_phase())
        return LocalTask(
            params=params,
            buffers=buffers,
            extras={"global": server["params"]},
            info={"cluster": k, "rep": rep},
            phases=tuple(phases),
        )

    def _ce(self, params, buffers, batch: Batch, m: int) -> torch.Tensor:
        logits = self.ops.forward(params[m], buffers[m], batch.x)
        return batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))

    def rep_loss(self, params, buffers, batch: Batch, extras: dict[str, Any]) -> torch.Tensor:
        """CE of the anchor copy (model 2): its movement is ψ."""
        return self._ce(params, buffers, batch, 2)

    def global_loss(self, params, buffers, batch: Batch, extras: dict[str, Any]) -> torch.Tensor:
        """CE of the global model (model 1)."""
        return self._ce(params, buffers, batch, 1)

    def cluster_loss(self, params, buffers, batch: Batch, extras: dict[str, Any]) -> torch.Tensor:
        """CE of the cluster model (model 0) + lam/2 ||θ − ω||², ω the received global."""
        ce = self._ce(params, buffers, batch, 0)
        return ce + 0.5 * self.hp.lam * proximal_term(params[0], extras["global"])

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        rep = task.info.get("rep")
        if rep is None:
            rep = representation(task.params[2], params[2])
        return {"rep": rep}

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        return {**client, "cid": result.cid, "rep": result.upload["rep"]}

    # ------------------------------------------------------------------ server side
    def _weight(self, r: ClientResult) -> float:
        if r.num_samples <= 0:
            return 0.0
        return 1.0 if self.hp.weighting == "uniform" else float(r.num_samples)

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        models = list(server["models"])
        assign = dict(server["assign"])
        rep_sum, rep_count = list(server["rep_sum"]), list(server["rep_count"])
        g_params, g_buffers = RunningAverage(), RunningAverage()
        sampled: dict[int, list[tuple[float, TensorDict, TensorDict, torch.Tensor]]] = {}
        for r in results:
            k = assign.get(r.cid)
            rep = r.upload["rep"]
            if k is None:  # a new client: a new cluster, started from the global model
                k = len(models)
                models.append({"params": server["params"], "buffers": server["buffers"]})
                rep_sum.append(rep.clone())
                rep_count.append(1)
                assign[r.cid] = k
            w = self._weight(r)
            if w > 0:
                g_params.add(r.params[1], w)
                g_buffers.add(r.buffers[1], w)
            sampled.setdefault(k, []).append((w, r.params[0], r.buffers[0], rep))
        if not sampled:
            return server
        keys = sorted(sampled)
        reps = torch.stack([torch.stack([m[3] for m in sampled[k]]).mean(dim=0) for k in keys])
        for group in merge_groups(reps, self.hp.tau):
            clusters = [keys[i] for i in group]
            target = min(clusters)
            members = [m for k in clusters for m in sampled[k]]
            models[target] = _average(models[target], members)
            for k in clusters:
                if k != target:
                    rep_sum[target] = rep_sum[target] + rep_sum[k]
                    rep_count[target] += rep_count[k]
                    rep_count[k] = 0
            gone = set(clusters) - {target}
            assign = {c: (target if k in gone else k) for c, k in assign.items()}
        # drop the merged-away clusters and renumber the rest
        keep = sorted(set(assign.values()))
        new_index = {k: i for i, k in enumerate(keep)}
        out = {
            **server,
            "models": [models[k] for k in keep],
            "assign": {c: new_index[k] for c, k in assign.items()},
            "rep_sum": [rep_sum[k] for k in keep],
            "rep_count": [rep_count[k] for k in keep],
        }
        if g_params.sums is not None:
            out["params"] = g_params.result()
            out["buffers"] = g_buffers.result() if g_buffers.sums else {}
        return out

    # ------------------------------------------------------------------ prediction
    def _cluster(self, server: State, client: State) -> int | None:
        k = server["assign"].get(client.get("cid"))
        return None if k is None else int(k)

    def mixture(self, server: State, client: State, data: ClientData):
        k = self._cluster(server, client)
        m = server if k is None else server["models"][k]
        return [(1.0, m["params"], m["buffers"])]

    def cluster_of(self, server: State, client: State) -> int | None:
        return self._cluster(server, client)

    def global_model(self, server: State) -> tuple[TensorDict, TensorDict] | None:
        return server["params"], server["buffers"]

    # ------------------------------------------------------------------ new (test-only) clients
    def fine_tune_task(self, server: State, client: State, data: ClientData) -> LocalTask | None:
        """A test-only client computes ψ (the anchor trained on its adaptation split)."""
        if not data.test_only or not server["models"] or data.num_train == 0:
            return None
        params = [server["params"], server["params"], server["anchor_params"]]
        buffers = [server["buffers"], server["buffers"], server["anchor_buffers"]]
        return LocalTask(params=params, buffers=buffers, phases=(self._rep_phase(),))

    def tuned_mixture(
        self, server: State, client: State, data: ClientData, result: ClientResult
    ) -> list:
        k = closest_cluster(result.upload["rep"], server["rep_sum"], server["rep_count"])
        m = server["models"][k]
        return [(1.0, m["params"], m["buffers"])]


def closest_cluster(rep: torch.Tensor, rep_sum: list, rep_count: list) -> int:
    """The cluster whose mean representation has the largest cosine with ``rep``."""
    means = torch.stack([s / max(1, n) for s, n in zip(rep_sum, rep_count, strict=True)])
    return int(cosine_matrix(torch.cat([rep.unsqueeze(0), means]))[0, 1:].argmax())


def _average(model: dict, members: list) -> dict:
    """Weighted average of the members' trained (params, buffers); ``model`` if no weight."""
    p, b = RunningAverage(), RunningAverage()
    for w, params, buffers, _ in members:
        if w > 0:
            p.add(params, w)
            b.add(buffers, w)
    if p.sums is None:
        return model
    return {"params": p.result(), "buffers": b.result() if b.sums else {}}
