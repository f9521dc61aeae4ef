"""SCAFFOLD: the corrected local steps, both control-variate options and the server step,
each checked against numbers computed here by hand (a plain torch loop, explicit formulas), the
first round against FedAvg and the invariant c = mean over all clients of c_i in a run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedshift.algorithms.base import (
    ClientResult,
    ModelOps,
    RoundContext,
    TrainDefaults,
)
from fedshift.algorithms.scaffold import Scaffold, linear_term
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from tests.algorithms.conftest import LinearNet, X, Y, ce_grad, linear_data, linear_x, run_linear


def _algo(train: TrainDefaults | None = None, **params) -> Scaffold:
    ops = ModelOps(LinearNet, torch.device("cpu"))
    return Scaffold(Scaffold.parse_params(params), ops, 2, seed=0, train=train or TrainDefaults())


def _state(algo: Scaffold, c_scale: float = 1.0):
    """A server with model x and a non-zero c, and a client with a non-zero c_i."""
    server = algo.init_server_state([(linear_x(), {})])
    server["c"] = {
        "fc.weight": c_scale * torch.tensor([[0.3, -0.2], [0.1, 0.5]]),
        "fc.bias": c_scale * torch.tensor([-0.4, 0.2]),
    }
    client = {
        "c": {
            "fc.weight": torch.tensor([[-0.1, 0.6], [0.2, -0.3]]),
            "fc.bias": torch.tensor([0.1, 0.3]),
        }
    }
    return server, client


def _train(algo, server, client, lr=0.1, epochs=3, momentum=0.0):
    ctx = RoundContext(1, sampled=(0,), lr=lr, num_clients=4)
    task = algo.client_task(server, client, linear_data(), ctx)
    res = SequentialExecutor().train_one(
        algo,
        task,
        linear_data(),
        RoundWork.of(
            lr=lr, momentum=momentum, weight_decay=0.0,
            batch_size=5, local_epochs=epochs, drop_last=False,  # full batch: 1 step/epoch
        ),
    )  # fmt: skip
    return task, res


def test_linear_term_has_value_zero_and_gradient_v():
    p = {"a": torch.tensor([1.0, -2.0], requires_grad=True)}
    v = {"a": torch.tensor([0.3, 0.7])}
    out = linear_term(p, v)
    assert float(out.detach()) == 0.0
    (g,) = torch.autograd.grad(out, [p["a"]])
    torch.testing.assert_close(g, v["a"])


def test_local_steps_and_option_ii_control_variate_by_hand():
    """K = 3 full-batch steps y <- y - lr (g(y) - c_i + c); then c_i+ = c_i - c + (x-y)/(K lr),
    which for plain SGD is the mean of the K gradients."""
    algo, lr, K = _algo(), 0.1, 3
    server, client = _state(algo)
    task, res = _train(algo, server, client, lr=lr, epochs=K)
    c, ci, x = server["c"], client["c"], linear_x()
    y, grads, losses = {k: v.clone() for k, v in x.items()}, [], []
    for _ in range(K):
        losses.append(float(F.cross_entropy(X @ y["fc.weight"].T + y["fc.bias"], Y)))
        g = ce_grad(y)
        grads.append(g)
        y = {k: y[k] - lr * (g[k] - ci[k] + c[k]) for k in y}
    assert res.steps == K
    for k in x:
        torch.testing.assert_close(res.params[0][k], y[k])
    new = algo.client_update(server, client, task, res)["c"]
    for k in x:
        expected = ci[k] - c[k] + (x[k] - y[k]) / (K * lr)
        torch.testing.assert_close(new[k], expected)
        torch.testing.assert_close(new[k], sum(g[k] for g in grads) / K)
    # the reported training loss is the cross-entropy: the linear term's value is 0
    assert res.telemetry["train_loss"] == pytest.approx(sum(losses) / K, rel=1e-5)


def test_without_a_correction_the_local_steps_are_plain_sgd():
    """c = c_i: the correction vanishes and the steps are FedAvg's."""
    algo, lr = _algo(), 0.1
    server, _ = _state(algo)
    _, res = _train(algo, server, {"c": server["c"]}, lr=lr, epochs=2)
    y = linear_x()
    for _ in range(2):
        g = ce_grad(y)
        y = {k: y[k] - lr * g[k] for k in y}
    for k in y:
        torch.testing.assert_close(res.params[0][k], y[k])


def _result(cid, y, n, steps, upload=None) -> ClientResult:
    return ClientResult(cid, n, [{"w": torch.tensor(y)}], [{}], upload=upload or {}, steps=steps)


