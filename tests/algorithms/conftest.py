"""Shared helpers of the algorithm tests: a linear model on five points (SCAFFOLD, FedDyn,
FedNova), DFL's small setups and hostile clients (norm-bounded aggregation)."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    RoundContext,
)
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, sim_config
from tests.conftest import tiny_config

X = torch.tensor([[1.0, -0.5], [0.3, 0.8], [-1.2, 0.4], [0.5, 0.5], [-0.2, -1.0]])


Y = torch.tensor([0, 1, 1, 0, 1])


class LinearNet(nn.Module):
    """Logits ``W x + b`` of 2 inputs and 2 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x, return_features=False):
        logits = self.fc(x)
        return (x, logits) if return_features else logits


def linear_data(eval_batch: int = 1024) -> ClientData:
    return ClientData(0, torch.arange(5), Y.clone(), lambda idx: X[idx], eval_batch=eval_batch)


def linear_x() -> dict[str, torch.Tensor]:
    return {
        "fc.weight": torch.tensor([[0.2, -0.1], [0.4, 0.3]]),
        "fc.bias": torch.tensor([0.05, -0.05]),
    }


def ce_grad(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gradient of the mean cross-entropy over all 5 samples, by plain autograd."""
    q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    loss = F.cross_entropy(X @ q["fc.weight"].T + q["fc.bias"], Y)
    return dict(zip(q, torch.autograd.grad(loss, list(q.values())), strict=True))


def run_linear(tmp_path, name, rounds, **over):
    """A tiny run (6 IID clients, MLP; the run's momentum 0.9) evaluated only at its end."""
    raw = tiny_config(tmp_path / name, algorithm__name=name, train__rounds=rounds, **over)
    raw["eval"] = {"every": rounds, "train_metrics": False}
    cfg = validate_config(raw)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    rec = RoundRecorder()
    state = Simulator(algo, data, sim_config(cfg), SequentialExecutor(), [rec]).run()
    return state, data, rec.servers


def dfl_config(tmp_path, params=None, **over):
    raw = tiny_config(
        tmp_path,
        algorithm={"name": "dfl", "params": params or {}},
        scenario={"dataset": "digits", "num_clients": 6, "label_shift": {"kind": "iid"}},
        model={"name": "convbn_cnn"},
        train={"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 3, "momentum": 0.0},
    )
    for key, value in over.items():
        node = raw
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return validate_config(raw)


# ---------------------------------------------------------------------- one client's stages
def dfl_setup(tmp_path, params=None):
    cfg = dfl_config(tmp_path, params)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    server = algo.init_server_state([algo.ops.init(1)])
    return cfg, data, algo, server


def dfl_train(algo, task, view, phases=None):
    if phases is not None:
        task.phases = phases
    ex = SequentialExecutor()
    work = RoundWork.of(
        lr=0.05, momentum=0.0, weight_decay=0.0, batch_size=16, drop_last=False, local_steps=3
    )
    return next(iter(ex.train(algo, [(task, view)], work)))


def dfl_one_round(algo, data, server):
    """Clients 0 and 1 train from ``server`` and the server aggregates: (results, new)."""
    results = []
    for cid in (0, 1):
        view = client_data(data, data.clients[cid])
        task = algo.client_task(server, {}, view, RoundContext(1, (0, 1)))
        r = dfl_train(algo, task, view)
        results.append(ClientResult(cid, view.num_train, r.params, r.buffers))
    return results, algo.aggregate(server, iter(results), RoundContext(1, (0, 1)))


class RoundRecorder:
    """A simulator callback keeping the server state after every round."""

    def __init__(self) -> None:
        self.servers: list[dict] = []

    def on_start(self, sim, state) -> None:
        pass

    def on_round_end(self, sim, state, metrics) -> None:
        self.servers.append(state.server)

    def on_end(self, sim, state) -> None:
        pass


# ---------------------------------------------------------------------- hostile clients
def boosted(task, shared, scale: float):
    """``shared`` as a hostile client sends it: every model's update (what it shares minus
    the model its task started from) multiplied by ``scale``."""

    def boost(models, starts):
        return [
            {k: (start[k] + scale * (x - start[k]) if k in start else x) for k, x in m.items()}
            for m, start in zip(models, starts, strict=False)
        ]

    params = boost(shared.params, task.params)
    return replace(shared, params=params, buffers=boost(shared.buffers, task.buffers))


def make_hostile(algo, cids, scale: float) -> None:
    """Clients ``cids`` of ``algo`` send their updates multiplied by ``scale``."""
    real = algo.shared_result

    def shared_result(task, result):
        out = real(task, result)
        return boosted(task, out, scale) if result.cid in cids else out

    algo.shared_result = shared_result


def averaged_with_buffers(server) -> list[tuple[dict, dict]]:
    """(params, buffers) of every averaged model of a server state (``params`` and
    ``buffers``, or each ``models[k]``); empty when it has none."""
    if not isinstance(server, dict):
        return []
    if isinstance(server.get("params"), dict):
        return [(server["params"], server.get("buffers") or {})]
    models = server.get("models")
    if isinstance(models, list) and all(isinstance(m, dict) and "params" in m for m in models):
        return [(m["params"], m.get("buffers") or {}) for m in models]
    return []


#: half the clients with labels y, half with the reversed labels (tiny_config overrides)
TWO_CONCEPTS = {
    "scenario__concepts": ["identity", "reverse"],
    "scenario__mix": {
        "types": [{"fraction": 0.5, "concepts": [0]}, {"fraction": 0.5, "concepts": [1]}]
    },
}
