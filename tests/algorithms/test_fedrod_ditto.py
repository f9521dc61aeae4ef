"""FedRoD and Ditto: hand-computed losses and updates, stage behaviour, GM equal to FedAvg's,
sequential vs batched executors, and end-to-end runs with FedNH's personalised metrics."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedshift.algorithms.base import ClientData, LocalTask, ModelOps, RoundContext
from fedshift.algorithms.ditto import Ditto
from fedshift.algorithms.fedrod import (
    HyperPHead,
    balanced_softmax_loss,
    hyper_phead,
    label_distribution,
    personal_logits,
)
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from tests.conftest import (
    RUN,
    assert_history_same,
    assert_tree_close64,
    run_executors,
    tiny_config,
)


# ---------------------------------------------------------------------- FedRoD math
def test_label_distribution_absent_classes():
    pi = label_distribution(torch.tensor([0, 0, 1, 0]), 3)
    assert pi.tolist() == pytest.approx([0.75, 0.25, 1e-12], rel=1e-6)
    assert float(pi.sum()) == pytest.approx(1.0)


def test_balanced_softmax_uniform_pi_is_plain_ce():
    logits = torch.tensor([[1.0, -0.5, 2.0], [0.3, 0.2, 0.1]])
    y = torch.tensor([2, 0])
    pi = torch.full((3,), 1 / 3)
    torch.testing.assert_close(
        balanced_softmax_loss(logits, y, pi), F.cross_entropy(logits, y, reduction="none")
    )


def test_balanced_softmax_shifts_logits_by_log_pi():
    # logits [1, 2, 3], pi [1/2, 1/4, 1/4], label 2:
    # shifted = [1 + ln 1/2, 2 + ln 1/4, 3 + ln 1/4]; loss = logsumexp(shifted) - shifted[2]
    loss = balanced_softmax_loss(
        torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([2]), torch.tensor([0.5, 0.25, 0.25])
    )
    expected = math.log(0.5 * math.e + 0.25 * math.e**2 + 0.25 * math.e**3) - (3 + math.log(0.25))
    assert float(loss[0]) == pytest.approx(expected, rel=1e-6)
    # equal logits: the loss is -log pi_y (the prior alone explains the label)
    common = balanced_softmax_loss(
        torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([0]), torch.tensor([0.5, 0.25, 0.25])
    )
    assert float(common[0]) == pytest.approx(-math.log(0.5), rel=1e-6)


def test_hypernetwork_phead_and_personal_logits():
    torch.manual_seed(0)
    net = HyperPHead(num_classes=3, feature_dim=4)
    pi = torch.tensor([0.2, 0.3, 0.5])
    P = net(pi)
    assert P.shape == (4, 3)
    l1, l2 = net.linear1, net.linear2
    manual = (l2.weight @ torch.relu(l1.weight @ pi + l1.bias) + l2.bias).view(4, 3)
    torch.testing.assert_close(P, manual)
    torch.testing.assert_close(hyper_phead(pi, l1.weight, l1.bias, l2.weight, l2.bias, 4), manual)
    feats, lg = torch.randn(5, 4), torch.randn(5, 3)
    torch.testing.assert_close(personal_logits(feats, lg, P), lg + feats @ P)


# ---------------------------------------------------------------------- Ditto math
class _Scalar(nn.Module):
    """Logits [x·v, 0] of a one-parameter model."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.tensor(0.0))

    def forward(self, x, return_features=False):
        logits = torch.stack([x[:, 0] * self.v, torch.zeros_like(x[:, 0])], dim=1)
        return (x, logits) if return_features else logits


def test_ditto_personal_step_hand_computed():
    """One step per stage on one sample (x=1.5, y=0): stage 1 updates w with the run's SGD
    (momentum 0.9 -> first step = gradient; weight decay 0.1); stage 2 updates v with plain
    SGD v <- v - lr (dCE/dv + lam (v - w_k)) against the *updated* w_k."""
    lr, lam, wd, x = 0.1, 0.75, 0.1, 1.5
    w0, v0 = 0.2, 0.5
    algo = Ditto(Ditto.parse_params({"lam": lam}), ModelOps(_Scalar, torch.device("cpu")), 2, **RUN)
    server = algo.init_server_state([({"v": torch.tensor(v0)}, {}), ({"v": torch.tensor(9.0)}, {})])
    server["params"] = {"v": torch.tensor(w0)}  # the global model differs from v's init
    xs = torch.tensor([[x]])
    data = ClientData(0, torch.tensor([0]), torch.tensor([0]), lambda idx: xs[idx])
    task = algo.client_task(server, {}, data, RoundContext(1))
    res = SequentialExecutor().train_one(
        algo,
        task,
        data,
        RoundWork.of(lr=lr, momentum=0.9, weight_decay=wd, batch_size=1, drop_last=False),
    )

    def dce(p):  # d/dp CE([x p, 0], 0) = (sigmoid(x p) - 1) x
        return (1 / (1 + math.exp(-x * p)) - 1) * x

    w1 = w0 - lr * (dce(w0) + wd * w0)
    v1 = v0 - lr * (dce(v0) + lam * (v0 - w1))
    assert float(res.params[0]["v"]) == pytest.approx(w1, rel=1e-6)
    assert float(res.params[1]["v"]) == pytest.approx(v1, rel=1e-6)
    new = algo.client_update(server, {}, task, res)
    assert float(new["params"]["v"]) == pytest.approx(v1, rel=1e-6)
    # the personal model answers for the client; the global one before it trains
    assert algo.mixture(server, new, data)[0][1] is new["params"]
    assert algo.mixture(server, {}, data)[0][1] is server["params"]


