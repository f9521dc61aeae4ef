"""CReFF: the classifier gradient by hand and against autograd, the matching distance, the
synthetic-feature optimisation, the classifier re-training, the clients' real gradients, and
end-to-end runs (finite GM, executor equivalence, FedAvg's models unchanged)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import ClientResult, RoundContext
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.creff import (
    CReFF,
    class_batches,
    classifier_gradient,
    feature_step,
    gradient_match_distance,
    linear_head_names,
    linear_init,
    matching_loss,
    retrain_classifier,
)
from fedshift.algorithms.registry import get_algorithm
from fedshift.config import validate_config
from fedshift.core.errors import FedshiftError
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.models.base import SplitModel
from fedshift.run.experiment import make_algorithm, sim_config
from tests.conftest import assert_close64, run_executors, tiny_config

SMALL = {
    "num_features": 8,
    "feature_iters": 5,
    "retrain_epochs": 3,
    "retrain_batch_size": 16,
    "num_real_batches": 2,
    "real_batch_size": 16,
}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread avoids thread hand-offs that dominate on a busy
    machine (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------- pure math


def test_classifier_gradient_by_hand():
    # W = I, two samples of class 0: f1 = e0 (logits [1, 0]), f2 = e1 (logits [0, 1])
    w = torch.eye(2)
    f = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 0])
    s = 1 / (1 + math.exp(-1))  # softmax([1, 0])[0]
    # (softmax - onehot): e1 = [s - 1, 1 - s], e2 = [-s, s]; G = (e1 f1^T + e2 f2^T) / 2
    expected = torch.tensor([[(s - 1) / 2, -s / 2], [(1 - s) / 2, s / 2]])
    torch.testing.assert_close(classifier_gradient(f, y, w), expected)
    # the closed form (softmax(Wf) - onehot) f^T, averaged
    closed = (torch.softmax(f @ w.T, -1) - F.one_hot(y, 2)).T @ f / 2
    torch.testing.assert_close(classifier_gradient(f, y, w), closed)


@pytest.mark.parametrize("with_bias", [False, True])
def test_classifier_gradient_equals_autograd_incl_second_order(with_bias):
    g = torch.Generator().manual_seed(0)
    C, d, n = 4, 3, 5
    w = torch.randn(C, d, generator=g, dtype=torch.float64).requires_grad_(True)
    b = torch.randn(C, generator=g, dtype=torch.float64) if with_bias else None
    f = torch.randn(n, d, generator=g, dtype=torch.float64).requires_grad_(True)
    y = torch.randint(0, C, (n,), generator=g)
    logits = F.linear(f, w, b)
    (auto,) = torch.autograd.grad(F.cross_entropy(logits, y), w, create_graph=True)
    mine = classifier_gradient(f, y, w, b)
    torch.testing.assert_close(mine, auto)
    # differentiable in the features exactly as autograd's create_graph gradient
    probe = torch.randn(C, d, generator=g, dtype=torch.float64)
    (d_auto,) = torch.autograd.grad((auto * probe).sum(), f)
    (d_mine,) = torch.autograd.grad((mine * probe).sum(), f)
    torch.testing.assert_close(d_mine, d_auto)


def test_classifier_gradient_batched_with_padding():
    g = torch.Generator().manual_seed(1)
    C, d = 3, 4
    w = torch.randn(C, d, generator=g)
    sets = [torch.randn(k, d, generator=g) for k in (2, 5, 1)]
    feats = torch.zeros(3, 5, d)
    mask = torch.zeros(3, 5)
    for k, s in enumerate(sets):
        feats[k, : len(s)] = s
        mask[k, : len(s)] = 1
    labels = torch.arange(3)[:, None].expand(-1, 5)
    out = classifier_gradient(feats, labels, w, mask=mask)
    assert out.shape == (3, C, d)
    for k, s in enumerate(sets):
        ref = classifier_gradient(s, torch.full((len(s),), k), w)
        torch.testing.assert_close(out[k], ref)


def test_gradient_match_distance():
    g = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(gradient_match_distance(g, g), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(gradient_match_distance(g, -g), torch.full((2,), 10.0))
    # scale-invariant; orthogonal rows contribute 1 each
    torch.testing.assert_close(gradient_match_distance(3 * g, g), torch.zeros(2), atol=1e-5, rtol=0)
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    assert float(gradient_match_distance(a, b)) == pytest.approx(1.0, abs=1e-5)


def test_feature_step_reduces_matching_loss():
    """Synthetic features are pulled towards features whose classifier gradient matches the
    real one; the class absent from the round keeps its features."""
    g = torch.Generator().manual_seed(3)
    C, d, m = 4, 6, 10
    w = torch.randn(C, d, generator=g) * 0.5
    means = torch.randn(C, d, generator=g) * 3
    present = torch.tensor([0, 1, 3])
    real = torch.stack(
        [
            classifier_gradient(means[c] + torch.randn(32, d, generator=g), torch.full((32,), c), w)
            for c in present.tolist()
        ]
    )
    feats = torch.randn(C, m, d, generator=g)
    start = matching_loss(feats, real, present, w)
    new = feats
    losses = []
    for _ in range(100):
        new, loss = feature_step(new, real, present, w, None, lr=0.1)
        losses.append(loss)
    end = matching_loss(new, real, present, w)
    assert float(losses[0]) == pytest.approx(float(start))
    assert float(end) < 0.3 * float(start)
    torch.testing.assert_close(new[2], feats[2])  # absent class: unchanged
    assert not torch.equal(new[0], feats[0])
    # nothing present: no change
    same, loss = feature_step(feats, real[:0], present[:0], w, None, lr=0.1)
    assert same is feats and float(loss) == 0.0


def test_retrain_separates_well_separated_features():
    g = torch.Generator().manual_seed(4)
    C, d, m = 3, 5, 40
    centres = torch.eye(C, d) * 4
    feats = (centres[:, None, :] + 0.3 * torch.randn(C, m, d, generator=g)).reshape(C * m, d)
    labels = torch.arange(C).repeat_interleave(m)
    w0, b0 = linear_init(C, d, g)
    assert w0.abs().max() <= 1 / math.sqrt(d) and b0.abs().max() <= 1 / math.sqrt(d)
    before = w0.clone()
    w, b = retrain_classifier(feats, labels, w0, b0, 20, 16, 0.1, g)
    acc = ((feats @ w.T + b).argmax(1) == labels).float().mean()
    assert float(acc) == 1.0
    assert torch.equal(w0, before)  # the init is not modified in place


def test_retrain_equals_torch_sgd():
    """Same numbers as nn.Linear + torch.optim.SGD over the documented batch orders."""
    g = torch.Generator().manual_seed(5)
    C, d, n, epochs, bs = 3, 4, 21, 4, 8
    feats, labels = torch.randn(n, d, generator=g), torch.randint(0, C, (n,), generator=g)
    w0, b0 = linear_init(C, d, g)
    w, b = retrain_classifier(
        feats, labels, w0, b0, epochs, bs, 0.05, torch.Generator().manual_seed(9)
    )
    lin = nn.Linear(d, C)
    with torch.no_grad():
        lin.weight.copy_(w0)
        lin.bias.copy_(b0)
    opt = torch.optim.SGD(lin.parameters(), lr=0.05)
    ref_gen = torch.Generator().manual_seed(9)
    for _ in range(epochs):
        order = torch.randperm(n, generator=ref_gen)
        for s in range(0, n, bs):  # last batch smaller (21 = 8 + 8 + 5)
            idx = order[s : s + bs]
            opt.zero_grad()
            F.cross_entropy(lin(feats[idx]), labels[idx]).backward()
            opt.step()
    torch.testing.assert_close(w, lin.weight.detach())
    torch.testing.assert_close(b, lin.bias.detach())


def test_class_batches():
    labels = torch.tensor([0, 2, 2, 0, 2, 0, 0, 2, 2])
    classes = torch.tensor([0, 2])
    pos, mask = class_batches(labels, classes, 3, 4, torch.Generator().manual_seed(0))
    assert pos.shape == mask.shape == (4, 2, 3)
    assert mask.all()  # both classes have >= 3 samples
    for r in range(4):
        for k, c in enumerate(classes.tolist()):
            p = pos[r, k][mask[r, k]]
            assert (labels[p] == c).all() and len(set(p.tolist())) == len(p)
    again = class_batches(labels, classes, 3, 4, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], pos)
    # a class with fewer samples than the batch: padded
    pos, mask = class_batches(
        torch.tensor([1, 1, 0]), torch.tensor([0, 1]), 64, 2, torch.Generator()
    )
    assert pos.shape == (2, 2, 2) and mask.sum(-1).tolist() == [[1, 2], [1, 2]]


def test_head_must_be_linear():
    body = nn.Linear(3, 4)
    ok = SplitModel(body, nn.Linear(4, 2, bias=False), 4, 2)
    assert linear_head_names(ok, 2) == ("head.weight", None)
    assert linear_head_names(SplitModel(body, nn.Linear(4, 2), 4, 2), 2) == (
        "head.weight",
        "head.bias",
    )
    deep = SplitModel(body, nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), 4, 2)
    with pytest.raises(FedshiftError, match="one nn.Linear"):
        linear_head_names(deep, 2)


def test_params_defaults_are_the_specs():
    cls = get_algorithm("creff")
    assert cls is CReFF and not issubclass(cls, Personalised) and cls.supports_batched
    hp = cls.parse_params({})
    assert (hp.num_features, hp.feature_iters, hp.retrain_epochs) == (100, 100, 300)
    assert (hp.feature_lr, hp.retrain_lr, hp.retrain_batch_size) == (0.01, 0.01, 64)
    assert (hp.num_real_batches, hp.real_batch_size, hp.weighting) == (10, 64, "samples")


# ---------------------------------------------------------------------- client statistics


def _setup(tmp_path, **over):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm={"name": "creff", "params": over.pop("params", SMALL)},
            model__head_bias=over.pop("head_bias", False),
            **over,
        )
    )
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    server = algo.init_server_state([algo.ops.init(0)])
    return algo, data, server


@pytest.mark.parametrize("head_bias", [False, True])
def test_upload_is_the_class_gradient_of_the_start_model(tmp_path, head_bias):
    """With one batch holding every sample of each class, the upload is the autograd gradient
    of the class's mean CE at (start body, server's re-trained weight); the trained
    parameters are not used."""
    params = {**SMALL, "num_real_batches": 1, "real_batch_size": 10_000}
    algo, data, server = _setup(tmp_path, params=params, head_bias=head_bias)
    server["retrained_weight"] = torch.randn_like(server["retrained_weight"])
    view = client_data(data, data.clients[0])
    task = algo.client_task(server, {}, view, RoundContext(1))
    garbage = [{k: torch.zeros_like(v) for k, v in task.params[0].items()}]
    stats = algo.upload(task, garbage, task.buffers, view)
    classes, grads = stats["creff_classes"], stats["creff_grads"]
    assert torch.equal(classes, torch.unique(view.y_train))
    p = {**task.params[0], "head.weight": server["retrained_weight"].clone().requires_grad_(True)}
    algo.ops.module.eval()
    for k, c in enumerate(classes.tolist()):
        sel = view.train_idx[view.y_train == c]
        logits = algo.ops.forward(p, task.buffers[0], data.inputs(sel))
        (ref,) = torch.autograd.grad(
            F.cross_entropy(logits, torch.full((len(sel),), c)), p["head.weight"]
        )
        torch.testing.assert_close(grads[k], ref, atol=1e-6, rtol=1e-5)
    again = algo.upload(task, task.params, task.buffers, view)
    assert torch.equal(again["creff_grads"], grads)


def test_aggregate_averages_gradients_per_owning_class(tmp_path, monkeypatch):
    """The real gradient of a class is the unweighted mean over the clients owning it; the GM
    is the FedAvg model with the re-trained weight as head."""
    algo, data, server = _setup(tmp_path)
    C, d = server["retrained_weight"].shape
    seen = {}

    def spy(features, real, classes, weight, bias, lr):
        seen["real"], seen["classes"] = real, classes
        return features, torch.zeros(())

    monkeypatch.setattr("fedshift.algorithms.creff.feature_step", spy)
    g1, g2 = torch.randn(2, C, d), torch.randn(1, C, d)
    results = [
        ClientResult(
            0,
            10,
            [server["params"]],
            [server["buffers"]],
            {"creff_classes": torch.tensor([0, 2]), "creff_grads": g1},
        ),
        ClientResult(
            1,
            30,
            [server["params"]],
            [server["buffers"]],
            {"creff_classes": torch.tensor([2]), "creff_grads": g2},
        ),
    ]
    new = algo.aggregate(server, iter(results), RoundContext(1))
    assert seen["classes"].tolist() == [0, 2]
    torch.testing.assert_close(seen["real"][0], g1[0])
    torch.testing.assert_close(seen["real"][1], (g1[1] + g2[0]) / 2)
    assert new["rng_key"].tolist()[1] == 2
    gm_params, _ = algo.global_model(new)
    assert torch.equal(gm_params["head.weight"], new["retrained_weight"])
    assert not torch.equal(new["retrained_weight"], new["params"]["head.weight"])
    for k in new["params"]:
        if k != "head.weight":
            assert torch.equal(gm_params[k], new["params"][k])


# ---------------------------------------------------------------------- end to end


def _run(cfg, executor):
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    return Simulator(algo, data, sim_config(cfg), executor).run()


def test_end_to_end_executors_agree_and_fedavg_models_unchanged(tmp_path):
    over = {"model__head_bias": False, "eval__personal": "active", "train__participation": 0.5}
    cfg = validate_config(
        tiny_config(tmp_path, algorithm={"name": "creff", "params": SMALL}, **over)
    )
    seq = _run(cfg, SequentialExecutor())
    # GM by hand: the FedAvg body with the re-trained head, on the test-only clients' samples
    data = build_scenario(cfg.scenario, cfg.seed)
    ops = make_algorithm(cfg, data, torch.device("cpu")).ops
    gm = {**seq.server["params"], "head.weight": seq.server["retrained_weight"]}
    hits = 0
    for t in data.test_clients:
        logits = ops.logits(gm, seq.server["buffers"], data.inputs, t.test_idx)
        hits += int((logits.argmax(-1) == t.y_test).sum())
    total = sum(t.num_test for t in data.test_clients)
    last = seq.history[-1]
    assert last["gm_acc"] == pytest.approx(100.0 * hits / total), last
    assert last["pm_v"] > 40, last  # the clients' (FedAvg) models learn: chance is 25 (4 classes)
    # the executors agree, in float64 (see F64_ATOL in fedshift/testing.py)
    ex = [SequentialExecutor(), *(BatchedExecutor(2, vectorize=v) for v in ("vmap", "loop"))]
    seq64, *bats = run_executors(cfg, ex)
    for bat in bats:
        for key in ("params", "buffers"):
            for k, v in seq64.server[key].items():
                assert_close64(bat.server[key][k], v, f"{key} {k}")
        for key in ("retrained_weight", "features"):
            assert_close64(bat.server[key], seq64.server[key], key)
    # CReFF's clients train exactly as FedAvg's (the same operations in the same order, so
    # bit for bit): same server model and PM, other GM
    fedavg = validate_config(tiny_config(tmp_path, algorithm={"name": "fedavg"}, **over))
    ref = _run(fedavg, SequentialExecutor())
    for k, v in ref.server["params"].items():
        assert torch.equal(seq.server["params"][k], v), k
    for h, r in zip(seq.history, ref.history, strict=True):
        assert h["pm_v"] == pytest.approx(r["pm_v"]) and h["pm_l"] == pytest.approx(r["pm_l"])
    assert not torch.equal(seq.server["retrained_weight"], seq.server["params"]["head.weight"])
