"""Server optimisers (FedAvgM, FedAdam, FedYogi, FedAdagrad): each update rule by hand, their
composition with other algorithms from the config, and unequal local work
(``train.local_epochs_max``)."""

from __future__ import annotations

import math

import pytest
import torch

from fedshift.algorithms.server_opt import (
    ServerOptimizer,
    apply_server_optimizer,
    averaged_models,
    server_step,
)
from fedshift.config import validate_config
from fedshift.core.errors import ConfigError
from fedshift.run.experiment import run_experiment
from tests.conftest import tiny_config

X, D = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.1])


def by_hand(kind: str, x: float, deltas: list[float], **hp) -> float:
    """Reddi et al.'s Algorithm 2 (and FedAvgM) on one scalar, written out step by step."""
    lr, b1, b2, tau, mom = (
        hp.get("lr", 1.0), hp.get("beta1", 0.9), hp.get("beta2", 0.99), hp.get("tau", 1e-3),
        hp.get("momentum", 0.0),
    )  # fmt: skip
    m, v = 0.0, tau * tau
    for d in deltas:
        if kind == "sgd":
            m = mom * m + d
            x = x + lr * m
            continue
        m = b1 * m + (1 - b1) * d
        if kind == "adagrad":
            v = v + d * d
        elif kind == "adam":
            v = b2 * v + (1 - b2) * d * d
        else:
            v = v - (1 - b2) * d * d * math.copysign(1.0, v - d * d)
        x = x + lr * m / (math.sqrt(v) + tau)
    return x


@pytest.mark.parametrize("kind", ["sgd", "adam", "yogi", "adagrad"])
def test_each_update_rule_matches_the_paper_over_three_steps(kind):
    opt = ServerOptimizer(kind, lr=0.1, momentum=0.9, beta1=0.8, beta2=0.95, tau=0.01)
    deltas = [0.3, -0.2, 0.05]
    x, m, v = torch.tensor([2.0]), None, None
    for d in deltas:
        x, m, v = server_step(x, torch.tensor([d]), m, v, opt)
    hp = {"lr": 0.1, "momentum": 0.9, "beta1": 0.8, "beta2": 0.95, "tau": 0.01}
    assert float(x) == pytest.approx(by_hand(kind, 2.0, deltas, **hp), rel=1e-5)


def test_yogi_and_adam_differ_where_the_sign_term_acts():
    """Yogi's second moment moves by a sign, Adam's by an average: after a large then a small
    pseudo-gradient they disagree (a Yogi written as Adam fails here)."""
    a, y = ServerOptimizer("adam", lr=0.1), ServerOptimizer("yogi", lr=0.1)
    xa, ma, va = server_step(X, D * 10, None, None, a)
    xy, my, vy = server_step(X, D * 10, None, None, y)
    xa, _, va = server_step(xa, D, ma, va, a)
    xy, _, vy = server_step(xy, D, my, vy, y)
    assert not torch.allclose(va, vy)
    assert not torch.allclose(xa, xy)


def test_plain_sgd_on_the_server_is_the_aggregate_itself():
    x, _, _ = server_step(X, D, None, None, ServerOptimizer("sgd", lr=1.0))
    assert torch.equal(x, X + D)


def test_it_steps_every_cluster_model_and_keeps_buffers_and_other_keys():
    before = {
        "models": [{"params": {"w": X.clone()}, "buffers": {"b": torch.zeros(1)}}] * 2,
        "extra": 7,
    }
    after = {
        "models": [
            {"params": {"w": X + D}, "buffers": {"b": torch.ones(1)}},
            {"params": {"w": X - D}, "buffers": {"b": torch.ones(1)}},
        ],
        "extra": 8,
    }
    opt = ServerOptimizer("adam", lr=0.05)
    new, state = apply_server_optimizer(before, after, opt, {})
    for k, sign in ((0, 1), (1, -1)):
        want, _, _ = server_step(X, sign * D, None, None, opt)
        assert torch.allclose(new["models"][k]["params"]["w"], want)
        assert torch.equal(new["models"][k]["buffers"]["b"], torch.ones(1))
    assert new["extra"] == 8 and len(state["m"]) == 2
    # the second round continues from the moments of the first
    again, _ = apply_server_optimizer(new, after, opt, state)
    x1, m1, v1 = server_step(X, D, None, None, opt)
    x2, _, _ = server_step(x1, X + D - x1, m1, v1, opt)
    assert torch.allclose(again["models"][0]["params"]["w"], x2)


def test_a_state_without_an_averaged_model_is_named():
    assert averaged_models({"protos": torch.zeros(2)}) is None
    with pytest.raises(ValueError, match="no averaged model"):
        apply_server_optimizer({"protos": X}, {"protos": X}, ServerOptimizer("sgd"), {})


# ---------------------------------------------------------------------- in runs


def history(tmp_path, name, **over):
    raw = tiny_config(tmp_path, name=name, train__rounds=3, train__participation=0.5, **over)
    return run_experiment(validate_config(raw)).history