# ---------------------------------------------------------------------- FedRoD stages
def _fedrod_setup(tmp_path, phead):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm={"name": "fedrod", "params": {"phead": phead}},
            scenario__label_shift={"kind": "dirichlet", "alpha": 0.3},
        )
    )
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    init = [algo.ops.init(0)]
    server = algo.init_server_state(init)
    view = client_data(data, data.clients[0])
    return algo, server, view


@pytest.mark.parametrize("phead", ["hyper", "linear"])
def test_fedrod_stages_train_their_own_parameters(tmp_path, phead):
    algo, server, view = _fedrod_setup(tmp_path, phead)
    task = algo.client_task(server, {}, view, RoundContext(1))
    start = {k: v.clone() for k, v in task.params[0].items()}
    pnames = set(algo.phead_names)
    assert pnames and all(k.startswith("phead.") for k in pnames)
    work = RoundWork.of(lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=32, drop_last=True)

    def run(phases):
        t = LocalTask(task.params, task.buffers, task.extras, phases=phases)
        return SequentialExecutor().train_one(algo, t, view, work).params[0]

    p2 = run(task.phases[1:])  # stage 2 only
    for k, v in start.items():
        changed = not torch.equal(p2[k], v)
        assert changed == (k in pnames), k
    p1 = run(task.phases[:1])  # stage 1 only: the p-head is untouched
    for k, v in start.items():
        changed = not torch.equal(p1[k], v)
        assert changed == (k not in pnames), k
    # stage 2 is plain SGD whatever the run's momentum / weight decay
    assert task.phases[1].momentum == 0.0 and task.phases[1].weight_decay == 0.0


@pytest.mark.parametrize("phead", ["hyper", "linear"])
def test_fedrod_sharing_and_global_model(tmp_path, phead):
    algo, server, view = _fedrod_setup(tmp_path, phead)
    shared = set(server["params"])
    assert ("phead.weight" in shared) is False
    assert any(k.startswith("phead.") for k in shared) == (phead == "hyper")
    # the GM's plain forward gives out_g, whatever the p-head
    gp, gb = algo.global_model(server)
    x = view.inputs(view.train_idx[:7])
    feats, out_g = algo.ops.forward(gp, gb, x, features=True)
    torch.testing.assert_close(algo.ops.forward(gp, gb, x), out_g)
    # a trained client's PM adds its p-head; a test-only client gets out_g
    task = algo.client_task(server, {}, view, RoundContext(1))
    res = SequentialExecutor().train_one(
        algo,
        task,
        view,
        RoundWork.of(lr=0.05, momentum=0.0, weight_decay=0.0, batch_size=32, drop_last=True),
    )
    client = algo.client_update(server, {}, task, res)
    if phead == "linear":
        assert set(client["phead"]) == {"phead.weight"}
        # the private head starts from a copy of the generic head's init
        torch.testing.assert_close(server["phead_init"]["phead.weight"], gp["head.weight"])
    idx = view.train_idx[:7]
    probs = algo.predict(server, client, view, idx)
    p = res.params[0]
    f, g = algo.ops.forward(p, res.buffers[0], x, features=True)
    if phead == "linear":
        P = p["phead.weight"].t()
    else:  # the model's hypernetwork with the client's trained weights, on its pi
        sub = {k[len("phead.") :]: v for k, v in p.items() if k.startswith("phead.")}
        P = functional_call(algo.ops.module.phead, sub, (task.extras["pi"],))
    torch.testing.assert_close(probs, torch.softmax(g + f @ P, dim=-1))
    torch.testing.assert_close(
        algo.predict(server, {}, replace(view, test_only=True), idx), torch.softmax(out_g, dim=-1)
    )


