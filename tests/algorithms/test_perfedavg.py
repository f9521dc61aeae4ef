"""Per-FedAvg: the first-order direction by hand (and one engine step), the Hessian-free
direction against an explicit Hessian (exact and by the paper's finite difference), the
split of a mini-batch into D, D', D'', and the one-step adaptation that scores a client."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedshift.algorithms.base import Batch, ClientData, ModelOps, RoundContext
from fedshift.algorithms.perfedavg import (
    PerFedAvgFO,
    PerFedAvgHF,
    ce_loss,
    fo_meta_loss,
    hf_meta_loss,
    split_batch,
)
from fedshift.core.seeds import generator
from fedshift.engine.executors.base import RoundWork, SequentialExecutor, client_generator
from fedshift.engine.training import batch_schedule
from tests.conftest import RUN


class _Scalar(nn.Module):
    """Logits [x·v, 0] of a one-parameter model."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.tensor(0.0))

    def forward(self, x, return_features=False):
        logits = torch.stack([x[:, 0] * self.v, torch.zeros_like(x[:, 0])], dim=1)
        return (x, logits) if return_features else logits


def dce(p: float, x: float, y: int) -> float:
    """d/dp CE([x p, 0], y) = (sigmoid(x p) - [y == 0]) x."""
    return (1 / (1 + math.exp(-x * p)) - (1.0 if y == 0 else 0.0)) * x


def _scalar_ops() -> ModelOps:
    return ModelOps(_Scalar, torch.device("cpu"))


def test_split_batch_parts():
    x, y = torch.arange(7.0)[:, None], torch.arange(7)
    assert [len(p[1]) for p in split_batch(x, y, 2)] == [3, 4]
    parts = split_batch(x, y, 3)
    assert [p[1].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5, 6]]
    assert [len(p[1]) for p in split_batch(x[:1], y[:1], 2)] == [0, 1]


def test_fo_direction_by_hand():
    """Gradient of f(w - alpha sg(grad f(w; D)); D') = f'(w'; D') at w' = w - alpha f'(w; D)."""
    ops, alpha, w0 = _scalar_ops(), 0.3, 0.4
    (x1, y1), (x2, y2) = (1.5, 0), (-0.7, 1)
    w = {"v": torch.tensor(w0, requires_grad=True)}

    def f(x, y):
        return lambda p: ce_loss(ops, p, {}, torch.tensor([[x]]), torch.tensor([y]))

    loss = fo_meta_loss(f(x1, y1), f(x2, y2), w, alpha)
    (g,) = torch.autograd.grad(loss, [w["v"]])
    w_adapted = w0 - alpha * dce(w0, x1, y1)
    assert float(g) == pytest.approx(dce(w_adapted, x2, y2), rel=1e-6)
    # not the plain gradient at w (no adaptation), nor the adaptation the wrong way
    assert abs(float(g) - dce(w0, x2, y2)) > 1e-3
    assert abs(float(g) - dce(w0 + alpha * dce(w0, x1, y1), x2, y2)) > 1e-3


def test_fo_engine_step_by_hand():
    """One local step of the sequential executor on a batch of 2 (D: its first sample in the
    batch order, D': its second): w <- w - beta f'(w'; D'), beta the run's lr."""
    alpha, beta, w0 = 0.3, 0.2, 0.4
    xs, ys = torch.tensor([[1.5], [-0.7]]), torch.tensor([0, 1])
    algo = PerFedAvgFO(PerFedAvgFO.parse_params({"alpha": alpha}), _scalar_ops(), 2, **RUN)
    server = algo.init_server_state([({"v": torch.tensor(w0)}, {})])
    data = ClientData(0, torch.arange(2), ys, lambda idx: xs[idx])
    task = algo.client_task(server, {}, data, RoundContext(1, lr=beta))
    work = RoundWork.of(lr=beta, momentum=0.0, weight_decay=0.0, batch_size=2, drop_last=False)
    res = SequentialExecutor().train_one(algo, task, data, work)
    (order,) = batch_schedule(2, 2, 1, False, client_generator(0, 1, 0))
    (x1, y1), (x2, y2) = [(float(xs[i, 0]), int(ys[i])) for i in order]
    w_adapted = w0 - alpha * dce(w0, x1, y1)
    assert float(res.params[0]["v"]) == pytest.approx(w0 - beta * dce(w_adapted, x2, y2), rel=1e-6)


