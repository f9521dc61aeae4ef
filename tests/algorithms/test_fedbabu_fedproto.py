"""FedBABU and FedProto: prototype math by hand, FedProto's loss, FedBABU's frozen head and
fine-tuning cache, executor equivalence and end-to-end runs with FedNH's PM metrics."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fedshift.algorithms.base import Batch
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.fedbabu import FT_LR, FedBABU
from fedshift.algorithms.fedproto import (
    FedProto,
    aggregate_prototypes,
    class_means,
    init_prototypes,
    nearest_prototype,
    prototype_mse,
)
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data, evaluate, fine_tune, sequential_tuner
from fedshift.engine.metrics import class_weighted_accuracy, per_class_counts, pm_weights
from fedshift.engine.simulator import Simulator
from fedshift.models.base import head_param_names
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from tests.conftest import assert_close64, run_both, tiny_config

CPU = torch.device("cpu")


def build(tmp_path, algorithm, **over):
    cfg = validate_config(tiny_config(tmp_path, algorithm=algorithm, **over))
    data = build_scenario(cfg.scenario, cfg.seed)
    return cfg, data, make_algorithm(cfg, data, CPU)


# ---------------------------------------------------------------------- FedProto math


def test_aggregate_prototypes_by_hand():
    old = torch.tensor([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    a = (torch.tensor([[1.0, 2.0], [3.0, 4.0], [7.0, 7.0]]), torch.tensor([2.0, 1.0, 0.0]))
    b = (torch.tensor([[3.0, 6.0], [9.0, 9.0], [8.0, 8.0]]), torch.tensor([10.0, 0.0, 0.0]))
    new = aggregate_prototypes(old, iter([a, b]))
    # class 0: unweighted mean over both owners (not 2:10 weighted); class 1: only a owns it;
    # class 2: nobody owns it, so the old value stays (the clients' rows there are ignored)
    torch.testing.assert_close(new, torch.tensor([[2.0, 4.0], [3.0, 4.0], [5.0, 5.0]]))
    torch.testing.assert_close(aggregate_prototypes(old, []), old)


def test_class_means_by_hand():
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    means, counts = class_means(feats, torch.tensor([0, 0, 2]), 3)
    torch.testing.assert_close(counts, torch.tensor([2.0, 0.0, 1.0]))
    torch.testing.assert_close(means, torch.tensor([[2.0, 1.0], [0.0, 0.0], [5.0, 5.0]]))


def test_nearest_prototype_by_hand():
    protos = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    feats = torch.tensor([[1.0, 1.0], [9.0, 1.0], [2.0, 7.0], [6.0, 1.0], [4.0, 6.0]])
    assert nearest_prototype(feats, protos).tolist() == [0, 1, 2, 1, 2]


def test_prototype_mse_is_mse_loss():
    f, t = torch.randn(5, 3), torch.randn(5, 3)
    torch.testing.assert_close(prototype_mse(f, t).mean(), torch.nn.MSELoss()(f, t))


def test_initial_prototypes_uniform_and_seeded():
    p = init_prototypes(4, 16, 0)
    assert p.shape == (4, 16) and p.dtype == torch.float32 and p.min() >= 0 and p.max() < 1
    # uniform on [0, 1), not a narrower or shifted range: 64 draws have mean 0.5 with std
    # 0.29 / 8 = 0.036 (0.35..0.65 is 4 std), and spread over the whole interval
    assert 0.35 < float(p.mean()) < 0.65 and p.min() < 0.1 and p.max() > 0.9, p
    assert len(torch.unique(p)) == 64  # no repeated rows or entries
    torch.testing.assert_close(p, init_prototypes(4, 16, 0))
    assert not torch.equal(p, init_prototypes(4, 16, 1))


def test_fedproto_loss_is_ce_when_features_equal_prototypes(tmp_path):
    _, data, algo = build(tmp_path, {"name": "fedproto", "params": {"lam": 0.5}})
    server = algo.init_server_state([algo.ops.init(0)])
    p, b = server["init_params"], server["init_buffers"]
    c = data.clients[0]
    pos = torch.stack([torch.nonzero(c.y_train == k)[0, 0] for k in range(4)])  # one per class
    x, y = data.inputs(c.train_idx[pos]), c.y_train[pos]
    feats, logits = algo.ops.forward(p, b, x, features=True)
    ce = F.cross_entropy(logits, y)
    protos = torch.zeros(4, feats.shape[1])
    protos[y] = feats.detach()
    batch = Batch(x=x, y=y, pos=pos)
    torch.testing.assert_close(algo.local_loss([p], [b], batch, {"protos": protos}), ce)
    # prototypes one unit off in every coordinate add lam * 1
    loss = algo.local_loss([p], [b], batch, {"protos": protos + 1.0})
    torch.testing.assert_close(loss, ce + 0.5)
    # padded rows do not count
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0])
    masked = algo.local_loss([p], [b], Batch(x=x, y=y, pos=pos, mask=mask), {"protos": protos})
    torch.testing.assert_close(masked, F.cross_entropy(logits[:2], y[:2]))


def test_fedproto_predict_is_one_hot_nearest_prototype(tmp_path):
    _, data, algo = build(tmp_path, {"name": "fedproto"})
    server = algo.init_server_state([algo.ops.init(0)])
    view = client_data(data, data.clients[0])
    idx = data.clients[0].test_idx
    feats = algo.features(server["init_params"], server["init_buffers"], view, idx)
    probs = algo.predict(server, {}, view, idx)
    assert probs.shape == (len(idx), 4)
    torch.testing.assert_close(probs.sum(1), torch.ones(len(idx)))
    assert torch.equal(probs.argmax(1), nearest_prototype(feats, server["protos"]))
    # test-only clients have no model: uniform probabilities
    test_probs = algo.predict(server, {}, replace(view, test_only=True), idx)
    torch.testing.assert_close(test_probs, torch.full((len(idx), 4), 0.25))
    assert algo.global_model(server) is None


def test_fedproto_training_keeps_models_apart(tmp_path):
    cfg, data, algo = build(tmp_path, {"name": "fedproto"}, train__rounds=2)
    sim = Simulator(algo, data, sim_config(cfg))
    init = sim.initial_state()
    state = sim.run()
    assert not torch.allclose(state.server["protos"], init.server["protos"])
    assert set(state.server) == {"protos", "init_params", "init_buffers"}  # no model average
    assert isinstance(algo, FedProto) and isinstance(algo, Personalised)
    k = next(iter(init.server["init_params"]))  # the first body weight
    w0, w1 = state.clients[0]["params"][k], state.clients[1]["params"][k]
    assert not torch.allclose(w0, w1) and not torch.allclose(w0, init.server["init_params"][k])


# ---------------------------------------------------------------------- FedBABU


def test_fedbabu_trains_body_only(tmp_path):
    cfg, data, algo = build(tmp_path, {"name": "fedbabu"}, train__rounds=2)
    sim = Simulator(algo, data, sim_config(cfg))
    init = sim.initial_state().server
    state = sim.run()
    assert isinstance(algo, FedBABU) and isinstance(algo, Personalised)
    heads = set(head_param_names(algo.ops.module))
    assert heads and set(algo.body_names) == set(init["params"]) - heads
    for k, v in init["params"].items():
        if k in heads:  # the server's and every client's head is the initial one, bit for bit
            assert torch.equal(state.server["params"][k], v), k
            for st in state.clients.values():
                assert torch.equal(st["params"][k], v), k
        else:
            assert not torch.allclose(state.server["params"][k], v), k
    assert algo.global_model(state.server)[0] is state.server["params"]


def tuned(algo, server, client, view):
    """The client's model after its fine-tuning task (trained by the engine's evaluation)."""
    return fine_tune(algo, server, [(client, view)], sequential_tuner(algo))[view.cid].params[0]


def test_fedbabu_fine_tuning_task(tmp_path):
    cfg, data, algo = build(tmp_path, {"name": "fedbabu"}, train__rounds=1)
    assert algo.hp.ft_lr == pytest.approx(0.01 * 0.99**200) == FT_LR
    state = Simulator(algo, data, sim_config(cfg)).run()
    server, client = state.server, state.clients[0]
    view = client_data(data, data.clients[0])
    task = algo.fine_tune_task(server, client, view)
    (phase,) = task.phases
    assert (phase.lr, phase.epochs, phase.batch_size, phase.drop_last) == (FT_LR, 5, 64, False)
    assert (phase.momentum, phase.weight_decay, phase.clip, phase.trainable) == (
        0.9,
        1e-5,
        10.0,
        None,  # the whole model, head included
    )
    assert task.params[0] is client["params"]  # from the client's last local model
    p = tuned(algo, server, client, view)
    for k in head_param_names(algo.ops.module):  # fine-tuning trains the head too
        assert not torch.allclose(p[k], client["params"][k]), k
    p2 = tuned(algo, server, client, view)  # deterministic batch order
    assert all(torch.equal(p2[k], p[k]) for k in p)
    # a client that never trained, and a test-only client, start from the global model
    view5 = client_data(data, data.clients[5])
    assert algo.fine_tune_task(server, {}, view5).params[0] is server["params"]
    test_view = replace(view, test_only=True)
    assert algo.fine_tune_task(server, client, test_view).params[0] is server["params"]
    # without fine-tuning the start model answers
    none = FedBABU(
        FedBABU.parse_params({"ft_epochs": 0}),
        algo.ops,
        algo.num_classes,
        seed=algo.seed,
        train=algo.train_defaults,
    )
    assert none.fine_tune_task(server, client, view) is None
    assert none.mixture(server, client, view)[0][1] is client["params"]


def test_fedbabu_pm_is_the_tuned_model(tmp_path):
    """The evaluation scores FedBABU's PM with the tuned models it trained once."""
    cfg, data, algo = build(tmp_path, {"name": "fedbabu"}, train__rounds=1)
    state = Simulator(algo, data, sim_config(cfg)).run()
    cids = list(range(len(data.clients)))
    out = evaluate(algo, state.server, state.clients, data, personal=cids)
    views = [client_data(data, c) for c in data.clients]
    models = fine_tune(
        algo,
        state.server,
        [(state.clients.get(v.cid, {}), v) for v in views],
        sequential_tuner(algo),
    )
    test = data.test_clients[0]
    pm = []
    for c in data.clients:
        r = models[c.cid]
        pred = algo.ops.logits(r.params[0], r.buffers[0], data.inputs, test.test_idx).argmax(1)
        correct, count = per_class_counts(pred, test.y_test, data.num_classes)
        pm.append(class_weighted_accuracy(correct, count, pm_weights(c.label_hist)[0]))
    assert out["pm_clients"] == len(cids)
    assert out["pm_v"] == pytest.approx(sum(pm) / len(pm))


