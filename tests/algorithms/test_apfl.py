"""APFL: the three per-step updates (w, v, alpha) checked by hand on a one-parameter model,
alpha's projection onto [0, 1] (exact projected SGD across steps), its own step size, the
fixed-alpha variant and the mixed personalised model that scores a client."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedshift.algorithms.apfl import APFL, alpha_terms, mix_params
from fedshift.algorithms.base import Batch, ClientData, ModelOps, RoundContext
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


def dce(p: float, y: int = 0) -> float:
    """d/dp CE([x p, 0], y): (sigmoid(x p) - [y == 0]) x."""
    return (1 / (1 + math.exp(-X * p)) - (1.0 if y == 0 else 0.0)) * X


def _algo(**params) -> APFL:
    return APFL(APFL.parse_params(params), ModelOps(_Scalar, torch.device("cpu")), 2, **RUN)


def _server(algo: APFL, w0: float, v_init: float):
    server = algo.init_server_state([({"v": torch.tensor(v_init)}, {})])
    server["params"] = {"v": torch.tensor(w0)}  # the global model differs from v's init
    return server


def _data(ys=(0,)) -> ClientData:
    xs = torch.full((len(ys), 1), X)
    return ClientData(0, torch.arange(len(ys)), torch.tensor(ys), lambda idx: xs[idx])


def _train(algo, server, client, data, lr, steps=1):
    task = algo.client_task(server, client, data, RoundContext(1, lr=lr))
    res = SequentialExecutor().train_one(
        algo,
        task,
        data,
        RoundWork.of(
            lr=lr, momentum=0.0, weight_decay=0.0, batch_size=1, drop_last=False, local_steps=steps
        ),
    )
    return task, res


def test_one_step_updates_w_v_and_alpha_by_hand():
    """w <- w - lr dCE(w); v <- v - lr a dCE(vbar); a <- a - lr (v - w) dCE(vbar), all from
    the step's starting point, vbar = a v + (1 - a) w. A w that is not stopped in the mix
    would get (1 - a) dCE(vbar) more; a flipped sign or a stale point moves the numbers."""
    lr, w0, v0, a0 = 0.1, 0.2, 0.5, 0.4
    algo = _algo(alpha=a0)
    server = _server(algo, w0, v0)
    task, res = _train(algo, server, {}, _data(), lr)
    vbar = a0 * v0 + (1 - a0) * w0
    w1 = w0 - lr * dce(w0)
    v1 = v0 - lr * a0 * dce(vbar)
    a1 = a0 - lr * (v0 - w0) * dce(vbar)
    assert float(res.params[0]["v"]) == pytest.approx(w1, rel=1e-6)
    assert float(res.params[1]["v"]) == pytest.approx(v1, rel=1e-6)
    assert float(res.params[2]["alpha"]) == pytest.approx(a1, rel=1e-6)
    assert 0 < a1 < 1 and abs(a1 - a0) > 1e-3  # alpha moved, inside [0, 1]
    state = algo.client_update(server, {}, task, res)
    assert float(state["params"]["v"]) == pytest.approx(v1, rel=1e-6)
    assert float(state["alpha"]) == pytest.approx(a1, rel=1e-6)
    assert state["alpha"].shape == (1,)  # one element (the batched executor stacks it)
    # the next round starts from the client's v and alpha and the (new) global w
    nxt = algo.client_task(server, state, _data(), RoundContext(2, lr=lr))
    assert nxt.params[1] is state["params"] and nxt.params[2]["alpha"] is state["alpha"]
    assert nxt.params[0] is server["params"]


def test_w_is_stopped_in_the_mix():
    """The gradient of the loss in w is dCE(w) alone (the mixed model's CE does not reach w)."""
    algo = _algo()
    w = {"v": torch.tensor(0.3, requires_grad=True)}
    v = {"v": torch.tensor(-0.7, requires_grad=True)}
    a = {"alpha": torch.tensor([0.5], requires_grad=True)}
    batch = Batch(x=torch.full((1, 1), X), y=torch.tensor([0]), pos=torch.tensor([0]))
    loss = algo.local_loss([w, v, a], [{}, {}, {}], batch, {"lr": 0.1, "alpha_scale": 1.0})
    (gw,) = torch.autograd.grad(loss, [w["v"]])
    assert float(gw) == pytest.approx(dce(0.3), rel=1e-6)


def _manual_steps(algo, w, v, a, batches, lr):
    """Plain SGD (p <- p - lr grad) on APFL's loss, one batch per step."""
    params = [{"v": torch.tensor(w)}, {"v": torch.tensor(v)}, {"alpha": torch.tensor([a])}]
    for x, y in batches:
        ps = [{k: t.clone().requires_grad_(True) for k, t in p.items()} for p in params]
        batch = Batch(x=torch.full((1, 1), x), y=torch.tensor([y]), pos=torch.tensor([0]))
        loss = algo.local_loss(ps, [{}, {}, {}], batch, {"lr": lr, "alpha_scale": 1.0})
        flat = [ps[0]["v"], ps[1]["v"], ps[2]["alpha"]]
        grads = torch.autograd.grad(loss, flat)
        params = [
            {"v": (flat[0] - lr * grads[0]).detach()},
            {"v": (flat[1] - lr * grads[1]).detach()},
            {"alpha": (flat[2] - lr * grads[2]).detach()},
        ]
    return [float(p[k]) for p, k in zip(params, ("v", "v", "alpha"), strict=True)]


def _projected_reference(w, v, a, ys, lr):
    """The paper's steps with alpha projected onto [0, 1] after each one."""
    for y in ys:
        vbar = a * v + (1 - a) * w
        g = dce(vbar, y)
        w, v, a = w - lr * dce(w, y), v - lr * a * g, min(1.0, max(0.0, a - lr * (v - w) * g))
    return w, v, a


def test_alpha_is_projected_after_every_step():
    """Step 1 (label 0, v > w) pushes alpha above 1: it is clipped to 1; step 2 (label 1) pulls
    it down, from 1 (projected SGD), not from the unclipped value. Without the pull term the
    second step would start above 1 and alpha would stay at 1."""
    lr, w0, v0, a0 = 0.5, -0.5, 0.5, 0.95
    algo = _algo(alpha=a0)
    ys = (0, 1)
    w2, v2, a2_raw = _manual_steps(algo, w0, v0, a0, [(X, y) for y in ys], lr)
    rw, rv, ra = _projected_reference(w0, v0, a0, ys, lr)
    # step 1 really crosses 1, step 2 really comes back inside
    a1_unclipped = a0 - lr * (v0 - w0) * dce(a0 * v0 + (1 - a0) * w0, 0)
    assert a1_unclipped > 1.1 and 0.1 < ra < 0.9
    assert min(1.0, max(0.0, a2_raw)) == pytest.approx(ra, rel=1e-5)
    assert w2 == pytest.approx(rw, rel=1e-6) and v2 == pytest.approx(rv, rel=1e-5)


def test_alpha_terms_value_gradient_and_pull():
    a = torch.tensor(1.3, requires_grad=True)
    alpha, pull = alpha_terms(a, 0.5, 0.2)
    assert float(alpha.detach()) == pytest.approx(1.0)  # the value used is clipped
    (g_alpha,) = torch.autograd.grad(alpha, [a], retain_graph=True)
    (g_pull,) = torch.autograd.grad(pull, [a])
    assert float(g_alpha) == pytest.approx(0.2)  # scaled by eta_alpha / eta
    assert float(g_pull) == pytest.approx((1.3 - 1.0) / 0.5)
    inside, no_pull = alpha_terms(torch.tensor(0.4, requires_grad=True), 0.5, 1.0)
    assert float(inside.detach()) == pytest.approx(0.4) and float(no_pull.detach()) == 0.0


def test_client_update_keeps_alpha_in_unit_interval():
    lr, w0, v0, a0 = 1.0, -1.0, 2.0, 0.9  # one step pushes alpha to about 1.23
    algo = _algo(alpha=a0)
    server = _server(algo, w0, v0)
    task, res = _train(algo, server, {}, _data(), lr)
    assert float(res.params[2]["alpha"]) > 1.05
    assert float(algo.client_update(server, {}, task, res)["alpha"]) == 1.0


def test_alpha_lr_scales_alpha_step_only():
    lr, eta_a, w0, v0, a0 = 0.1, 0.03, 0.2, 0.5, 0.4
    algo = _algo(alpha=a0, alpha_lr=eta_a)
    _, res = _train(algo, _server(algo, w0, v0), {}, _data(), lr)
    vbar = a0 * v0 + (1 - a0) * w0
    assert float(res.params[2]["alpha"]) == pytest.approx(
        a0 - eta_a * (v0 - w0) * dce(vbar), rel=1e-6
    )
    assert float(res.params[1]["v"]) == pytest.approx(v0 - lr * a0 * dce(vbar), rel=1e-6)


def test_fixed_alpha_is_not_trained():
    algo = _algo(alpha=0.3, adaptive=False)
    _, res = _train(algo, _server(algo, 0.2, 0.5), {}, _data(), 0.1)
    assert float(res.params[2]["alpha"]) == pytest.approx(0.3)


def test_personalised_model_is_the_parameter_mix_with_the_global_model():
    algo = _algo()
    server = _server(algo, 0.2, 0.5)
    client = {"params": {"v": torch.tensor(1.0)}, "buffers": {}, "alpha": torch.tensor([0.25])}
    ((w, p, _),) = algo.mixture(server, client, _data())
    assert w == 1.0 and float(p["v"]) == pytest.approx(0.25 * 1.0 + 0.75 * 0.2)
    assert mix_params({"a": torch.tensor(2.0)}, {"a": torch.tensor(4.0)}, 0.5)["a"] == 3.0
    # a client that never trained, and a test-only client, are scored with the global model
    assert algo.mixture(server, {}, _data())[0][1] is server["params"]
    test_only = ClientData(0, torch.tensor([0]), torch.tensor([0]), lambda i: i, test_only=True)
    assert algo.mixture(server, client, test_only)[0][1] is server["params"]


# ---------------------------------------------------------------------- executors
@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_batched_executor_matches_sequential(tmp_path, vectorize):
    """Unequal client sizes (padded batches, unequal step counts), partial participation,
    clipping on: the batched executor ends where the sequential one does."""
    raw = tiny_config(
        tmp_path,
        algorithm={"name": "apfl"},
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