class _Linear(nn.Module):
    """A 3-class linear model on 3 features (float64)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3).double()

    def forward(self, x, return_features=False):
        logits = self.fc(x)
        return (x, logits) if return_features else logits


def _linear_setup():
    torch.manual_seed(0)
    ops = ModelOps(_Linear, torch.device("cpu"))
    params, _ = ops.init(0)
    x = torch.randn(6, 3, dtype=torch.float64)
    y = torch.tensor([0, 2, 1, 1, 2, 0])
    return ops, params, x, y


def _explicit_hf_direction(ops, params, parts, alpha):
    """grad f(w'; D') - alpha H(w; D'') grad f(w'; D') with the Hessian built explicitly."""
    names = list(params)
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]
    flat0 = torch.cat([params[k].reshape(-1) for k in names]).detach()

    def unflat(flat):
        return {k: t.reshape(s) for k, t, s in zip(names, flat.split(sizes), shapes, strict=True)}

    def f(flat, part):
        x, y = parts[part]
        return ce_loss(ops, unflat(flat), {}, x, y)

    g_d = torch.autograd.functional.jacobian(lambda z: f(z, 0), flat0)
    w_adapted = flat0 - alpha * g_d
    g1 = torch.autograd.functional.jacobian(lambda z: f(z, 1), w_adapted)
    hessian = torch.autograd.functional.hessian(lambda z: f(z, 2), flat0)
    return g1, hessian @ g1, float(f(w_adapted, 1)), names


@pytest.mark.parametrize("hvp, tol", [("exact", 1e-10), ("finite_difference", 1e-6)])
def test_hf_direction_matches_an_explicit_hessian(hvp, tol):
    ops, params, x, y = _linear_setup()
    alpha, delta = 0.5, 1e-4
    parts = split_batch(x, y, 3)
    g1, hg, meta_value, names = _explicit_hf_direction(ops, params, parts, alpha)
    assert float((alpha * hg).norm()) > 0.05 * float(g1.norm())  # the Hessian term matters
    w = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    fs = [lambda p, x=px, y=py: ce_loss(ops, p, {}, x, y) for px, py in parts]
    loss = hf_meta_loss(*fs, w, alpha, delta, exact=hvp == "exact")
    grads = torch.autograd.grad(loss, [w[k] for k in names])
    got = torch.cat([g.reshape(-1) for g in grads])
    torch.testing.assert_close(got, g1 - alpha * hg, atol=tol, rtol=0)
    assert float(loss.detach()) == pytest.approx(meta_value, rel=1e-12)  # value: f(w'; D')


def test_hf_meta_loss_of_the_algorithm_uses_thirds_of_the_batch():
    ops, params, x, y = _linear_setup()
    alpha = 0.5
    algo = PerFedAvgHF(PerFedAvgHF.parse_params({"alpha": alpha, "hvp": "exact"}), ops, 3, **RUN)
    w = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    batch = Batch(x=x, y=y, pos=torch.arange(6))
    grads = torch.autograd.grad(algo.meta_loss([w], [{}], batch, {}), list(w.values()))
    g1, hg, _, _ = _explicit_hf_direction(ops, params, split_batch(x, y, 3), alpha)
    got = torch.cat([g.reshape(-1) for g in grads])
    torch.testing.assert_close(got, g1 - alpha * hg, atol=1e-10, rtol=0)


def test_clients_are_scored_after_one_adaptation_step_of_size_alpha():
    alpha, w0, n = 0.3, 0.4, 10
    xs = torch.linspace(-1.0, 2.0, n)[:, None]
    ys = (torch.arange(n) % 2).long()
    algo = PerFedAvgFO(PerFedAvgFO.parse_params({"alpha": alpha}), _scalar_ops(), 2, **RUN)
    server = algo.init_server_state([({"v": torch.tensor(w0)}, {})])
    data = ClientData(0, torch.arange(n), ys, lambda idx: xs[idx])
    task = algo.fine_tune_task(server, {}, data)
    assert task.params[0] is server["params"]
    (phase,) = task.phases
    assert (phase.steps, phase.lr, phase.momentum, phase.weight_decay) == (1, alpha, 0.0, 0.0)
    bs = RUN["train"].batch_size // 2
    assert phase.batch_size == bs
    # the engine's evaluation trains it with the run's settings, which the phase overrides
    work = RoundWork.of(lr=1.0, momentum=0.9, weight_decay=0.1, batch_size=128, drop_last=True)
    res = SequentialExecutor().train_one(algo, task, data, work)
    (pos,) = batch_schedule(n, bs, 1, True, generator(*task.stream))
    grad = sum(dce(w0, float(xs[i, 0]), int(ys[i])) for i in pos) / len(pos)
    tuned = algo.tuned_mixture(server, {}, data, res)[0][1]
    assert float(tuned["v"]) == pytest.approx(w0 - alpha * grad, rel=1e-6)
    assert float(server["params"]["v"]) == pytest.approx(w0)  # untouched
    empty = ClientData(1, torch.zeros(0, dtype=torch.long), torch.zeros(0), lambda i: i)
    assert algo.fine_tune_task(server, {}, empty) is None
