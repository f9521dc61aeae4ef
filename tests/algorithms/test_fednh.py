"""FedNH's math (prototype init, cosine head, local and server prototypes), FedNH's protocol
metrics (PM(V), PM(L), spread), the engine features its baselines need (training stages, lr
decay, gradient clipping) and executor equivalence for FedNH, FedPer and FedRep."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedshift.algorithms.base import Phase
from fedshift.algorithms.fednh import (
    CosineHead,
    cosine_logits,
    init_prototypes,
    local_prototypes,
    simplex_etf,
    spread_on_sphere,
    update_prototypes,
)
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.metrics import class_weighted_accuracy, per_class_counts, pm_weights, spread
from fedshift.engine.simulator import Simulator
from fedshift.engine.training import SGDConfig, round_lr, sgd_step
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from tests.conftest import assert_close64, assert_history_same, run_executors, tiny_config


def pairwise_cos(w: torch.Tensor) -> torch.Tensor:
    c = w @ w.T
    return c[~torch.eye(len(w), dtype=torch.bool)]


# ---------------------------------------------------------------------- prototype init
def test_orthogonal_init_rows_are_orthonormal():
    w = init_prototypes("orthogonal", 10, 192, torch.Generator().manual_seed(0))
    assert torch.allclose(w.norm(dim=1), torch.ones(10), atol=1e-5)
    assert pairwise_cos(w).abs().max() < 1e-5  # ||w_i - w_j||^2 = 2 for all pairs
    d2 = torch.cdist(w, w) ** 2
    assert torch.allclose(d2[~torch.eye(10, dtype=torch.bool)], torch.full((90,), 2.0), atol=1e-4)


@pytest.mark.parametrize("C,d", [(2, 2), (10, 192), (10, 10)])
def test_maxmin_init_is_the_simplex_etf(C, d):
    w = init_prototypes("maxmin", C, d, torch.Generator().manual_seed(1))
    assert torch.allclose(w.norm(dim=1), torch.ones(C), atol=1e-5)
    # optimum of Eq. (1): equidistant with cosine -1/(C-1), squared distance 2C/(C-1)
    assert torch.allclose(pairwise_cos(w), torch.full((C * (C - 1),), -1 / (C - 1)), atol=1e-5)
    d2 = (torch.cdist(w, w) ** 2)[~torch.eye(C, dtype=torch.bool)]
    assert torch.allclose(d2, torch.full_like(d2, 2 * C / (C - 1)), atol=1e-4)


def test_maxmin_beats_orthogonal_and_numeric_solution_when_more_classes_than_dims():
    g = torch.Generator().manual_seed(0)
    assert (
        pairwise_cos(simplex_etf(5, 8, g)).max()
        < pairwise_cos(init_prototypes("orthogonal", 5, 8, g)).max() - 0.2
    )
    # 6 points on the circle: the optimum is the regular hexagon, max cosine cos(60°) = 0.5
    w = spread_on_sphere(6, 2, steps=1500, generator=g)
    assert torch.allclose(w.norm(dim=1), torch.ones(6), atol=1e-5)
    assert pairwise_cos(w).max() < 0.5 + 0.02
    with pytest.raises(ValueError, match="classes <= dim"):
        simplex_etf(5, 3)
    with pytest.raises(ValueError, match="unknown prototype init"):
        init_prototypes("uniform", 3, 3)


# ---------------------------------------------------------------------- cosine head
def test_cosine_head_by_hand():
    f = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-0.6, 0.8]])
    out = cosine_logits(f, w, torch.tensor([2.0]))
    # f/||f|| = (0.6, 0.8): cosines 0.6, 0.8, -0.36+0.64=0.28, times s=2; a zero feature -> 0
    assert torch.allclose(out[0], torch.tensor([1.2, 1.6, 0.56]))
    assert torch.equal(out[1], torch.zeros(3))
    head = CosineHead(2, 3, "orthogonal", scale_init=1.0, learn_scale=True)
    names = [n for n, _ in head.named_parameters()]
    assert names == ["scale"]  # prototypes are a buffer: local SGD never changes them
    fixed = CosineHead(2, 3, "maxmin", scale_init=30.0, learn_scale=False)
    assert list(fixed.parameters()) == [] and float(fixed.scale) == 30.0


# ---------------------------------------------------------------------- prototypes
def test_local_prototypes_code_and_paper():
    feats = torch.tensor([[2.0, 0.0], [0.0, 5.0], [3.0, 4.0]])
    y = torch.tensor([0, 0, 2])
    vec, count = local_prototypes(feats, y, 3, "code")
    # class 0: mean of (1,0),(0,1) = (.5,.5) -> unit (.7071,.7071) times n=2; class 1 absent
    r = 1 / math.sqrt(2)
    assert torch.allclose(vec[0], torch.tensor([2 * r, 2 * r]), atol=1e-6)
    assert torch.equal(vec[1], torch.zeros(2))
    assert torch.allclose(vec[2], torch.tensor([0.6, 0.8]))
    assert count.tolist() == [2.0, 0.0, 1.0]
    means, _ = local_prototypes(feats, y, 3, "paper")
    assert torch.allclose(means[0], torch.tensor([0.5, 0.5]))


def test_server_prototype_update_by_hand():
    W = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    # two clients (code statistics): client A has class 0 (n=3, unit mean (0,1)),
    # client B has class 0 (n=1, unit mean (1,0)) and class 1 (n=2, unit mean (1,0))
    vec = torch.tensor([[0.0, 3.0], [0.0, 0.0], [0.0, 0.0]]) + torch.tensor(
        [[1.0, 0.0], [2.0, 0.0], [0.0, 0.0]]
    )
    cnt = torch.tensor([4.0, 2.0, 0.0])
    new = update_prototypes(W, vec, cnt, num_clients=2, rho=0.9, mode="code")
    m0 = torch.tensor([1.0, 3.0]) / math.sqrt(10)  # normalise((1,3)/4)
    e0 = torch.tensor([0.9, 0.0]) + 0.1 * m0
    assert torch.allclose(new[0], e0 / e0.norm(), atol=1e-6)
    e1 = torch.tensor([0.1, 0.9])
    assert torch.allclose(new[1], e1 / e1.norm(), atol=1e-6)
    assert torch.equal(new[2], W[2])  # nobody owns class 2: unchanged
    assert torch.allclose(new.norm(dim=1), torch.ones(3))
    # paper: alpha = 1/|S| over plain means, zeros for clients without the class
    means = torch.tensor([[0.5, 0.5], [0.0, 0.0], [0.0, 0.0]])
    p = update_prototypes(W, means, cnt, num_clients=2, rho=0.9, mode="paper")
    e = torch.tensor([0.9, 0.0]) + 0.1 * torch.tensor([0.25, 0.25])
    assert torch.allclose(p[0], e / e.norm(), atol=1e-6)
    # rho = 1 keeps the prototypes (FedUH)
    assert torch.allclose(update_prototypes(W, vec, cnt, 2, 1.0), W)


# ---------------------------------------------------------------------- PM metrics
def test_pm_v_and_pm_l_by_hand():
    # balanced test set, 2 samples per class; client saw classes 0 (3 samples) and 2 (1)
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0, 0, 1, 0, 2, 0])  # acc per class: 1.0, 0.5, 0.5
    correct, count = per_class_counts(pred, y, 3)
    assert correct.tolist() == [2, 1, 1] and count.tolist() == [2, 2, 2]
    w_v, w_l = pm_weights([3, 0, 1])
    assert w_v.tolist() == [1, 0, 1] and w_l.tolist() == [0.75, 0, 0.25]
    assert class_weighted_accuracy(correct, count, w_v) == pytest.approx(75.0)  # (1+.5)/2
    assert class_weighted_accuracy(correct, count, w_l) == pytest.approx(87.5)  # .75+.125
    # uniform weights = plain accuracy (GM)
    assert class_weighted_accuracy(correct, count, torch.ones(3)) == pytest.approx(400 / 6)
    assert math.isnan(class_weighted_accuracy(correct, torch.zeros(3), torch.ones(3)))


def test_spread_mean_std_worst_decile():
    mean, std, worst = spread([50.0, 70.0, 90.0, float("nan")])
    assert mean == pytest.approx(70.0)
    assert std == pytest.approx(math.sqrt(800 / 3))
    assert worst == 50.0
    vals = [float(v) for v in range(1, 21)]  # 20 clients: worst 10% = the 2 lowest
    assert spread(vals)[2] == pytest.approx(1.5)
    assert all(math.isnan(v) for v in spread([]))


# ---------------------------------------------------------------------- engine pieces
def test_gradient_clipping_matches_torch():
    torch.manual_seed(0)
    a = [torch.randn(3, 4), torch.randn(5)]
    g = [torch.randn(3, 4) * 10, torch.randn(5) * 10]
    ref = [nn.Parameter(t.clone()) for t in a]
    for p, gr in zip(ref, g, strict=True):
        p.grad = gr.clone()
    nn.utils.clip_grad_norm_(ref, max_norm=1.0)
    opt = torch.optim.SGD(ref, lr=0.1, momentum=0.9, weight_decay=1e-3)
    opt.step()
    ours = [t.clone() for t in a]
    sgd_step(ours, g, [None, None], SGDConfig(0.1, 0.9, 1e-3, grad_clip=1.0))
    for p, o in zip(ref, ours, strict=True):
        assert torch.allclose(p.detach(), o, atol=1e-6)
    small = [torch.full((2,), 0.1)]
    out = [torch.zeros(2)]
    sgd_step(out, small, [None], SGDConfig(1.0, grad_clip=10.0))  # under the cap: unchanged
    assert torch.allclose(out[0], -small[0])


def test_round_lr_decays_per_round():
    assert round_lr(0.01, 0.99, 1) == 0.01
    assert round_lr(0.01, 0.99, 201) == pytest.approx(0.01 * 0.99**200)


def test_phase_selects_trained_parameters():
    names = ["body.w", "body.b", "head.w"]
    assert Phase().trained_names(0, names) == names
    ph = Phase(trainable=((0, ("head.w",)), (1, None)))
    assert ph.trained_names(0, names) == ["head.w"]
    assert ph.trained_names(1, names) == names
    assert ph.trained_names(2, names) == []


# ---------------------------------------------------------------------- end to end
def fednh_cfg(tmp_path, algorithm, **over):
    raw = tiny_config(
        tmp_path,
        algorithm=algorithm,
        scenario__label_shift={"kind": "dirichlet", "alpha": 0.3},
        scenario__test_clients={"enabled": True, "adapt_fraction": 0.0},
        scenario__num_clients=8,
        model={"name": "mlp", "width": 32, "head_bias": False},
        train={
            "rounds": 3,
            "participation": 0.5,
            "local_epochs": 2,
            "batch_size": 16,
            "lr": 0.05,
            "lr_decay": 0.99,
            "grad_clip": 10.0,
        },
        eval={"every": 1, "personal": "active"},
        **over,
    )
    return validate_config(raw)


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fednh", "params": {"weighting": "uniform"}},
        {"name": "fednh", "params": {"init": "maxmin", "prototype_average": "paper"}},
        {"name": "fedrep", "params": {"head_epochs": 2}},
        {"name": "fedper"},
    ],
    ids=["fednh-code", "fednh-paper", "fedrep", "fedper"],
)
@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_batched_matches_sequential(tmp_path, algorithm, vectorize):
    cfg = fednh_cfg(tmp_path, algorithm)
    ex = (SequentialExecutor(), BatchedExecutor(chunk_size=3, vectorize=vectorize))
    seq, bat = run_executors(cfg, ex)  # float64: see F64_ATOL in fedshift/testing.py
    for part in ("params", "buffers"):
        for k, v in seq.server[part].items():
            assert_close64(bat.server[part][k], v, f"{part} {k}")
    assert_history_same(seq, bat, ("gm_acc", "pm_v", "pm_l"))


def test_fednh_run_moves_prototypes_and_reports_pm(tmp_path):
    cfg = fednh_cfg(tmp_path, {"name": "fednh"})
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    sim = Simulator(algo, data, sim_config(cfg), SequentialExecutor())
    init = sim.initial_state()
    w0 = init.server["buffers"]["head.prototypes"].clone()
    state = sim.run(init)
    w = state.server["buffers"]["head.prototypes"]
    assert torch.allclose(w.norm(dim=1), torch.ones(len(w)), atol=1e-5)
    assert (w - w0).abs().max() > 1e-3  # the server update moved them
    assert "head.scale" in state.server["params"]  # s is trained and averaged
    h = state.history[-1]
    assert h["pm_clients"] == 4  # participation 0.5 of 8 clients, "active" protocol
    for k in ("gm_acc", "pm_v", "pm_l"):
        assert h[k] > 50, (k, h)  # well above chance (25%: 4 classes)
    for pm in ("pm_v", "pm_l"):
        mean, worst, std = h[pm], h[f"{pm}_worst10"], h[f"{pm}_std"]
        assert worst <= mean  # the worst 10% (here the worst of 4 clients) is below the mean
        # spread over 4 clients: one value `mean - worst` away from the mean makes it at least
        # (mean - worst) / sqrt(4 - 1)
        assert std >= (mean - worst) / math.sqrt(3) - 1e-9, (pm, h)


def test_fedrep_stages_and_fedper_keep_private_heads(tmp_path):
    cfg = fednh_cfg(tmp_path, {"name": "fedrep", "params": {"head_epochs": 1}})
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    sim = Simulator(algo, data, sim_config(cfg), SequentialExecutor())
    init = sim.initial_state()
    head0 = {k: init.server["params"][k].clone() for k in algo.head_names}
    state = sim.run(init)
    # the server's head stays the initial one (GM = global body + initial head) ...
    for k, v in head0.items():
        assert torch.equal(state.server["params"][k], v)
    # ... while each trained client has its own head
    heads = [c["params"][next(iter(algo.head_names))] for c in state.clients.values()]
    assert len(heads) >= 2 and not torch.equal(heads[0], heads[1])
    assert not torch.equal(heads[0], next(iter(head0.values())))


def test_gm_is_not_applicable_without_a_global_model_and_all_protocol(tmp_path):
    cfg = fednh_cfg(tmp_path, {"name": "local"}, name="local-pm")
    cfg.eval.personal = "all"
    res = run_experiment(cfg)
    h = res.history[-1]
    assert "pm_v" in h and h["pm_clients"] >= 4
    # Local's server keeps the average of local models as a stand-in global model for FedRC's
    # protocol; it reports a GM only because it defines global_model
    assert ("gm_acc" in h) == (
        make_algorithm(cfg, res.data, torch.device("cpu")).global_model(
            {"params": {}, "buffers": {}}
        )
        is not None
    )


def test_personal_metrics_without_test_clients_is_a_config_error(tmp_path):
    from fedshift.core.errors import ConfigError

    raw = tiny_config(
        tmp_path, eval={"personal": "active"}, scenario__test_clients={"enabled": False}
    )
    with pytest.raises(ConfigError, match="scenario.test_clients.enabled=true"):
        validate_config(raw)
