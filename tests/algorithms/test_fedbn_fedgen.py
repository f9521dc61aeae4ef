"""FedBN and FedGen (DFL's baselines): local BatchNorm state, the FedGen math against hand
values, the server's generator fit, round 1 equal to FedAvg, and the two executors."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import ClientData, RoundContext
from fedshift.algorithms.fedbn import batchnorm_names
from fedshift.algorithms.fedgen import (
    adam_step,
    decayed,
    diversity_loss,
    teacher_loss,
    teacher_weights,
)
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.models.base import BatchNorm2d
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from tests.conftest import as_float64, assert_close64, float64, tiny_config

# float32 kernels of a per-client loop and a vmapped batch differ in summation order only


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread avoids thread hand-offs that dominate on a busy
    machine (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _config(tmp_path, name, model="convbn_cnn", params=None, **train):
    raw = tiny_config(
        tmp_path,
        algorithm={"name": name, "params": params or {}},
        scenario={"dataset": "digits", "num_clients": 6, "label_shift": {"kind": "pathological"}},
        model={"name": model},
        train={"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 3, **train},
    )
    return validate_config(raw)


def _setup(cfg, cast=None):
    data = build_scenario(cfg.scenario, cfg.seed)
    data = data if cast is None else cast(data)
    return data, make_algorithm(cfg, data, torch.device("cpu"))


def _run(cfg, executor=None, spy=None, cast=None):
    data, algo = _setup(cfg, cast)
    if spy:
        spy(algo)
    return algo, Simulator(algo, data, sim_config(cfg), executor or SequentialExecutor()).run()


def _assert_params_close(a: dict, b: dict, exact: bool = False) -> None:
    """Same keys and tensors bit for bit (``exact``) or to the float64 executor tolerance (see
    F64_ATOL in fedshift/testing.py)."""
    assert a.keys() == b.keys()
    for k, v in a.items():
        if exact:
            assert torch.equal(b[k], v), k
        else:
            assert_close64(b[k], v, k)


# ---------------------------------------------------------------------- FedBN
def test_batchnorm_names_are_found_by_type():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), BatchNorm2d(2), nn.Flatten(), nn.BatchNorm1d(8))
    names = batchnorm_names(net)
    assert names == {
        f"{i}.{n}"
        for i in (1, 3)
        for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }
    assert not batchnorm_names(nn.Linear(2, 2))


def test_fedbn_clients_keep_their_own_batchnorm(tmp_path):
    cfg = _config(tmp_path, "fedbn", participation=0.5, rounds=3)
    events, rounds = [], []  # (cid, "start" | "end", BN entries) in the order they happen

    def spy(algo):
        task_fn, update_fn, agg_fn = algo.client_task, algo.client_update, algo.aggregate

        def bn(params, buffers):
            return {k: v for d in (params, buffers) for k, v in d.items() if k in algo.bn_names}

        def client_task(server, client, data, ctx):
            task = task_fn(server, client, data, ctx)
            events.append((data.cid, "start", bn(task.params[0], task.buffers[0])))
            return task

        def client_update(server, client, task, result):
            new = update_fn(server, client, task, result)
            events.append((result.cid, "end", bn(new["bn_params"], new["bn_buffers"])))
            return new

        def aggregate(server, results, ctx):
            rounds.append(list(results))
            return agg_fn(server, iter(rounds[-1]), ctx)

        algo.client_task, algo.client_update, algo.aggregate = client_task, client_update, aggregate

    algo, res = _run(cfg, spy=spy)
    bn = algo.bn_names
    initial = {k: v for d in (res.server["params"], res.server["buffers"]) for k, v in d.items()}
    # a client starts every round from its own last BN state (the initial one before it first
    # trains), so its BN state changes only when it trains
    own: dict[int, dict] = {}
    for cid, kind, entries in events:
        if kind == "start":
            ref = own.get(cid, {k: initial[k] for k in bn})
            assert entries.keys() == bn and all(torch.equal(entries[k], ref[k]) for k in bn)
        else:
            own[cid] = entries
    assert sum(kind == "start" for _, kind, _ in events) == 9  # 3 of 6 clients, 3 rounds
    assert all(
        torch.equal(res.clients[c]["bn_buffers"][k], v[k])
        for c, v in own.items()
        for k in res.clients[c]["bn_buffers"]
    )
    # two clients end with different BN statistics and affine parameters of their own
    a, b = (res.clients[c] for c in sorted(res.clients)[:2])
    assert set(a["bn_params"]) | set(a["bn_buffers"]) == bn
    for part, key in (("bn_buffers", "body.1.running_mean"), ("bn_params", "body.1.weight")):
        assert not torch.equal(a[part][key], b[part][key])
    # the server never averages BN: its BN entries stay the initial ones
    assert torch.all(res.server["buffers"]["body.1.running_mean"] == 0)
    assert torch.all(res.server["params"]["body.1.weight"] == 1)
    # ... and averages everything else, uniformly by default (the FedBN code)
    last = rounds[-1]
    for k, v in res.server["params"].items():
        if k not in bn:
            torch.testing.assert_close(v, sum(r.params[0][k] for r in last) / len(last))


def test_fedbn_answers_with_the_clients_own_model(tmp_path):
    cfg = _config(tmp_path, "fedbn", participation=0.5, rounds=1)
    data, algo = _setup(cfg)
    res = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    cid, state = next(iter(res.clients.items()))
    empty = torch.zeros(0, dtype=torch.long)
    view = ClientData(cid=cid, train_idx=empty, y_train=empty, inputs=lambda i: i)
    ((_, p, b),) = algo.mixture(res.server, state, view)
    assert torch.equal(b["body.1.running_var"], state["bn_buffers"]["body.1.running_var"])
    assert torch.equal(p["body.1.weight"], state["bn_params"]["body.1.weight"])
    # a client that never trained, a test-only client and the global model: the initial BN
    answers = [
        algo.mixture(res.server, {}, view)[0][1:],
        algo.mixture(res.server, state, replace(view, test_only=True))[0][1:],
        algo.global_model(res.server),
    ]
    for p, b in answers:
        assert torch.all(b["body.1.running_var"] == 1) and torch.all(p["body.1.bias"] == 0)
        assert torch.equal(p["body.0.weight"], res.server["params"]["body.0.weight"])


def test_fedbn_without_batchnorm_is_fedavg(tmp_path):
    uniform = {"weighting": "uniform"}
    _, bn = _run(_config(tmp_path, "fedbn", model="lenet_small"))
    _, avg = _run(_config(tmp_path, "fedavg", model="lenet_small", params=uniform))
    _assert_params_close(avg.server["params"], bn.server["params"], exact=True)
    assert bn.history[-1]["local_acc"] == pytest.approx(avg.history[-1]["local_acc"])


# ---------------------------------------------------------------------- FedGen math
def test_teacher_weights_by_hand():
    counts = torch.tensor([[3.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    w = teacher_weights(counts)
    assert w[:, 0].tolist() == [0.75, 0.25] and w[:, 2].tolist() == [0.5, 0.5]
    assert w[:, 1].tolist() == [0.0, 0.0]  # nobody holds label 1
    # the code's counts start at 1: a label a client lacks still weighs a little
    assert teacher_weights(counts + 1)[:, 1].tolist() == [0.5, 0.5]


def test_teacher_loss_by_hand():
    logits = torch.zeros(2, 2, 3)  # two teachers, two samples, uniform predictions
    logits[1, 0, 2] = math.log(4.0)  # teacher 1 gives sample 0 (label 2) p = 4/6
    y = torch.tensor([2, 0])
    w = torch.tensor([[0.25, 0.0, 0.5], [0.75, 1.0, 0.5]])
    ce0 = [math.log(3.0), math.log(3.0)]
    ce1 = [-math.log(4 / 6), math.log(3.0)]
    expected = (0.5 * ce0[0] + 0.25 * ce0[1]) / 2 + (0.5 * ce1[0] + 0.75 * ce1[1]) / 2
    assert float(teacher_loss(logits, y, w)) == pytest.approx(expected, rel=1e-6)


def test_diversity_loss_by_hand():
    noise = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    out = torch.tensor([[0.0], [2.0]])
    # 2 of 4 ordered pairs differ: l1 distance 2 x mean squared noise distance 1 -> mean 1
    assert float(diversity_loss(noise, out)) == pytest.approx(math.exp(-1.0))
    assert float(diversity_loss(noise, torch.zeros(2, 1))) == pytest.approx(1.0)  # collapsed


def test_regulariser_weights_decay_per_round_as_the_code():
    assert decayed(10.0, 0.98, 0) == 10.0 and decayed(10.0, 0.98, 2) == pytest.approx(9.604)
    assert decayed(1e-3, 0.5, 10) == 1e-4  # the code's floor
    assert decayed(0.0, 0.98, 3) == 0.0  # switched off stays off


def test_adam_step_is_torch_adam():
    g = torch.Generator().manual_seed(0)
    p0 = {"a": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)}
    ref = {k: v.clone().requires_grad_() for k, v in p0.items()}
    opt = torch.optim.Adam(ref.values(), lr=0.1, weight_decay=0.01)
    ours, state = {k: v.clone() for k, v in p0.items()}, {}
    for _ in range(3):
        grads = {k: torch.randn(v.shape, generator=g) for k, v in p0.items()}
        for k, v in ref.items():
            v.grad = grads[k].clone()
        opt.step()
        state = adam_step(ours, grads, state, 0.1, 0.01)
    for k, v in ref.items():
        torch.testing.assert_close(ours[k], v.detach())
    assert int(state["step"]) == 3


# ---------------------------------------------------------------------- FedGen runs
def test_generator_fit_lowers_the_teachers_loss(tmp_path):
    _, algo = _setup(_config(tmp_path, "fedgen"))
    server = algo.init_server_state([algo.ops.init(0)])
    g = torch.Generator().manual_seed(0)
    lat = algo.generator.out.out_features
    teachers = [
        (torch.ones(10), {"weight": torch.randn(10, lat, generator=g), "bias": torch.zeros(10)})
        for _ in range(2)
    ]
    counts, held = torch.ones(2, 10), torch.ones(10, dtype=torch.bool)
    y, noise = torch.arange(10).repeat(20), torch.rand(200, 32, generator=g)
    w = teacher_weights(counts)

    def loss_of(state):
        algo.generator.eval()
        z = torch.func.functional_call(
            algo.generator, (state["gen_params"], state["gen_buffers"]), (y, noise)
        )
        logits = torch.stack([F.linear(z, t["weight"], t["bias"]) for _, t in teachers])
        return float(teacher_loss(logits, y, w))

    before, state, losses = loss_of(server), server, []
    for rnd in range(1, 4):  # three rounds of the defaults: 50 Adam steps each at lr 3e-4
        state = {**state, **algo.train_generator(state, counts, held, teachers, RoundContext(rnd))}
        losses.append(loss_of(state))
    assert losses[0] < before and losses[1] < losses[0] and losses[2] < losses[1]
    assert int(state["gen_adam"]["step"]) == 150
    assert int(state["gen_buffers"]["bn.num_batches_tracked"]) == 150


def test_fedgen_round_one_is_fedavg_and_round_two_distils(tmp_path):
    _, gen1 = _run(_config(tmp_path, "fedgen", rounds=1))
    _, avg1 = _run(_config(tmp_path, "fedavg", rounds=1))
    _assert_params_close(avg1.server["params"], gen1.server["params"], exact=True)
    _assert_params_close(avg1.server["buffers"], gen1.server["buffers"], exact=True)
    assert gen1.server["labels"].all()  # every digit is held by some client

    tasks = []

    def spy(algo):
        fn = algo.client_task
        algo.client_task = lambda s, c, d, ctx: (
            tasks.append((ctx.round, fn(s, c, d, ctx))) or tasks[-1][1]
        )

    _, gen2 = _run(_config(tmp_path, "fedgen"), spy=spy)
    _, avg2 = _run(_config(tmp_path, "fedavg"))
    assert [t.phases[0].loss for r, t in tasks if r == 1] == ["local_loss"] * 6
    second = [t for r, t in tasks if r == 2]
    ex = second[0].extras
    assert ex["real_noise"].shape == (3, 16, 32) and ex["gen_y"].shape == (3, 32)
    # α_1 = 10 · 0.98 scaled by gen_batch_size / batch_size = 2; β_1 = 10 · 0.98
    torch.testing.assert_close(ex["coef"], torch.tensor([19.6, 9.8]))
    assert not torch.equal(ex["real_noise"], second[1].extras["real_noise"])  # per client
    assert ex["gen"]["params"] is second[1].extras["gen"]["params"]  # shared, passed once
    assert any(
        not torch.allclose(gen2.server["params"][k], v) for k, v in avg2.server["params"].items()
    )


# ---------------------------------------------------------------------- both executors
@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
@pytest.mark.parametrize("name", ["fedbn", "fedgen"])
def test_batched_matches_sequential(tmp_path, name, vectorize):
    cfg = _config(tmp_path, name, participation=0.5)
    with float64():
        _, seq = _run(cfg, cast=as_float64)
        _, bat = _run(cfg, BatchedExecutor(chunk_size=2, vectorize=vectorize), cast=as_float64)
    _assert_params_close(seq.server["params"], bat.server["params"])
    _assert_params_close(seq.server["buffers"], bat.server["buffers"])
    if name == "fedgen":
        _assert_params_close(seq.server["gen_params"], bat.server["gen_params"])
        return
    assert seq.clients.keys() == bat.clients.keys()
    for cid, st in seq.clients.items():
        _assert_params_close(st["bn_params"], bat.clients[cid]["bn_params"])
        _assert_params_close(st["bn_buffers"], bat.clients[cid]["bn_buffers"])


@pytest.mark.parametrize("name", ["fedbn", "fedgen"])
def test_resume_equals_uninterrupted(tmp_path, name):
    """The whole state (local BN; generator, its Adam moments, the label set) is checkpointed
    and every draw depends on the seed, round and client only."""
    raw = tiny_config(
        tmp_path,
        algorithm={"name": name},
        scenario={"dataset": "digits", "num_clients": 6, "label_shift": {"kind": "pathological"}},
        model={"name": "convbn_cnn"},
        train={"rounds": 3, "batch_size": 16, "lr": 0.05, "local_steps": 3, "participation": 0.5},
    )
    full = run_experiment(validate_config({**raw, "name": "full"}))
    run_experiment(validate_config({**raw, "name": "part", "train": {**raw["train"], "rounds": 2}}))
    resumed = run_experiment(
        validate_config({**raw, "name": "part"}), run_dir=tmp_path / "runs" / "part", resume=True
    )
    for a, b in zip(full.history, resumed.history, strict=True):
        for key in ("local_acc", "train_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), key
