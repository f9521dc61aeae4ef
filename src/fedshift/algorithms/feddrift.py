"""FedDrift (Jothimurugesan et al., AISTATS 2023) as its authors' code runs it
(microsoft/FedDrift, the ``softcluster`` method with the ``H_A_C_<h_w>_<δ>_<δ'>`` options:
``FedAvgEnsDataLoader.py``, ``FedAvgEnsAggregatorSoftCluster.py``,
``FedAvgEnsTrainerSoftCluster.py``): clustered FL that detects drift locally by a drop of
accuracy, isolates drifted clients in new models and merges models hierarchically.

Each (client, time step) piece of data belongs to one model, fixed when it arrives (merges
move it). At the start of every step, each client measures every model's accuracy on its new
training data (``step_upload``), and the server (``start_step``):

1. **Isolation ends**: a model created at step s stays isolated until step s + ``h_w``; until
   then no other client may join it and it may not merge.
2. **Detection** (:func:`drifted`): a client whose model is not isolated takes the model with
   the best accuracy on its new data among the models in use (not isolated, holding data);
   it has drifted when that accuracy is more than ``delta`` below its last recorded one
   (recorded the same way at its last step; at the first step, the initial models' accuracy,
   so no client can drift at step 2, as in the code).
3. **Isolation**: a drifted client gets a new model, a *copy of its best model*, one per
   drifted client; a client that did not drift moves to its best model. At ``max_clusters``
   models, the least recently used model not used this step is evicted (its data drops out
   of training); if there is none, the client stays on its best model.
4. **Merge** (:func:`merge_groups`): for models i, j in use, with A[i, j] the accuracy of
   model i on all the data assigned to model j (every client and step so far),
   D(i, j) = max(A[i, i] - A[i, j], A[j, j] - A[j, i], 0); complete linkage, merged while
   D <= ``merge_delta``. A merged model is the average weighted by the number of (client,
   step) pieces each part holds; the pieces move to it.

Training: a client trains its model on *all* its data assigned to that model (every step it
held it, not only the current one; ``train_on="current"`` is the code's ``softclusterwin-1``);
the server averages each model over its clients by the samples they trained on. Prediction: a
client its model, a test task the model with the lowest loss on its adaptation split.

Defaults are the code's FedDrift setting in its README's algorithm list (``H_A_F_1_06_0``):
δ = δ' = 0.06, h_w = 1, complete linkage, distance "A". Deviations: the code's ``F`` variant
starts every client on a model of its own (it needs as many models as clients); here, as in its
``C`` variant and the FedDAA paper's setting, the run starts with ``num_clusters`` (2) models
and each client on the one that scores best. The code trains every model a client ever held on
that model's share of its history (each model x the client's whole history per round); here a
client trains only the model it holds now, on its share. The code measures merge distances on
at most 21 batches of each model's data; here on all of it. Its model cap is a command-line
argument (``--concept_num``); ``max_clusters`` (16) is ours.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from fedshift.algorithms.base import ClientData, LocalTask, RoundContext, State, weighted_average
from fedshift.algorithms.capabilities import DriftAware, DriftCheckParams
from fedshift.algorithms.ifca import HardClusterAlgorithm, HardClusterParams, one_hot
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import Clusters, HardAssignment


class FedDriftParams(HardClusterParams, DriftCheckParams):
    num_clusters: int = Field(default=2, ge=1, description="models at the first step")
    delta: float = Field(
        default=0.06, ge=0, le=1, description="drift: the best accuracy fell by more than this"
    )
    merge_delta: float | None = Field(
        default=None, ge=0, description="merge at most this accuracy distance (None: delta)"
    )
    h_w: int = Field(default=1, ge=0, description="steps a new model stays isolated")
    max_clusters: int = Field(default=16, ge=1, description="models at most (then LRU eviction)")
    train_on: Literal["all", "current"] = Field(
        default="all", description="a client's data of its model: every step's, or the current"
    )


# ---------------------------------------------------------------------- the math


def drifted(last_acc: float, best_acc: float, delta: float) -> bool:
    """Drift: the best model's accuracy fell by more than ``delta`` from the last recorded."""
    return last_acc - best_acc > delta


def accuracy_distance(A: np.ndarray, i: int, j: int) -> float:
    """D(i, j) = max(A[i, i] - A[i, j], A[j, j] - A[j, i], 0); ``A[i, j]``: model i's accuracy
    on model j's data."""
    return float(max(A[i, i] - A[i, j], A[j, j] - A[j, i], 0.0))


