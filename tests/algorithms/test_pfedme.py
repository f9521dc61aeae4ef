"""pFedMe: the inner solver (K proximal SGD steps on the batch, theta carried from step to step)
and the w update checked by hand on a one-parameter model, the server's beta mix, the stops
of the gradient in both objectives, and the personal model that scores a client."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedshift.algorithms.base import ClientData, ClientResult, ModelOps, RoundContext
from fedshift.algorithms.pfedme import PFedMe, inner_objective, outer_objective, server_mix
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from tests.conftest import RUN, assert_tree_close64, run_executors, tiny_config

X = 1.5


class _Scalar(nn.Module):
    """Logits [x·v, 0] of a one-parameter model."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.tensor(0.0))

    def forward(self, x, return_features=False):
        logits = torch.stack([x[:, 0] * self.v, torch.zeros_like(x[:, 0])], dim=1)
        return (x, logits) if return_features else logits


def dce(p: float) -> float:
    """d/dp CE([x p, 0], 0) = (sigmoid(x p) - 1) x."""
    return (1 / (1 + math.exp(-X * p)) - 1) * X


def _algo(**params) -> PFedMe:
    return PFedMe(PFedMe.parse_params(params), ModelOps(_Scalar, torch.device("cpu")), 2, **RUN)


def _data(n: int = 1) -> ClientData:
    xs = torch.full((n, 1), X)
    return ClientData(0, torch.arange(n), torch.zeros(n, dtype=torch.long), lambda idx: xs[idx])


def _reference(w: float, steps: int, lam: float, K: int, plr: float, lr: float):
    """The paper's local steps in plain Python: theta starts at the received model and is
    carried from step to step; each step K proximal SGD steps, then w <- w - lr lam (w - theta)."""
    theta = w
    for _ in range(steps):
        for _ in range(K):
            theta = theta - plr * (dce(theta) + lam * (theta - w))
        w = w - lr * lam * (w - theta)
    return w, theta


@pytest.mark.parametrize("steps", [1, 3])
def test_local_steps_by_hand(steps):
    """With the run's momentum and weight decay on: the w step is plain all the same."""
    lam, K, plr, lr, w0 = 15.0, 3, 0.01, 0.02, 0.4
    algo = _algo(lam=lam, K=K, personal_lr=plr)
    server = algo.init_server_state([({"v": torch.tensor(w0)}, {})])
    data = _data(steps)
    task = algo.client_task(server, {}, data, RoundContext(1, lr=lr))
    assert task.params[1] is server["params"]  # theta starts at the received model
    res = SequentialExecutor().train_one(
        algo,
        task,
        data,
        RoundWork.of(lr=lr, momentum=0.9, weight_decay=0.1, batch_size=1, drop_last=False),
    )
    w, theta = _reference(w0, steps, lam, K, plr, lr)
    assert float(res.params[0]["v"]) == pytest.approx(w, rel=1e-5)
    assert float(res.params[1]["v"]) == pytest.approx(theta, rel=1e-5)
    assert abs(w - w0) > 1e-3 and abs(theta - w) > 1e-3  # both moved, apart
    state = algo.client_update(server, {}, task, res)
    assert float(state["params"]["v"]) == pytest.approx(theta, rel=1e-5)
    # the personal model theta scores the client; the global model one that never trained
    assert algo.mixture(server, state, data)[0][1] is state["params"]
    assert algo.mixture(server, {}, data)[0][1] is server["params"]


def test_objectives_stop_the_other_model_and_pull_the_right_way():
    w = {"v": torch.tensor(0.5, requires_grad=True)}
    theta = {"v": torch.tensor(0.2, requires_grad=True)}
    lam = 4.0
    gw, gt = torch.autograd.grad(
        outer_objective(w, theta, lam), [w["v"], theta["v"]], allow_unused=True
    )
    assert float(gw) == pytest.approx(lam * (0.5 - 0.2))  # w moves towards theta
    assert gt is None  # theta is held fixed in w's objective
    ce = torch.tensor(0.0)
    gt, gw = torch.autograd.grad(
        inner_objective(ce, theta, w, lam), [theta["v"], w["v"]], allow_unused=True
    )
    assert float(gt) == pytest.approx(lam * (0.2 - 0.5))  # theta moves towards w
    assert gw is None


