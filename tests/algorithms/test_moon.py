"""MOON: the model-contrastive loss by hand, the local objective and one SGD step against a plain
torch computation, the roles of the three models, and the previous model carried from round to
round."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import Batch, ClientData, ClientResult, ModelOps, RoundContext
from fedshift.algorithms.moon import MOON, model_contrastive_loss
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.models.base import SplitModel
from tests.conftest import RUN


def test_contrastive_loss_by_hand():
    # z=[1,0]: cos with z_glob=[1,1] is 1/sqrt2, with z_prev=[0,1] it is 0 (tau 0.5):
    # l = -log(e^{sqrt2} / (e^{sqrt2} + e^0)) = log(1 + e^{-sqrt2})
    z = torch.tensor([[1.0, 0.0], [2.0, 2.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, 3.0]])
    z_prev = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    got = model_contrastive_loss(z, z_glob, z_prev, 0.5)
    s2 = math.sqrt(2)
    # second row: cos(z, z_glob) = 1/sqrt2, cos(z, z_prev) = 1
    expected = [math.log(1 + math.exp(-s2)), -math.log(math.exp(s2) / (math.exp(s2) + math.e**2))]
    assert got.tolist() == pytest.approx(expected, rel=1e-6)
    # the previous model is the negative: swapping the roles changes the loss
    swapped = model_contrastive_loss(z, z_prev, z_glob, 0.5)
    assert float(swapped[0]) == pytest.approx(math.log(1 + math.exp(s2)), rel=1e-6)


def test_contrastive_loss_is_constant_when_previous_is_global():
    z = torch.randn(5, 3, requires_grad=True)
    other = torch.randn(5, 3)
    loss = model_contrastive_loss(z, other, other, 0.5)
    assert loss.tolist() == pytest.approx([math.log(2)] * 5, rel=1e-6)
    (g,) = torch.autograd.grad(loss.sum(), z)
    assert float(g.abs().max()) < 1e-6


def _model() -> SplitModel:
    return SplitModel(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False), 2, 2)


def _algo(mu: float = 2.0, tau: float = 0.5) -> MOON:
    ops = ModelOps(_model, torch.device("cpu"))
    return MOON(MOON.parse_params({"mu": mu, "tau": tau}), ops, 2, **RUN)


def _params(body, head):
    return {"body.weight": torch.tensor(body), "head.weight": torch.tensor(head)}


GLOBAL = _params([[1.0, 0.5], [-0.5, 1.0]], [[1.0, 0.0], [0.0, 1.0]])
PREV = _params([[0.2, 1.0], [1.0, -0.3]], [[0.5, 0.5], [-1.0, 1.0]])
XS = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.3, -1.2]])
YS = torch.tensor([0, 1, 1])


def _data() -> ClientData:
    return ClientData(0, torch.arange(3), YS, lambda idx: XS[idx])


def _work(lr: float, rnd: int) -> RoundWork:
    """Plain SGD on the full batch of three samples, one epoch."""
    return RoundWork.of(
        round=rnd, lr=lr, momentum=0.0, weight_decay=0.0, batch_size=3, drop_last=False
    )


def _hand_loss(w, glob_body, prev_body, mu, tau):
    """CE + mu * l_con written out with explicit torch ops (no fedshift code)."""
    z = XS @ w["body.weight"].T
    logits = z @ w["head.weight"].T
    ce = -torch.log_softmax(logits, dim=1)[torch.arange(3), YS].mean()
    zg, zp = XS @ glob_body.T, XS @ prev_body.T

    def cos(a, b):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))

    pos, neg = torch.exp(cos(z, zg) / tau), torch.exp(cos(z, zp) / tau)
    return ce + mu * (-torch.log(pos / (pos + neg))).mean()


def test_task_roles_global_trained_global_frozen_previous_frozen():
    algo = _algo()
    server = algo.init_server_state([(GLOBAL, {})])
    task = algo.client_task(server, {"params": PREV, "buffers": {}}, _data(), RoundContext(2))
    assert task.params[0] is GLOBAL and task.params[1] is GLOBAL and task.params[2] is PREV
    assert [p.trainable for p in task.phases] == [((0, None),)]
    first = algo.client_task(server, {}, _data(), RoundContext(1))  # never trained
    assert first.params[2] is GLOBAL


def test_local_loss_and_one_step_match_a_plain_computation():
    mu, tau, lr = 2.0, 0.5, 0.1
    algo = _algo(mu, tau)
    server = algo.init_server_state([(GLOBAL, {})])
    client = {"params": PREV, "buffers": {}}
    task = algo.client_task(server, client, _data(), RoundContext(2))
    w = {k: v.clone().requires_grad_(True) for k, v in GLOBAL.items()}
    expected = _hand_loss(w, GLOBAL["body.weight"], PREV["body.weight"], mu, tau)
    got = algo.local_loss(
        [w, GLOBAL, PREV], [{}, {}, {}], Batch(x=XS, y=YS, pos=torch.arange(3)), {}
    )
    assert float(got.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    # one full-batch SGD step of the executor = one step on the hand-written loss
    grads = torch.autograd.grad(expected, list(w.values()))
    want = {k: v.detach() - lr * g for (k, v), g in zip(w.items(), grads, strict=True)}
    res = SequentialExecutor().train_one(algo, task, _data(), _work(lr, rnd=2))
    for k in want:
        torch.testing.assert_close(res.params[0][k], want[k])
        torch.testing.assert_close(res.params[1][k], GLOBAL[k])  # frozen
        torch.testing.assert_close(res.params[2][k], PREV[k])
    # the contrastive term matters: a step on CE alone lands elsewhere
    ce_only = _hand_loss(w, GLOBAL["body.weight"], PREV["body.weight"], 0.0, tau)
    g_ce = torch.autograd.grad(ce_only, [w["body.weight"]])[0]
    assert not torch.allclose(res.params[0]["body.weight"], GLOBAL["body.weight"] - lr * g_ce)


def test_previous_model_is_the_latest_local_model():
    """Three rounds of one client: the negative of round r is the model it trained in r-1."""
    algo = _algo()
    server = algo.init_server_state([(GLOBAL, {})])
    client: dict = {}
    trained = []
    for rnd in (1, 2, 3):
        task = algo.client_task(server, client, _data(), RoundContext(rnd))
        expected_prev = GLOBAL if rnd == 1 else trained[-1]
        for k in GLOBAL:
            torch.testing.assert_close(task.params[2][k], expected_prev[k])
        res = SequentialExecutor().train_one(algo, task, _data(), _work(0.1, rnd=rnd))
        client = algo.client_update(server, client, task, res)
        trained.append(res.params[0])  # the server stays at GLOBAL: only the client moves
    assert not torch.allclose(trained[0]["body.weight"], trained[1]["body.weight"])
    assert not torch.allclose(trained[0]["body.weight"], GLOBAL["body.weight"])


def test_server_averages_the_trained_models():
    algo = _algo()
    server = algo.init_server_state([(GLOBAL, {})])
    a = ClientResult(0, 1, [PREV, GLOBAL, GLOBAL], [{}, {}, {}])
    b = ClientResult(1, 3, [GLOBAL, PREV, PREV], [{}, {}, {}])
    new = algo.aggregate(server, iter([a, b]), RoundContext(2))
    for k in GLOBAL:
        torch.testing.assert_close(new["params"][k], (PREV[k] + 3 * GLOBAL[k]) / 4)


def test_first_round_trains_on_cross_entropy_alone():
    """Previous = global before the client trained: l_con = log 2 with zero gradient."""
    algo = _algo(mu=5.0)
    server = algo.init_server_state([(GLOBAL, {})])
    task = algo.client_task(server, {}, _data(), RoundContext(1))
    res = SequentialExecutor().train_one(algo, task, _data(), _work(0.1, rnd=1))
    w = {k: v.clone().requires_grad_(True) for k, v in GLOBAL.items()}
    logits = (XS @ w["body.weight"].T) @ w["head.weight"].T
    grads = torch.autograd.grad(F.cross_entropy(logits, YS), list(w.values()))
    for (k, v), g in zip(GLOBAL.items(), grads, strict=True):
        torch.testing.assert_close(res.params[0][k], v - 0.1 * g)
    assert res.telemetry["train_loss"] == pytest.approx(
        float(F.cross_entropy(logits, YS)) + 5.0 * math.log(2), rel=1e-5
    )