def test_fedbabu_ft_from_global(tmp_path):
    cfg, data, algo = build(
        tmp_path, {"name": "fedbabu", "params": {"ft_from": "global"}}, train__rounds=1
    )
    state = Simulator(algo, data, sim_config(cfg)).run()
    assert state.clients[0] == {}  # no local model kept
    view = client_data(data, data.clients[0])
    assert (
        algo.fine_tune_task(state.server, state.clients[0], view).params[0]
        is (state.server["params"])
    )


# ---------------------------------------------------------------------- executors, end to end


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
@pytest.mark.parametrize("name", ["fedbabu", "fedproto"])
def test_executors_agree(tmp_path, name, vectorize):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm={"name": name},
            train__rounds=2,
            train__participation=0.5,
            train__local_epochs=2,
            scenario__label_shift={"kind": "quantity", "alpha": 0.5},
            eval__train_metrics=False,
        )
    )
    seq, bat = run_both(cfg, chunk_size=2, vectorize=vectorize)  # float64: see F64_ATOL
    if name == "fedbabu":
        for k, v in seq.server["params"].items():
            assert_close64(bat.server["params"][k], v, k)
    else:
        assert_close64(bat.server["protos"], seq.server["protos"], "protos")
    assert seq.clients.keys() == bat.clients.keys()
    for cid, st in seq.clients.items():
        for k, v in st.get("params", {}).items():
            assert_close64(bat.clients[cid]["params"][k], v, f"client {cid} {k}")


@pytest.mark.parametrize("name", ["fedbabu", "fedproto"])
def test_end_to_end_personal_metrics(tmp_path, name):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm={"name": name},
            train__rounds=2,
            train__participation=0.5,
            eval__personal="active",
        )
    )
    res = run_experiment(cfg)
    first, last = res.history
    assert last["pm_clients"] == 3
    for key in ("pm_v", "pm_l", "local_acc", "train_acc"):
        assert last[key] > 25, (key, last)  # above chance (4 classes)
    assert last["train_loss"] < first["train_loss"], res.history  # the clients' loss falls
    if name == "fedproto":
        assert "gm_acc" not in last
        # no model for test-only clients: uniform probabilities, arg-max class 0
        for t in res.data.test_clients:
            share = 100.0 * float((t.y_test == 0).float().mean())
            assert last[f"global_acc_c{t.concept}"] == pytest.approx(share)
    else:
        # the global model beats chance (4 classes), on the test-only clients too
        assert last["gm_acc"] > 25 and last["global_acc"] > 25, last
