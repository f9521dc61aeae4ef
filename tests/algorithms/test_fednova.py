"""FedNova: the effective steps a_i, the normalised server step by hand, equal steps = FedAvg,
and, under the engine's unequal local work (train.local_epochs_max), a round whose aggregate
differs from FedAvg's exactly as the formula says."""

from __future__ import annotations

import pytest
import torch

from fedshift.algorithms.base import ClientResult, ModelOps, RoundContext, TrainDefaults
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.fednova import FedNova, effective_steps
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, sim_config
from tests.algorithms.conftest import LinearNet
from tests.conftest import tiny_config


def _counters(tau: int, rho: float) -> float:
    """sum over the steps j = 1..tau of 1 + rho + ... + rho^(j-1), by an explicit loop."""
    total, counter = 0.0, 0.0
    for _ in range(tau):
        counter = counter * rho + 1.0
        total += counter
    return total


def _algo(cls, momentum: float = 0.0, **params):
    ops = ModelOps(LinearNet, torch.device("cpu"))
    train = TrainDefaults(momentum=momentum)
    return cls(cls.parse_params(params), ops, 2, seed=0, train=train)


def _res(cid, y, n, steps, buf=None) -> ClientResult:
    buffers = [{} if buf is None else {"bn": torch.tensor(buf)}]
    return ClientResult(cid, n, [{"w": torch.tensor(y)}], buffers, steps=steps)


SERVER = {"params": {"w": torch.tensor([1.0, 2.0])}, "buffers": {"bn": torch.tensor([0.0])}}


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_effective_steps_match_the_momentum_counters(rho):
    for tau in range(1, 7):
        assert effective_steps(tau, rho) == pytest.approx(_counters(tau, rho), rel=1e-12)
    assert effective_steps(0, rho) == 0.0
    if rho == 0.0:
        assert effective_steps(5, rho) == 5.0


def test_server_step_with_unequal_steps_by_hand():
    """Plain SGD: p = (10, 30)/40, tau = (2, 6): d_i = (x - y_i)/tau_i, tau_eff = sum p tau
    = 5, x <- x - 5 (p_1 d_1 + p_2 d_2) = (1.125, 1.5); FedAvg's mean is (1.25, 1.3)."""
    results = [_res(0, [0.8, 2.2], 10, 2, [1.0]), _res(1, [1.4, 1.0], 30, 6, [3.0])]
    out = _algo(FedNova).aggregate(SERVER, iter(results), RoundContext(1))
    d1 = [(1.0 - 0.8) / 2, (2.0 - 2.2) / 2]
    d2 = [(1.0 - 1.4) / 6, (2.0 - 1.0) / 6]
    tau_eff = 0.25 * 2 + 0.75 * 6
    expected = [
        1.0 - tau_eff * (0.25 * d1[0] + 0.75 * d2[0]),
        2.0 - tau_eff * (0.25 * d1[1] + 0.75 * d2[1]),
    ]
    assert expected == pytest.approx([1.125, 1.5])
    torch.testing.assert_close(out["params"]["w"], torch.tensor(expected))
    torch.testing.assert_close(out["buffers"]["bn"], torch.tensor([0.25 * 1.0 + 0.75 * 3.0]))
    fedavg = _algo(FedAvg).aggregate(SERVER, iter(results), RoundContext(1))
    torch.testing.assert_close(fedavg["params"]["w"], torch.tensor([1.25, 1.3]))


def test_server_step_with_momentum_and_uniform_weights_by_hand():
    """rho = 0.9: a_i are the counter sums; tau_eff = sum p a_i; uniform p = 1/2."""
    rho = 0.9
    results = [_res(0, [0.8, 2.2], 10, 2), _res(1, [1.4, 1.0], 30, 5)]
    out = _algo(FedNova, rho, weighting="uniform").aggregate(SERVER, iter(results), RoundContext(1))
    a1, a2 = _counters(2, rho), _counters(5, rho)
    tau_eff = 0.5 * a1 + 0.5 * a2
    for j, (x, y1, y2) in enumerate([(1.0, 0.8, 1.4), (2.0, 2.2, 1.0)]):
        expected = x - tau_eff * (0.5 * (x - y1) / a1 + 0.5 * (x - y2) / a2)
        assert float(out["params"]["w"][j]) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_equal_steps_give_fedavg(rho):
    results = [_res(0, [0.8, 2.2], 10, 4, [1.0]), _res(1, [1.4, 1.0], 30, 4, [3.0])]
    nova = _algo(FedNova, rho).aggregate(SERVER, iter(results), RoundContext(1))
    avg = _algo(FedAvg, rho).aggregate(SERVER, iter(results), RoundContext(1))
    for part in ("params", "buffers"):
        for k, v in avg[part].items():
            torch.testing.assert_close(nova[part][k], v)


def test_clients_without_steps_or_samples_do_not_count():
    results = [_res(0, [0.8, 2.2], 10, 2), _res(1, [9.0, 9.0], 30, 0), _res(2, [7.0, 7.0], 0, 3)]
    out = _algo(FedNova).aggregate(SERVER, iter(results), RoundContext(1))
    torch.testing.assert_close(out["params"]["w"], torch.tensor([0.8, 2.2]))  # one client: y_1


class _Recorder:
    """Wraps an algorithm's aggregate to keep the round's results."""

    def __init__(self, algo) -> None:
        self.results: list[ClientResult] = []
        self.server = None
        inner = algo.aggregate

        def aggregate(server, results, ctx):
            self.results, self.server = list(results), server
            return inner(server, iter(self.results), ctx)

        algo.aggregate = aggregate


def _one_round(tmp_path, name):
    """One round of 6 IID clients, each drawing 1-4 local epochs (momentum 0.9)."""
    raw = tiny_config(
        tmp_path / name,
        algorithm__name=name,
        train__rounds=1,
        train__local_epochs=1,
        train__local_epochs_max=4,
    )
    raw["eval"] = {"every": 1, "train_metrics": False}
    cfg = validate_config(raw)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    rec = _Recorder(algo)
    state = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    return state.server, rec, cfg


def test_unequal_local_epochs_fednova_differs_from_fedavg_exactly_as_the_formula(tmp_path):
    nova, rec, cfg = _one_round(tmp_path, "fednova")
    avg, rec_avg, _ = _one_round(tmp_path, "fedavg")
    steps = [r.steps for r in rec.results]
    assert len(set(steps)) > 1, steps  # the draw gave unequal local work
    # same start model, same batches: the clients trained the same under both algorithms
    assert steps == [r.steps for r in rec_avg.results]
    for a, b in zip(rec.results, rec_avg.results, strict=True):
        for k in a.params[0]:
            torch.testing.assert_close(a.params[0][k], b.params[0][k])
    rho = cfg.train.momentum
    x = rec.server["params"]
    n = [r.num_samples for r in rec.results]
    p = [ni / sum(n) for ni in n]
    a = [_counters(s, rho) for s in steps]
    tau_eff = sum(pi * ai for pi, ai in zip(p, a, strict=True))
    gap = 0.0
    for k, xk in x.items():
        ys = [r.params[0][k] for r in rec.results]
        mean = sum(pi * y for pi, y in zip(p, ys, strict=True))
        normalised = sum(pi * (xk - y) / ai for pi, y, ai in zip(p, ys, a, strict=True))
        torch.testing.assert_close(avg["params"][k], mean)
        torch.testing.assert_close(nova["params"][k], xk - tau_eff * normalised)
        gap = max(gap, float((nova["params"][k] - avg["params"][k]).abs().max()))
    assert gap > 1e-4