def test_fedavgm_without_momentum_and_unit_lr_is_fedavg(tmp_path):
    avg = history(tmp_path, "avg")
    alg = {"name": "fedavgm", "params": {"server_momentum": 0.0, "server_lr": 1.0}}
    m0 = history(tmp_path, "m0", algorithm=alg)
    m9 = history(tmp_path, "m9", algorithm={"name": "fedavgm"})
    for a, b in zip(avg, m0, strict=True):
        assert a["global_acc"] == pytest.approx(b["global_acc"], abs=1e-9)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    assert m9[-1]["train_loss"] != pytest.approx(avg[-1]["train_loss"], rel=1e-4)


def test_the_config_puts_a_server_optimizer_on_any_averaging_algorithm(tmp_path):
    """FedAdam on FedProx from the config differs from FedProx; the config's choice replaces
    an algorithm's own (FedAdam with a plain-sgd server optimiser is FedAvg again)."""
    prox = {"name": "fedprox", "params": {"mu": 0.1}}
    adam = {"kind": "adam", "lr": 0.01}
    plain = history(tmp_path, "prox", algorithm=prox)
    composed = history(tmp_path, "prox-adam", algorithm=prox, train__server_optimizer=adam)
    assert composed[-1]["train_loss"] != pytest.approx(plain[-1]["train_loss"], rel=1e-4)
    avg = history(tmp_path, "avg")
    unit = {"kind": "sgd", "lr": 1.0}
    over = history(tmp_path, "adam-as-avg", algorithm={"name": "fedadam"},
                   train__server_optimizer=unit)  # fmt: skip
    assert over[-1]["train_loss"] == pytest.approx(avg[-1]["train_loss"], rel=1e-6)


def test_fedyogi_on_fedrc_cluster_models_runs_and_resumes(tmp_path):
    over = {
        "algorithm": {"name": "fedrc", "params": {"num_clusters": 2}},
        "train__server_optimizer": {"kind": "yogi", "lr": 0.01},
        "train__rounds": 4,
    }
    raw = tiny_config(tmp_path, train__participation=0.5, **over)
    full = run_experiment(validate_config({**raw, "name": "full"})).history
    run_experiment(validate_config({**raw, "name": "part", "train": {**raw["train"], "rounds": 2}}))
    resumed = run_experiment(
        validate_config({**raw, "name": "part"}), run_dir=tmp_path / "runs" / "part", resume=True
    ).history
    assert [h["global_acc"] for h in full] == pytest.approx([h["global_acc"] for h in resumed])


def test_an_algorithm_without_an_averaged_model_is_refused(tmp_path):
    raw = tiny_config(tmp_path, algorithm={"name": "fedproto"},
                      train__server_optimizer={"kind": "adam"})  # fmt: skip
    with pytest.raises(ConfigError, match="needs an algorithm that averages models"):
        run_experiment(validate_config(raw))


def test_unknown_server_optimizer_kind_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="server_optimizer"):
        validate_config(tiny_config(tmp_path, train__server_optimizer={"kind": "lamb"}))


# ---------------------------------------------------------------------- unequal local work


def test_unequal_local_epochs_are_drawn_per_client_within_the_range(tmp_path):
    from fedshift.data.scenario import build_scenario
    from fedshift.engine.simulator import SimState, Simulator
    from fedshift.run.experiment import make_algorithm, sim_config

    raw = tiny_config(tmp_path, train__local_epochs=1, train__local_epochs_max=4,
                      train__batch_size=50)  # fmt: skip
    cfg = validate_config(raw)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    steps: dict[int, list[int]] = {}

    class Spy:
        name = "spy"

        def train(self, algo, jobs, work):
            from fedshift.engine.executors.base import SequentialExecutor

            for r in SequentialExecutor().train(algo, jobs, work):
                steps.setdefault(r.cid, []).append(r.steps)
                yield r

    sim = Simulator(algo, data, sim_config(cfg), executor=Spy())
    sim.run(SimState(round=0, server=sim.initial_state().server, clients={}))
    per_epoch = {c.cid: len(c.train_idx) // 50 for c in data.clients}
    epochs = {e for cid, s in steps.items() for e in (x // per_epoch[cid] for x in s)}
    assert epochs <= {1, 2, 3, 4} and len(epochs) >= 2, epochs
    assert all(x % per_epoch[cid] == 0 for cid, s in steps.items() for x in s)
    assert sim._local_epochs(2, 1) == sim._local_epochs(2, 1)  # its own stream: reproducible


@pytest.mark.parametrize(
    "over, msg",
    [
        ({"train__local_epochs_max": 3, "train__local_steps": 5}, "cannot be combined"),
        ({"train__local_epochs": 3, "train__local_epochs_max": 2}, "below local_epochs"),
    ],
)
def test_unequal_local_work_config_errors_name_the_fix(tmp_path, over, msg):
    with pytest.raises(ConfigError, match=msg):
        validate_config(tiny_config(tmp_path, **over))
