"""FedDrift (Jothimurugesan et al., AISTATS 2023), as FedDAA compares against it: clustered FL
that detects drift locally by a rise of the loss, isolates drifted clients into new clusters and
merges clusters hierarchically by a loss distance.

At the start of every time step each client evaluates every cluster model on its new data
(``losses``) and its own cluster's model on its previous data (``prev_loss``). Then:

1. **Merge** (:func:`merge_clusters`): for clusters i, j holding clients this step, with
   L_i(w) the sample-weighted mean loss of model w over cluster i's clients,
   D(i, j) = max(L_i(w_j) - L_i(w_i), L_j(w_i) - L_j(w_j)); the closest pair is merged while
   its distance is below ``merge_threshold`` (complete linkage: a merged cluster is as far from
   another as the farther of its parts); a merged model is the sample-weighted average.
2. **Detect** (:func:`detect_by_loss`): a client has drifted when the loss of its cluster's
   model rose by more than ``detect_threshold`` from its previous data to its new data.
3. **Isolate**: each drifted client gets a new cluster with a fresh model (while fewer than
   ``max_clusters``; beyond that it joins its lowest-loss cluster); the others keep their
   (merged) cluster. At the first step every client takes its lowest-loss model.

Clients train their cluster's model on their current data only; the server averages each
cluster over its clients (sample-weighted, IFCA's step); a test task uses its lowest-loss
model. The FedDAA paper gives no thresholds: the defaults here (0.5 nats for both, at most 16
clusters) are ours, and every one is a parameter.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from fedshift.algorithms.base import ClientData, LocalTask, RoundContext, State
from fedshift.algorithms.ifca import HardClusterAlgorithm, HardClusterParams, one_hot
from fedshift.algorithms.registry import register
from fedshift.seeds import FEDDRIFT_STREAM, derive_seed


class FedDriftParams(HardClusterParams):
    num_clusters: int = Field(default=2, ge=1, description="models at the first step")
    detect_threshold: float = Field(default=0.5, ge=0, description="loss rise that is drift")
    merge_threshold: float = Field(default=0.5, ge=0, description="merge below this distance")
    max_clusters: int = Field(default=16, ge=1, description="no new clusters beyond this")


# ---------------------------------------------------------------------- the math


def cluster_losses(losses: torch.Tensor, owner: list[int], weights: torch.Tensor, k: int):
    """L[i, j]: the weighted mean loss of model j over the clients of cluster i ([k, k]; NaN
    rows for clusters without clients). ``losses`` [clients, k], ``owner`` each one's cluster."""
    out = torch.full((k, k), float("nan"), dtype=torch.float64)
    own = torch.tensor(owner)
    for i in range(k):
        sel = own == i
        if sel.any():
            w = weights[sel].double()
            out[i] = (losses[sel].double() * w[:, None]).sum(0) / w.sum()
    return out


def loss_distance(L: torch.Tensor, i: int, j: int) -> float:
    """D(i, j) = max(L_i(w_j) - L_i(w_i), L_j(w_i) - L_j(w_j))."""
    return float(max(L[i, j] - L[i, i], L[j, i] - L[j, j]))


def merge_clusters(L: torch.Tensor, threshold: float) -> list[list[int]]:
    """Complete-linkage merging of the clusters with clients (finite rows of ``L``) while the
    closest pair is nearer than ``threshold``: the groups of original cluster indices (each
    sorted, in order of their smallest member); clusters without clients stay alone."""
    k = L.shape[0]
    groups = [[i] for i in range(k)]
    live = [i for i in range(k) if torch.isfinite(L[i, i])]
    dist = {(i, j): loss_distance(L, i, j) for a, i in enumerate(live) for j in live[a + 1 :]}
    while dist:
        (i, j), d = min(dist.items(), key=lambda kv: (kv[1], kv[0]))
        if not d < threshold:
            break
        groups[i] += groups[j]
        groups[j] = []
        for m in list(live):
            if m in (i, j):
                continue
            a, b = (min(i, m), max(i, m)), (min(j, m), max(j, m))
            dist[a] = max(dist.get(a, float("-inf")), dist.pop(b, float("-inf")))
        dist = {key: v for key, v in dist.items() if j not in key}
        live.remove(j)
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def detect_by_loss(new_loss: float, prev_loss: float, threshold: float) -> bool:
    """Drift: the loss of the client's model rose by more than ``threshold``."""
    return new_loss - prev_loss > threshold


