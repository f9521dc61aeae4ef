"""FedGen: teacher weights, the diversity loss, the server's generator fit, round 1 equal to
FedAvg, and the two executors."""

from __future__ import annotations

import pytest
import torch

from fedshift.algorithms.base import RoundContext
from fedshift.algorithms.fedgen import diversity_loss, teacher_weights
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.batched import BatchedExecutor
from fedshift.engine.executors import SequentialExecutor
from fedshift.engine.simulator import Simulator
from fedshift.runner import make_algorithm, sim_config
from tests.conftest import tiny_config


def _config(tmp_path, name="fedgen", **train):
    raw = tiny_config(
        tmp_path,
        algorithm={"name": name, "params": {"gen_steps": 5} if name == "fedgen" else {}},
        scenario={"dataset": "digits", "num_clients": 6, "label_shift": {"kind": "iid"}},
        model={"name": "convbn_cnn"},
        train={"rounds": 2, "batch_size": 16, "lr": 0.05, "local_steps": 3, **train},
    )
    return validate_config(raw)


def _run(cfg, executor=None):
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    return algo, Simulator(algo, data, sim_config(cfg), executor or SequentialExecutor()).run()


def test_teacher_weights_by_hand():
    counts = torch.tensor([[3.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    w = teacher_weights(counts)
    assert w[:, 0].tolist() == [0.75, 0.25] and w[:, 2].tolist() == [0.5, 0.5]
    assert w[:, 1].tolist() == [0.0, 0.0]  # nobody holds label 1


def test_diversity_loss_by_hand():
    noise = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    out = torch.tensor([[0.0], [2.0]])
    # off-diagonal pairs: l1 distance 2, squared noise distance 1 -> mean over 4 pairs = 1
    assert float(diversity_loss(noise, out)) == pytest.approx(torch.exp(torch.tensor(-1.0)).item())
    same = diversity_loss(noise, torch.zeros(2, 1))
    assert float(same) == pytest.approx(1.0)  # collapsed outputs: the largest loss


def test_generator_fit_lowers_the_teachers_loss(tmp_path):
    cfg = _config(tmp_path)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    server = algo.init_server_state([algo.ops.init(0)])
    g = torch.Generator().manual_seed(0)
    last = algo.last_layer
    lat = algo.generator.out.out_features
    teachers = [
        (
            torch.ones(10),
            {f"{last}.weight": torch.randn(10, lat, generator=g), f"{last}.bias": torch.zeros(10)},
        )
        for _ in range(2)
    ]
    labels = torch.arange(10)

    def teacher_ce(gen):
        y = torch.arange(10).repeat(20)
        algo.generator.eval()
        z = torch.func.functional_call(algo.generator, gen, (y, torch.rand(200, 32, generator=g)))
        return sum(torch.nn.functional.cross_entropy(algo._last(t, z), y) for _, t in teachers)

    before = float(teacher_ce(server["gen"]))
    algo.hp = algo.hp.model_copy(update={"gen_steps": 60, "gen_lr": 1e-2})
    gen, adam = algo.train_generator(server, teachers, labels, RoundContext(1))
    after = float(teacher_ce(gen))
    assert after < 0.5 * before and adam["state"]


def test_round_one_equals_fedavg(tmp_path):
    _, gen = _run(_config(tmp_path, rounds=1))
    _, avg = _run(_config(tmp_path, "fedavg", rounds=1))
    for k, v in avg.server["params"].items():
        torch.testing.assert_close(gen.server["params"][k], v)


def test_second_round_distils(tmp_path):
    _, gen = _run(_config(tmp_path))
    _, avg = _run(_config(tmp_path, "fedavg"))
    assert gen.server["labels"].tolist() == list(range(10))
    diff = [
        k for k, v in avg.server["params"].items() if not torch.allclose(gen.server["params"][k], v)
    ]
    assert diff  # the generator's terms changed round 2


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_batched_matches_sequential(tmp_path, vectorize):
    cfg = _config(tmp_path, participation=0.5)
    _, seq = _run(cfg)
    _, bat = _run(cfg, BatchedExecutor(chunk_size=2, vectorize=vectorize))
    for k, v in seq.server["params"].items():
        torch.testing.assert_close(bat.server["params"][k], v, atol=5e-5, rtol=1e-4)
    for k, v in seq.server["gen"][0].items():
        torch.testing.assert_close(bat.server["gen"][0][k], v, atol=5e-5, rtol=1e-4)