def test_server_step_by_hand():
    """x <- x + eta_g * (sample-weighted mean of y_i - x); c <- c + (|S|/N) mean(c_i+ - c_i)
    with c_i+ - c_i = -c + (x - y_i)/(K_i lr) (option II), N = 4 clients, 2 sampled."""
    algo = _algo(server_lr=0.5)
    server = {
        "params": {"w": torch.tensor([1.0, 2.0])},
        "buffers": {},
        "c": {"w": torch.tensor([0.5, -0.5])},
    }
    results = [_result(0, [0.8, 2.2], 10, 2), _result(1, [1.4, 1.0], 30, 4)]
    out = algo.aggregate(server, iter(results), RoundContext(1, (0, 1), lr=0.1, num_clients=4))
    mean_y = [(10 * 0.8 + 30 * 1.4) / 40, (10 * 2.2 + 30 * 1.0) / 40]
    x_new = [1.0 + 0.5 * (mean_y[0] - 1.0), 2.0 + 0.5 * (mean_y[1] - 2.0)]
    d1 = [-0.5 + (1.0 - 0.8) / (2 * 0.1), 0.5 + (2.0 - 2.2) / (2 * 0.1)]
    d2 = [-0.5 + (1.0 - 1.4) / (4 * 0.1), 0.5 + (2.0 - 1.0) / (4 * 0.1)]
    c_new = [0.5 + (2 / 4) * (d1[0] + d2[0]) / 2, -0.5 + (2 / 4) * (d1[1] + d2[1]) / 2]
    torch.testing.assert_close(out["params"]["w"], torch.tensor(x_new))
    torch.testing.assert_close(out["c"]["w"], torch.tensor(c_new))


def test_option_ii_under_momentum_divides_by_the_effective_steps():
    """With momentum rho the K steps move y by lr * sum_j (1 + rho + ... + rho^(j-1)) d for a
    constant corrected gradient d = G - c_i + c; c_i+ is then exactly G."""
    rho, lr, K = 0.9, 0.1, 3
    algo = _algo(TrainDefaults(momentum=rho))
    G = torch.tensor([0.7, -1.3])
    c, ci, x = torch.tensor([0.2, 0.1]), torch.tensor([-0.3, 0.4]), torch.tensor([1.0, 2.0])
    y, buf, counters = x.clone(), None, 0.0
    for j in range(1, K + 1):
        d = G - ci + c
        buf = d.clone() if buf is None else rho * buf + d
        y = y - lr * buf
        counters += sum(rho**m for m in range(j))
    server = {"params": {"w": x}, "buffers": {}, "c": {"w": c}}
    res = ClientResult(0, 5, [{"w": y}], [{}], steps=K)
    task = algo.client_task(server, {"c": {"w": ci}}, linear_data(), RoundContext(1, lr=lr))
    new = algo.client_update(server, {"c": {"w": ci}}, task, res)["c"]["w"]
    torch.testing.assert_close(new, ci - c + (x - y) / (counters * lr))
    torch.testing.assert_close(new, G)


def test_option_i_control_variate_is_the_local_gradient_at_the_server_model():
    """Option I: c_i+ = grad of the mean CE over the client's data at x (+ wd x), computed in
    batches of eval_batch (2 of 5 samples here); the upload is c_i+ - c_i."""
    wd = 0.01
    algo = _algo(TrainDefaults(weight_decay=wd), option="I")
    server, client = _state(algo)
    task = algo.client_task(server, client, linear_data(eval_batch=2), RoundContext(1, lr=0.1))
    trained = [
        {k: v + 1.0 for k, v in linear_x().items()}
    ]  # the upload must not read the trained model
    up = algo.upload(task, trained, [{}], linear_data(eval_batch=2))
    g, x = ce_grad(linear_x()), linear_x()
    for k in x:
        torch.testing.assert_close(up["delta_c"][k], g[k] + wd * x[k] - client["c"][k])
    res = ClientResult(0, 5, trained, [{}], upload=up, steps=3)
    new = algo.client_update(server, client, task, res)["c"]
    for k in x:
        torch.testing.assert_close(new[k], g[k] + wd * x[k])
    out = algo.aggregate(server, iter([res]), RoundContext(1, (0,), lr=0.1, num_clients=4))
    for k in x:
        torch.testing.assert_close(out["c"][k], server["c"][k] + up["delta_c"][k] / 4)


def test_first_round_equals_fedavg_and_later_rounds_do_not(tmp_path):
    """c = c_i = 0 in round 1: SCAFFOLD's model is FedAvg's; in round 2 the correction
    (non-zero after round 1) moves it away."""
    runs = {n: run_linear(tmp_path, n, 2)[2] for n in ("scaffold", "fedavg")}
    first, second = runs["scaffold"], runs["fedavg"]
    for k, v in second[0]["params"].items():
        torch.testing.assert_close(first[0]["params"][k], v)
    assert max(float(v.abs().max()) for v in first[0]["c"].values()) > 1e-3
    gap = max(
        float((first[1]["params"][k] - v).abs().max()) for k, v in second[1]["params"].items()
    )
    assert gap > 1e-4


def test_server_c_is_the_mean_of_all_clients_c_i_under_partial_participation(tmp_path):
    """c <- c + (1/N) sum_S (c_i+ - c_i) keeps c = (1/N) sum over all N clients of c_i (absent:
    0): dividing by |S| instead of N, or dropping a client's change, breaks it."""
    state, data, _ = run_linear(tmp_path, "scaffold", 3, train__participation=0.5)
    n = len(data.clients)
    trained = [state.clients.get(c.cid) for c in data.clients]
    assert (
        any(s and "c" in s for s in trained)
        and max(float(v.abs().max()) for v in state.server["c"].values()) > 1e-3
    )
    for k, v in state.server["c"].items():
        total = sum((s["c"][k] for s in trained if s and "c" in s), torch.zeros_like(v))
        torch.testing.assert_close(v, total / n, atol=1e-6, rtol=1e-5)