def average_models(models: list[dict], weights: list[float]) -> dict:
    """The weighted average of models (params and float buffers)."""
    total = float(sum(weights))

    def avg(key: str) -> dict:
        out = {}
        for n, v in models[0][key].items():
            if torch.is_floating_point(v):
                out[n] = sum(m[key][n] * (w / total) for m, w in zip(models, weights, strict=True))
            else:
                out[n] = v
        return out

    return {"params": avg("params"), "buffers": avg("buffers")}


# ---------------------------------------------------------------------- the algorithm


@register
class FedDrift(HardClusterAlgorithm):
    """Loss-based drift detection, isolation into new clusters, hierarchical merging."""

    name = "feddrift"
    Params = FedDriftParams
    hp: FedDriftParams

    def _loss(self, model: dict, data: ClientData, idx, y) -> float:
        if idx is None or len(idx) == 0:
            return float("nan")
        logits = self.ops.logits(
            model["params"], model["buffers"], data.inputs, idx, data.eval_batch
        )
        return float(torch.nn.functional.cross_entropy(logits.float(), y.to(logits.device)))

    def step_upload(self, server: State, client: State, data: ClientData, ctx: RoundContext):
        """Every model's loss on the new data; the own model's on the previous data."""
        models = server["models"]
        losses = torch.tensor([self._loss(m, data, data.train_idx, data.y_train) for m in models])
        own = client.get("cluster")
        prev = float("nan")
        if own is not None and own < len(models):
            prev = self._loss(models[own], data, data.prev_idx, data.prev_y)
        return {"losses": losses, "own": own, "prev_loss": prev, "n": data.num_train}

    def start_step(self, server: State, uploads: dict[int, Any], ctx: RoundContext) -> State:
        """Merge, detect, isolate (see the module doc); the assignment goes to the clients."""
        hp, models = self.hp, list(server["models"])
        cids = sorted(uploads)
        losses = torch.stack([uploads[c]["losses"] for c in cids])
        if ctx.step <= 1 or any(uploads[c]["own"] is None for c in cids):
            best = losses.argmin(dim=1).tolist()
            return {**server, "assign": dict(zip(cids, best, strict=True)), "drifted": {}}
        owner = [uploads[c]["own"] for c in cids]
        weights = torch.tensor([float(uploads[c]["n"]) for c in cids])
        groups = merge_clusters(
            cluster_losses(losses, owner, weights, len(models)), hp.merge_threshold
        )
        mass = {i: float(weights[[o == i for o in owner]].sum()) for i in range(len(models))}
        new_index, merged = {}, []
        for g in groups:
            for i in g:
                new_index[i] = len(merged)
            merged.append(
                models[g[0]]
                if len(g) == 1
                else average_models([models[i] for i in g], [max(mass[i], 1e-12) for i in g])
            )
        assign, drifted = {}, {}
        dev = next(iter(models[0]["params"].values())).device
        for c, own in zip(cids, owner, strict=True):
            up = uploads[c]
            drifted[c] = detect_by_loss(
                float(up["losses"][own]), up["prev_loss"], hp.detect_threshold
            )
            if drifted[c] and len(merged) < hp.max_clusters:
                p, b = self.ops.init(derive_seed(self.seed, FEDDRIFT_STREAM, ctx.step, c))
                merged.append({"params": {n: v.to(dev) for n, v in p.items()}, "buffers": b})
                assign[c] = len(merged) - 1
            elif drifted[c]:
                assign[c] = new_index[int(up["losses"].argmin())]
            else:
                assign[c] = new_index[own]
        return {**server, "models": merged, "assign": assign, "drifted": drifted}

    def step_update(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> State:
        k = server["assign"].get(data.cid, client.get("cluster", 0))
        return {
            "cluster": k,
            "omega": one_hot(k, len(server["models"])),
            "drifted": server["drifted"].get(data.cid),
        }

    def drift_flag(self, client: State) -> bool | None:
        return client.get("drifted")

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        k = int(client.get("cluster", 0))
        m = server["models"][k]
        return LocalTask(params=[m["params"]], buffers=[m["buffers"]], info={"cluster": k})
