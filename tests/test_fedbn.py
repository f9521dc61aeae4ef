"""FedBN: BatchNorm layers stay with their clients, everything else is averaged."""

from __future__ import annotations

import pytest
import torch

from fedshift.algorithms.fedbn import batchnorm_names
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.batched import BatchedExecutor
from fedshift.engine.executors import SequentialExecutor
from fedshift.engine.simulator import Simulator
from fedshift.runner import make_algorithm, sim_config
from tests.conftest import tiny_config


def _config(tmp_path, name="fedbn", model="convbn_cnn", **train):
    raw = tiny_config(
        tmp_path,
        algorithm={"name": name},
        scenario={"dataset": "digits", "num_clients": 6, "label_shift": {"kind": "iid"}},
        model={"name": model},
        train={"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 3, **train},
    )
    return validate_config(raw)


def _run(cfg, executor=None):
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    return algo, Simulator(algo, data, sim_config(cfg), executor or SequentialExecutor()).run()


def test_batchnorm_names_are_found_by_type(tmp_path):
    algo, _ = _run(_config(tmp_path, rounds=1))
    names = algo.bn_names
    assert "body.1.weight" in names and "body.1.running_mean" in names
    assert "body.1.num_batches_tracked" in names and "body.0.weight" not in names
    assert not batchnorm_names(torch.nn.Linear(2, 2))


def test_each_client_keeps_its_own_batchnorm(tmp_path):
    algo, res = _run(_config(tmp_path, participation=0.5))
    bn = sorted(algo.bn_names)
    trained = sorted(res.clients)
    assert len(trained) >= 2
    a, b = res.clients[trained[0]], res.clients[trained[1]]
    # two clients end with different BN statistics and affine parameters of their own
    assert not torch.equal(
        a["bn_buffers"]["body.1.running_mean"], b["bn_buffers"]["body.1.running_mean"]
    )
    assert not torch.equal(a["bn_params"]["body.1.weight"], b["bn_params"]["body.1.weight"])
    # the server's BN entries are never averaged: still the initial ones
    assert torch.all(res.server["buffers"]["body.1.running_mean"] == 0)
    assert torch.all(res.server["params"]["body.1.weight"] == 1)
    # a client state holds BN entries only
    assert set(a["bn_params"]) | set(a["bn_buffers"]) <= set(bn)


def test_server_averages_everything_else(tmp_path):
    cfg = _config(tmp_path, rounds=1)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    seen = []
    orig = algo.aggregate

    def spy(server, results, ctx):
        results = list(results)
        seen.extend(results)
        return orig(server, iter(results), ctx)

    algo.aggregate = spy
    res = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    n = torch.tensor([float(r.num_samples) for r in seen])
    for k, v in res.server["params"].items():
        if k in algo.bn_names:
            continue
        avg = sum(w * r.params[0][k] for w, r in zip(n, seen, strict=True)) / n.sum()
        torch.testing.assert_close(v, avg)


def test_a_client_bn_changes_only_when_it_trains(tmp_path):
    cfg = _config(tmp_path, participation=0.5, rounds=3)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    starts = {}
    orig = algo.client_update

    def spy(server, client, task, result):
        if "bn_buffers" in client:  # it starts from exactly its own last BN state
            for k, v in client["bn_buffers"].items():
                assert torch.equal(task.buffers[0][k], v), k
            starts[result.cid] = True
        return orig(server, client, task, result)

    algo.client_update = spy
    Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    assert starts, "some client trained twice"


def test_without_batchnorm_fedbn_is_fedavg(tmp_path):
    _, bn = _run(_config(tmp_path, name="fedbn", model="lenet_small"))
    _, avg = _run(_config(tmp_path, name="fedavg", model="lenet_small"))
    for k, v in avg.server["params"].items():
        torch.testing.assert_close(bn.server["params"][k], v)
    assert bn.history[-1]["local_acc"] == pytest.approx(avg.history[-1]["local_acc"])


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_batched_matches_sequential(tmp_path, vectorize):
    cfg = _config(tmp_path, participation=0.5)
    _, seq = _run(cfg)
    _, bat = _run(cfg, BatchedExecutor(chunk_size=2, vectorize=vectorize))
    for k, v in seq.server["params"].items():
        torch.testing.assert_close(bat.server["params"][k], v, atol=5e-5, rtol=1e-4)
    for cid, st in seq.clients.items():
        for part in ("bn_params", "bn_buffers"):
            for k, v in st[part].items():
                torch.testing.assert_close(
                    bat.clients[cid][part][k].float(), v.float(), atol=5e-5, rtol=1e-4
                )