# ---------------------------------------------------------------------- Ditto GM = FedAvg
def test_ditto_global_model_equals_fedavg(tmp_path):
    over = dict(
        train__rounds=3,
        train__participation=0.5,
        train__local_epochs=2,
        scenario__label_shift={"kind": "dirichlet", "alpha": 0.5},
    )
    states = {}
    for name in ("fedavg", "ditto"):
        cfg = validate_config(tiny_config(tmp_path, algorithm={"name": name}, **over))
        data = build_scenario(cfg.scenario, cfg.seed)
        algo = make_algorithm(cfg, data, torch.device("cpu"))
        states[name] = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    fa, di = states["fedavg"].server, states["ditto"].server
    assert set(fa["params"]) == set(di["params"])
    for k in fa["params"]:
        assert torch.equal(fa["params"][k], di["params"][k]), k
    for a, b in zip(states["fedavg"].history, states["ditto"].history, strict=True):
        assert a["global_acc"] == b["global_acc"]
    # the personal models moved away from the global one
    some = next(iter(states["ditto"].clients.values()))
    assert not torch.equal(some["params"]["head.weight"], di["params"]["head.weight"])


# ---------------------------------------------------------------------- executors
@pytest.fixture(params=["vmap", "loop"])
def vectorize(request):
    return request.param


def _run_both(cfg, vectorize):
    """Both executors in float64 (see F64_ATOL in fedshift/testing.py), and the clients' sizes."""
    data = build_scenario(cfg.scenario, cfg.seed)
    out = run_executors(
        cfg, (SequentialExecutor(), BatchedExecutor(chunk_size=2, vectorize=vectorize)), data
    )
    return out, [c.num_train for c in data.clients]


def _assert_same(seq, bat):
    assert_tree_close64(seq.server, bat.server, "server")
    assert set(seq.clients) == set(bat.clients)
    for cid in seq.clients:
        assert_tree_close64(seq.clients[cid], bat.clients[cid], f"client{cid}")
    assert_history_same(
        seq, bat, ("global_acc", "local_acc", "train_acc", "pm_v", "pm_l", "gm_acc")
    )


UNEQUAL = dict(
    train__rounds=3,
    train__participation=0.5,
    train__local_epochs=2,
    train__batch_size=32,
    train__grad_clip=5.0,
    scenario__num_clients=10,
    scenario__label_shift={"kind": "dirichlet", "alpha": 0.3},
    eval__personal="all",
)


@pytest.mark.parametrize("phead", ["hyper", "linear"])
def test_fedrod_batched_matches_sequential(tmp_path, phead, vectorize):
    """Partial participation, 2 local epochs (+ 1 p-head epoch), unequal client sizes (some
    below the batch size: padded batches, unequal step counts), several chunks."""
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm={"name": "fedrod", "params": {"phead": phead, "phead_epochs": 1}},
            **UNEQUAL,
        )
    )
    (seq, bat), sizes = _run_both(cfg, vectorize)
    assert min(sizes) < 32 < max(sizes) and len(set(sizes)) > 3
    assert 0 < len(seq.clients) < 10  # not every client trained in 3 rounds at 50%
    _assert_same(seq, bat)


def test_ditto_batched_matches_sequential(tmp_path, vectorize):
    cfg = validate_config(
        tiny_config(
            tmp_path, algorithm={"name": "ditto", "params": {"personal_epochs": 1}}, **UNEQUAL
        )
    )
    (seq, bat), sizes = _run_both(cfg, vectorize)
    assert min(sizes) < 32 < max(sizes)
    _assert_same(seq, bat)


# ---------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "ditto"},
        {"name": "fedrod"},
        {"name": "fedrod", "params": {"phead": "linear", "pm_model": "global"}},
    ],
    ids=["ditto", "fedrod-hyper", "fedrod-linear-global"],
)
def test_end_to_end_personal_metrics(tmp_path, algorithm):
    raw = tiny_config(
        tmp_path,
        algorithm=algorithm,
        train__participation=0.5,
        eval__personal="active",
        scenario__label_shift={"kind": "dirichlet", "alpha": 0.5},
    )
    res = run_experiment(validate_config(raw))
    last = res.history[-1]
    # every model learns: well above chance (25%, 4 classes); PM(V) weights each client's seen
    # classes uniformly (its rare classes as much as its common ones), so only above chance
    for key in ("pm_l", "gm_acc", "global_acc", "local_acc"):
        assert last[key] > 40, (key, last)
    assert last["pm_v"] > 25, last
    assert last["pm_clients"] == 3


@pytest.mark.parametrize(
    "algorithm",
    [{"name": "ditto"}, {"name": "fedrod", "params": {"phead": "linear"}}],
    ids=["ditto", "fedrod-linear"],
)
def test_resume_keeps_personal_state(tmp_path, algorithm):
    """Personal models / private heads live in the client state: a run stopped after 1 round
    and resumed ends like the uninterrupted one."""
    raw = tiny_config(tmp_path, algorithm=algorithm, train__participation=0.5, eval__personal="all")
    full = run_experiment(validate_config({**raw, "name": "full"}))
    run_experiment(validate_config({**raw, "name": "part", "train": {**raw["train"], "rounds": 1}}))
    resumed = run_experiment(
        validate_config({**raw, "name": "part"}), run_dir=tmp_path / "runs" / "part", resume=True
    )
    for a, b in zip(full.history, resumed.history, strict=True):
        for key in ("global_acc", "local_acc", "train_loss", "pm_v", "gm_acc"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), key