def _result(cid: int, n: int, v: float) -> ClientResult:
    return ClientResult(cid=cid, num_samples=n, params=[{"v": torch.tensor(v)}], buffers=[{}])


def test_server_mixes_the_average_with_beta():
    x0 = 1.0
    for beta, weighting in [(0.5, "samples"), (1.0, "samples"), (2.0, "uniform")]:
        algo = _algo(beta=beta, weighting=weighting)
        server = algo.init_server_state([({"v": torch.tensor(x0)}, {})])
        new = algo.aggregate(server, iter([_result(0, 1, 3.0), _result(1, 3, 5.0)]), None)
        avg = (1 * 3.0 + 3 * 5.0) / 4 if weighting == "samples" else 4.0
        assert float(new["params"]["v"]) == pytest.approx((1 - beta) * x0 + beta * avg)
    unchanged = algo.aggregate(server, iter([]), None)
    assert unchanged is server
    mixed = server_mix({"a": torch.tensor(2.0)}, {"a": torch.tensor(6.0)}, 0.25)
    assert float(mixed["a"]) == pytest.approx(3.0)


def test_batchnorm_statistics_of_both_models_follow_the_data():
    """The inner solver's passes leave BatchNorm statistics alone; the stage's extra passes
    update those of w (averaged by the server) and of theta (the personal model)."""
    ops = ModelOps(lambda: nn.Sequential(nn.BatchNorm1d(1), nn.Linear(1, 2)), torch.device("cpu"))
    algo = PFedMe(PFedMe.parse_params({"K": 2}), ops, 2, **RUN)
    server = algo.init_server_state([ops.init(0)])
    xs = torch.full((4, 1), 3.0) + torch.arange(4.0)[:, None]
    data = ClientData(0, torch.arange(4), torch.zeros(4, dtype=torch.long), lambda i: xs[i])
    task = algo.client_task(server, {}, data, RoundContext(1, lr=0.01))
    work = RoundWork.of(lr=0.01, momentum=0.0, weight_decay=0.0, batch_size=4, drop_last=False)
    res = SequentialExecutor().train_one(algo, task, data, work)
    momentum = 0.1  # BatchNorm's default: one pass over the batch of mean 4.5
    for b in res.buffers:
        assert float(b["0.running_mean"]) == pytest.approx(momentum * 4.5, rel=1e-5)
        assert int(b["0.num_batches_tracked"]) == 1
    assert float(server["buffers"]["0.running_mean"]) == 0.0  # the server's are untouched


# ---------------------------------------------------------------------- executors
@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_batched_executor_matches_sequential(tmp_path, vectorize):
    """Unequal client sizes (padded batches, unequal step counts), partial participation,
    clipping on: the batched executor ends where the sequential one does."""
    raw = tiny_config(
        tmp_path,
        algorithm={"name": "pfedme", "params": {"K": 2}},
        train__rounds=2,
        train__participation=0.5,
        train__local_epochs=1,
        train__grad_clip=5.0,
        scenario__num_clients=10,
        scenario__label_shift={"kind": "dirichlet", "alpha": 0.3},
    )
    cfg = validate_config(raw)
    data = build_scenario(cfg.scenario, cfg.seed)
    assert min(c.num_train for c in data.clients) < 32 < max(c.num_train for c in data.clients)
    ex = (SequentialExecutor(), BatchedExecutor(chunk_size=3, vectorize=vectorize))
    seq, bat = run_executors(cfg, ex, data)  # float64: see F64_ATOL in fedshift/testing.py
    assert_tree_close64(seq.server, bat.server, "server")
    assert set(seq.clients) == set(bat.clients) and seq.clients
    for cid in seq.clients:
        assert_tree_close64(seq.clients[cid], bat.clients[cid], f"client {cid}")