def merge_groups(A: np.ndarray, threshold: float) -> list[list[int]]:
    """Complete-linkage groups of the models of ``A`` ([M, M]) whose distances are at most
    ``threshold`` (each group sorted, groups in order of their first member)."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    m = len(A)
    if m < 2:
        return [[i] for i in range(m)]
    dist = np.array([[accuracy_distance(A, i, j) for j in range(m)] for i in range(m)])
    labels = fcluster(linkage(squareform(dist, checks=False), "complete"), threshold, "distance")
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(labels.tolist()):
        groups.setdefault(g, []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def copy_model(model: dict) -> dict:
    return {
        "params": {k: v.clone() for k, v in model["params"].items()},
        "buffers": {k: v.clone() for k, v in model["buffers"].items()},
    }


# ---------------------------------------------------------------------- the algorithm


class FedDriftServer(Clusters):
    ids: list[int]
    isolated: dict
    history: dict
    assign: dict
    last_acc: dict
    last_used: dict
    drifted: dict


class FedDriftClient(HardAssignment, total=False):
    data: dict  # step -> the step's training data it keeps
    drifted: bool


@register
class FedDrift(DriftAware, HardClusterAlgorithm):
    """Accuracy-drop drift detection, isolation in copies, hierarchical merging (module doc).

    Server state besides ``models``: ``ids`` (a stable id per model), ``isolated`` {id: the
    step its isolation ends}, ``history`` {client: {step: id}} (which model each piece of data
    belongs to), ``assign`` {client: id}, ``last_acc`` {client: accuracy}, ``last_used``
    {id: step}, ``drifted`` {client: flag}. Client state: ``data`` {step: (indices, labels)},
    its own data of every step, and ``cluster`` / ``omega`` / ``drifted``.
    """

    name = "feddrift"
    paper = (
        'Jothimurugesan et al., "Federated Learning under Distributed Concept Drift", AISTATS 2023'
    )
    Params = FedDriftParams
    ServerState = FedDriftServer
    ClientState = FedDriftClient
    hp: FedDriftParams

    def init_server_state(self, init) -> State:
        server = super().init_server_state(init)
        n = len(server["models"])
        server.update(
            ids=list(range(n)),
            isolated={},
            history={},
            assign={},
            last_acc={},
            last_used={},
            drifted={},
        )
        return server

    def _correct(self, model: dict, data: ClientData, idx, y) -> int:
        logits = self.ops.logits(
            model["params"], model["buffers"], data.inputs, idx, data.eval_batch
        )
        return int((logits.argmax(dim=1) == y.to(logits.device)).sum())

    def step_upload(self, server: State, client: State, data: ClientData, ctx: RoundContext):
        """Every model's correct count on the new data and on each earlier step's data."""
        pieces = {**client.get("data", {}), ctx.step: (data.train_idx, data.y_train)}
        return {
            "correct": {
                s: [self._correct(m, data, i, y) for m in server["models"]]
                for s, (i, y) in pieces.items()
            },
            "n": {s: len(y) for s, (_, y) in pieces.items()},
        }

    def start_step(self, server: State, uploads: dict[int, Any], ctx: RoundContext) -> State:
        """Isolation ends, detection, isolation, merge (see the module doc)."""
        t, hp = ctx.step, self.hp
        s = {k: (dict(v) if isinstance(v, dict) else list(v)) for k, v in server.items()}
        s["history"] = {c: dict(h) for c, h in s["history"].items()}
        pos = {i: p for p, i in enumerate(s["ids"])}

        def acc(c: int, i: int) -> float:
            return uploads[c]["correct"][t][pos[i]] / max(1, uploads[c]["n"][t])

        s["isolated"] = {i: end for i, end in s["isolated"].items() if end > t}
        held = {i for h in s["history"].values() for i in h.values()}
        in_use = [i for i in s["ids"] if i in held and i not in s["isolated"]] or list(s["ids"])
        s["drifted"] = {}
        for c in sorted(uploads):
            own = s["assign"].get(c)
            # evictions at the cap may have taken models: then any model measured this step
            live = [i for i in in_use if i in s["ids"]] or [i for i in s["ids"] if i in pos]
            if own in s["isolated"] or not live:  # still isolated: stays, no detection
                k = own if own in s["ids"] else s["ids"][0]
            else:
                best = max(live, key=lambda i: (acc(c, i), -i))
                k = best
                if t > 1 and drifted(s["last_acc"].get(c, 0.0), acc(c, best), hp.delta):
                    s["drifted"][c] = True
                    k = self._new_model(s, best, t)
                else:
                    s["drifted"][c] = False
                s["last_acc"][c] = acc(c, best)
            s["assign"][c] = k
            s["history"].setdefault(c, {})[t] = k
            s["last_used"][k] = t
        if t > 1:
            self._merge(s, uploads, pos)
        return s

    def _new_model(self, s: State, best: int, t: int) -> int:
        """A copy of model ``best``, isolated until step t + h_w; at the cap, in the slot of
        the least recently used model not used at step t (``best`` when there is none)."""
        src = s["models"][s["ids"].index(best)]
        if len(s["models"]) >= self.hp.max_clusters:
            free = [i for i in s["ids"] if s["last_used"].get(i, -1) < t and i not in s["isolated"]]
            if not free:
                return best
            old = min(free, key=lambda i: (s["last_used"].get(i, -1), i))
            p = s["ids"].index(old)
            del s["models"][p], s["ids"][p]
            s["last_used"].pop(old, None)
            for h in s["history"].values():  # the evicted model's data drops out
                for step in [st for st, i in h.items() if i == old]:
                    del h[step]
        new = max(s["ids"]) + 1
        s["models"].append(copy_model(src))
        s["ids"].append(new)
        s["isolated"][new] = t + self.hp.h_w
        return new

    def _merge(self, s: State, uploads: dict[int, Any], pos: dict[int, int]) -> None:
        """Complete-linkage merging of the models in use (module doc, step 4)."""
        cand = [i for i in s["ids"] if i in pos and i not in s["isolated"]]
        hits = {i: np.zeros(len(pos)) for i in cand}  # model j's data: correct counts per model
        size = dict.fromkeys(cand, 0)
        pieces = dict.fromkeys(cand, 0)
        for c, h in s["history"].items():
            for step, j in h.items():
                if j in hits and c in uploads and step in uploads[c]["n"]:
                    hits[j] += np.asarray(uploads[c]["correct"][step], dtype=float)
                    size[j] += uploads[c]["n"][step]
                    pieces[j] += 1
        cand = [i for i in cand if size[i] > 0]
        if len(cand) < 2:
            return
        A = np.array([[hits[j][pos[i]] / size[j] for j in cand] for i in cand])
        threshold = self.hp.delta if self.hp.merge_delta is None else self.hp.merge_delta
        for group in merge_groups(A, threshold):
            if len(group) < 2:
                continue
            members = [cand[g] for g in group]
            base = min(members)
            models = [s["models"][s["ids"].index(i)] for i in members]
            w = [float(pieces[i]) for i in members]
            s["models"][s["ids"].index(base)] = {
                "params": weighted_average([m["params"] for m in models], w),
                "buffers": weighted_average([m["buffers"] for m in models], w)
                if models[0]["buffers"]
                else {},
            }
            gone = set(members) - {base}
            for i in gone:
                p = s["ids"].index(i)
                del s["models"][p], s["ids"][p]
                s["last_used"][base] = max(s["last_used"].get(base, 0), s["last_used"].pop(i, 0))
            for h in s["history"].values():
                for step, i in h.items():
                    if i in gone:
                        h[step] = base
            s["assign"] = {c: (base if i in gone else i) for c, i in s["assign"].items()}

    def step_update(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> State:
        """The client's model and flag; its new data joins its own record of every step (data
        that did not change since the last check, ``scenario.drift``, is not added again)."""
        k = server["ids"].index(server["assign"][data.cid])
        pieces = dict(client.get("data", {}))
        if data.prev_idx is not None or not pieces:
            pieces[ctx.step] = (data.train_idx, data.y_train)
        return {
            "data": pieces,
            "cluster": k,
            "omega": one_hot(k, len(server["models"])),
            "drifted": server["drifted"].get(data.cid),
        }

    def drift_flag(self, client: State) -> bool | None:
        return client.get("drifted")

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        """The client's model, trained on its data of every step it belongs to that model."""
        own = server["assign"].get(data.cid, server["ids"][0])
        k = server["ids"].index(own)
        m = server["models"][k]
        mine = server["history"].get(data.cid, {})
        steps = [st for st in sorted(client.get("data", {})) if mine.get(st) == own]
        idx = y = None
        if self.hp.train_on == "all" and len(steps) > 1:
            idx = torch.cat([client["data"][st][0] for st in steps])
            y = torch.cat([client["data"][st][1] for st in steps])
        return LocalTask(
            params=[m["params"]],
            buffers=[m["buffers"]],
            info={"cluster": k},
            train_idx=idx,
            y_train=y,
        )
