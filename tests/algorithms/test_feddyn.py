"""FedDyn: the regularised local loss, the client's gradient state and the server's h and model,
each checked against numbers computed here by hand, and the invariant h = (1/m) sum over all
clients of their gradient state in a run with partial participation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedshift.algorithms.base import Batch, ClientResult, ModelOps, RoundContext, TrainDefaults
from fedshift.algorithms.feddyn import FedDyn
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from tests.algorithms.conftest import LinearNet, X, Y, ce_grad, linear_data, linear_x, run_linear


def _algo(alpha: float = 0.1) -> FedDyn:
    ops = ModelOps(LinearNet, torch.device("cpu"))
    return FedDyn(FedDyn.parse_params({"alpha": alpha}), ops, 2, seed=0, train=TrainDefaults())


def _grad_state() -> dict[str, torch.Tensor]:
    return {
        "fc.weight": torch.tensor([[0.3, -0.6], [0.2, 0.1]]),
        "fc.bias": torch.tensor([-0.2, 0.4]),
    }


def _ce(p) -> torch.Tensor:
    return F.cross_entropy(X @ p["fc.weight"].T + p["fc.bias"], Y)


def test_local_loss_value_and_gradient_by_hand():
    """Value CE + alpha/2 ||theta - x||^2 (the linear term's value is dropped); gradient
    grad CE - grad_prev + alpha (theta - x)."""
    alpha = 0.1
    algo = _algo(alpha)
    server = algo.init_server_state([(linear_x(), {})])
    task = algo.client_task(server, {"grad": _grad_state()}, linear_data(), RoundContext(1))
    theta = {k: (v + 0.3).requires_grad_(True) for k, v in linear_x().items()}  # away from x
    batch = Batch(x=X, y=Y, pos=torch.arange(5))
    loss = algo.local_loss([theta], [{}], batch, task.extras)
    sq = sum(((theta[k] - v) ** 2).sum() for k, v in linear_x().items())
    assert float(loss.detach()) == pytest.approx(
        float((_ce(theta) + 0.5 * alpha * sq).detach()), rel=1e-6
    )
    grads = dict(zip(theta, torch.autograd.grad(loss, list(theta.values())), strict=True))
    ce_g, gp, x = ce_grad(theta), _grad_state(), linear_x()
    for k in x:
        torch.testing.assert_close(grads[k], ce_g[k] - gp[k] + alpha * (theta[k].detach() - x[k]))


def test_local_steps_and_client_state_by_hand():
    """Two full-batch plain SGD steps on the FedDyn objective, then the client's new state
    grad_prev - alpha (theta_i - x), x the model the round started from."""
    alpha, lr = 0.1, 0.2
    algo = _algo(alpha)
    server = algo.init_server_state([(linear_x(), {})])
    client = {"grad": _grad_state()}
    task = algo.client_task(server, client, linear_data(), RoundContext(1, lr=lr))
    res = SequentialExecutor().train_one(
        algo,
        task,
        linear_data(),
        RoundWork.of(
            lr=lr, momentum=0.0, weight_decay=0.0, batch_size=5, local_epochs=2, drop_last=False
        ),
    )
    x, gp = linear_x(), _grad_state()
    theta = {k: v.clone() for k, v in x.items()}
    for _ in range(2):
        g = ce_grad(theta)
        theta = {k: theta[k] - lr * (g[k] - gp[k] + alpha * (theta[k] - x[k])) for k in x}
    for k in x:
        torch.testing.assert_close(res.params[0][k], theta[k])
    new = algo.client_update(server, client, task, res)["grad"]
    for k in x:
        torch.testing.assert_close(new[k], gp[k] - alpha * (theta[k] - x[k]))
    # a client without a state starts from zeros
    fresh = algo.client_update(server, {}, task, res)["grad"]
    for k in x:
        torch.testing.assert_close(fresh[k], -alpha * (theta[k] - x[k]))


def test_server_step_by_hand():
    """m = 4 clients, 2 sampled: h <- h - alpha/m * sum (theta_i - x); the model is the
    uniform mean of the theta_i (sample counts ignored) minus h/alpha."""
    alpha = 0.1
    algo = _algo(alpha)
    server = {
        "params": {"w": torch.tensor([1.0, 2.0])},
        "buffers": {},
        "h": {"w": torch.tensor([0.1, -0.2])},
    }
    results = [
        ClientResult(0, 10, [{"w": torch.tensor([1.5, 2.5])}], [{}], steps=3),
        ClientResult(1, 30, [{"w": torch.tensor([0.5, 1.0])}], [{}], steps=9),
    ]
    out = algo.aggregate(server, iter(results), RoundContext(1, (0, 1), num_clients=4))
    # sum of drifts: (0.5, 0.5) + (-0.5, -1.0) = (0, -0.5)
    h = [0.1 - alpha / 4 * 0.0, -0.2 - alpha / 4 * -0.5]
    mean = [(1.5 + 0.5) / 2, (2.5 + 1.0) / 2]
    torch.testing.assert_close(out["h"]["w"], torch.tensor(h))
    torch.testing.assert_close(
        out["params"]["w"], torch.tensor([mean[0] - h[0] / alpha, mean[1] - h[1] / alpha])
    )
    assert algo.global_model(out)[0] is out["params"]  # the evaluated model is theta


def test_h_is_the_mean_over_all_clients_of_their_gradient_state(tmp_path):
    """h and each client's state change by the same -alpha (theta_i - x), so h = (1/m) sum over
    all m clients of grad_i at every round: a wrong m, sign or stale x breaks it."""
    state, data, servers = run_linear(tmp_path, "feddyn", 3, train__participation=0.5)
    m = len(data.clients)
    states = [state.clients.get(c.cid) for c in data.clients]
    assert any(s and "grad" in s for s in states)
    for k, v in state.server["h"].items():
        total = sum((s["grad"][k] for s in states if s and "grad" in s), torch.zeros_like(v))
        torch.testing.assert_close(v, total / m, atol=1e-7, rtol=1e-5)
    assert max(float(v.abs().max()) for v in state.server["h"].values()) > 1e-5
