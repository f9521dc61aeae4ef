"""The papers' and the authors' code's behaviour as options, seeded randomness, FedNH-table
fixes (FedBABU / Local PM over all clients, FedProto's received prototypes, FedNH defaults,
the no-norm ResNet), and never crashing: divergence and unwritable output folders."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from fedshift.algorithms.base import ClientResult, RoundContext
from fedshift.algorithms.cfl import should_split
from fedshift.algorithms.fednh import FedNH
from fedshift.algorithms.fedproto import nearest_prototype
from fedshift.algorithms.fedrc import FedRCFT
from fedshift.config import validate_config
from fedshift.core.errors import DivergedError
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data, fine_tune, sequential_tuner
from fedshift.engine.simulator import Simulator
from fedshift.models import build_model
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from fedshift.run.folder import RunDir
from tests.conftest import linear_algo, run_cli, tiny_config

CPU = torch.device("cpu")


def build(tmp_path, algorithm, **over):
    cfg = validate_config(tiny_config(tmp_path, algorithm=algorithm, **over))
    data = build_scenario(cfg.scenario, cfg.seed)
    return cfg, data, make_algorithm(cfg, data, CPU)


# ---------------------------------------------------------------------- the code's behaviour


def test_cfl_split_rule_code_uses_the_largest_coordinate_and_more_than_two_members():
    # 4 members, mean 0; every update has L2 norm 1 spread over 4 coordinates of 0.5
    e = torch.full((4,), 0.5)
    ups = torch.stack([e, -e, e, -e])
    assert should_split(ups, 0.4, 0.6, "paper")  # max L2 norm 1.0 > 0.6
    assert not should_split(ups, 0.4, 0.6, "code")  # largest |coordinate| 0.5 < 0.6
    assert should_split(ups, 0.4, 0.45, "code")
    # two members are enough for the paper's rule, not for the code's (> 2)
    assert should_split(ups[:2], 0.4, 0.45, "paper")
    assert not should_split(ups[:2], 0.4, 0.45, "code")
    assert should_split(ups[:3] - ups[:3].mean(0), 0.4, 0.45, "code")


def test_test_clients_carry_omega_between_evaluations_as_the_code():
    fresh, server, data, _ = linear_algo(test_omega="fresh")
    carried, _, _, _ = linear_algo(test_omega="carried")
    two_iters, _, _, _ = linear_algo(test_em_iters=2)
    once = fresh.adapt_test_client(server, data, {})
    # fresh: every evaluation starts from uniform ω again
    again = fresh.adapt_test_client(server, data, once)
    torch.testing.assert_close(again["omega"], once["omega"])
    # carried: the second evaluation continues the EM, = two iterations from uniform
    first = carried.adapt_test_client(server, data, {})
    torch.testing.assert_close(first["omega"], once["omega"])
    second = carried.adapt_test_client(server, data, first)
    torch.testing.assert_close(
        second["omega"], two_iters.adapt_test_client(server, data, {})["omega"]
    )
    assert not torch.allclose(second["omega"], first["omega"])


def test_test_prior_none_ignores_the_server_prior():
    with_prior, server, data, _ = linear_algo(test_prior="server")
    no_prior, _, _, _ = linear_algo(test_prior="none")
    plain = no_prior.adapt_test_client(server, data, {})["omega"]
    server["prior"] = torch.tensor([[0.9, 0.05, 0.05], [0.05, 0.05, 0.9]])
    torch.testing.assert_close(no_prior.adapt_test_client(server, data, {})["omega"], plain)
    assert not torch.allclose(with_prior.adapt_test_client(server, data, {})["omega"], plain)


def test_test_client_state_is_carried_by_the_engine(tmp_path):
    algorithm = {"name": "fedrc", "params": {"num_clusters": 2, "test_omega": "carried"}}
    cfg, data, algo = build(tmp_path, algorithm, train__rounds=2)
    state = Simulator(algo, data, sim_config(cfg)).run()
    cids = sorted(c.cid for c in data.test_clients)
    assert sorted(state.test_clients) == cids
    assert all(state.test_clients[c]["omega"].shape == (2,) for c in cids)


# ---------------------------------------------------------------------- seeds


def noisy_server(seed: int, rnd: int = 1):
    algo, server, data, _ = linear_algo(noise_std=5.0)
    algo.seed = seed
    task = algo.client_task(server, {}, data, RoundContext(rnd))
    up = algo.upload(task, task.params, task.buffers, data)
    r = ClientResult(cid=0, num_samples=4, params=task.params, buffers=task.buffers, upload=up)
    return algo.aggregate(server, [r], RoundContext(rnd))["label_stats"][0]


def test_privacy_noise_follows_the_run_seed_and_round():
    assert torch.equal(noisy_server(0), noisy_server(0))
    assert not torch.allclose(noisy_server(0), noisy_server(1))  # another seed
    assert not torch.allclose(noisy_server(0, rnd=1), noisy_server(0, rnd=2))  # another round


def test_fedrc_ft_order_follows_seed_and_round_and_lr_defaults_to_train(tmp_path):
    algorithm = {"name": "fedrc-ft", "params": {"num_clusters": 2}}
    cfg, data, algo = build(tmp_path, algorithm, train__lr=0.07, train__batch_size=16)
    assert isinstance(algo, FedRCFT) and algo.hp.ft_lr is None
    assert algo.train_defaults.lr == 0.07 and algo.train_defaults.batch_size == 16
    server = algo.init_server_state([algo.ops.init(k) for k in range(2)])
    view = client_data(data, data.clients[0])
    name = next(iter(server["models"][0]["params"]))

    def tuned(seed, rnd, alg=algo):
        alg.seed, server["round"] = seed, rnd
        return fine_tune(alg, server, [({}, view)], sequential_tuner(alg))[0].params[0][name]

    a, b = tuned(0, 1), tuned(0, 1)
    assert torch.equal(a, b)
    assert not torch.equal(a, tuned(1, 1)) and not torch.equal(a, tuned(0, 2))
    # the default fine-tuning lr is train.lr: one more step of ft_lr=0.07 given explicitly
    explicit = FedRCFT(
        FedRCFT.Params(num_clusters=2, ft_lr=0.07),
        algo.ops,
        algo.num_classes,
        seed=algo.seed,
        train=algo.train_defaults,
    )
    torch.testing.assert_close(tuned(0, 1, explicit), a)
    assert algo.fine_tune_task(server, {}, view).phases[0].lr == 0.07


def test_fedbabu_fine_tuning_order_follows_the_run_seed(tmp_path):
    cfg, data, algo = build(tmp_path, {"name": "fedbabu", "params": {"ft_epochs": 1}})
    p, b = algo.ops.init(0)
    server = algo.init_server_state([(p, b)])
    view = client_data(data, data.clients[0])
    name = next(iter(p))

    def tuned(seed):
        algo.seed = seed
        return fine_tune(algo, server, [({}, view)], sequential_tuner(algo))[0].params[0][name]

    assert torch.equal(tuned(0), tuned(0)) and not torch.equal(tuned(0), tuned(1))


# ---------------------------------------------------------------------- FedNH's table


def test_fedbabu_pm_averages_all_clients_after_fine_tuning(tmp_path):
    """Participation 1/3: after one round, 2 of 6 clients trained; PM(all) scores all 6 (the
    others fine-tune the global model), PM(active) the round's 2."""
    over = {
        "train__rounds": 1,
        "train__participation": 0.34,
        "algorithm": {"name": "fedbabu", "params": {"ft_epochs": 1}},
    }
    for personal, expected in (("all", 6), ("active", 2)):
        cfg = validate_config(tiny_config(tmp_path, eval__personal=personal, **over))
        res = run_experiment(cfg, overwrite=True)
        assert res.history[-1]["pm_clients"] == expected
        assert res.history[-1]["pm_v"] > 25, res.history[-1]  # above chance (4 classes)


def test_fedproto_pm_uses_the_prototypes_the_client_received(tmp_path):
    cfg, data, algo = build(tmp_path, {"name": "fedproto"}, train__rounds=1)
    sim = Simulator(algo, data, sim_config(cfg))
    start = sim.initial_state()
    received = start.server["protos"]
    state = sim.run(start)
    client = state.clients[0]
    assert client["protos"] is received
    assert not torch.allclose(state.server["protos"], received)  # aggregated from the uploads
    view = client_data(data, data.clients[0])
    idx = data.clients[0].test_idx
    feats = algo.features(client["params"], client["buffers"], view, idx)
    probs = algo.predict(state.server, client, view, idx)
    assert torch.equal(probs.argmax(1), nearest_prototype(feats, received))


def test_fednh_defaults_uniform_average_and_fixed_scale_30(tmp_path):
    hp = FedNH.parse_params({})
    assert hp.weighting == "uniform" and hp.scale_init is None
    model = build_model("mlp", 4, (16,), width=8, head_bias=False)
    learned = FedNH.adapt_model(model, hp)
    assert isinstance(learned.head.scale, nn.Parameter)
    assert float(learned.head.scale.detach()) == 1.0
    fixed = FedNH.adapt_model(
        build_model("mlp", 4, (16,), width=8), FedNH.parse_params({"learn_scale": False})
    )
    assert float(fixed.head.scale) == 30.0 and "head.scale" in dict(fixed.named_buffers())


def test_resnet_without_block_norm_keeps_stem_and_shortcut_norms():
    m = build_model("resnet18", 10, (3, 16, 16), norm="group", width=8, block_norm=False)
    full = build_model("resnet18", 10, (3, 16, 16), norm="group", width=8)
    norms = [n for n, x in m.named_modules() if isinstance(x, nn.GroupNorm)]
    assert "body.bn1" in norms and "body.layer2.0.downsample.1" in norms
    assert not [n for n in norms if n.startswith("body.layer") and ".bn" in n]  # no block norms
    n_full = sum(isinstance(x, nn.GroupNorm) for x in full.modules())
    assert len(norms) == 1 + 3 and n_full == 1 + 3 + 16  # stem + 3 shortcuts (+ 16 in blocks)
    assert m(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    with pytest.raises(Exception, match="block_norm"):
        build_model("mlp", 4, (16,), block_norm=False)


def test_fednh_table_rows_run_the_codes_way(tmp_path):
    from fedshift.cli import console
    from fedshift.studies.papers import FEDNH_TABLE1
    from fedshift.studies.reproduce import row_config

    base = console.load(str(console.find_config(FEDNH_TABLE1.configs["tinyimagenet"])), [], None)
    rows = {v.label: v for v in FEDNH_TABLE1.variants}
    local = row_config(base, FEDNH_TABLE1, "tinyimagenet", rows["Local"], follow="code")
    assert (local.train.rounds, local.train.participation, local.eval.personal) == (20, 1.0, "all")
    paper = row_config(base, FEDNH_TABLE1, "tinyimagenet", rows["Local"], follow="paper")
    assert (paper.train.rounds, paper.train.participation) == (200, 0.1)
    babu = row_config(base, FEDNH_TABLE1, "tinyimagenet", rows["FedBABU"], follow="paper")
    assert babu.eval.personal == "all"
    nh = row_config(base, FEDNH_TABLE1, "tinyimagenet", rows["FedNH"], follow="code")
    assert nh.model.block_norm is False
    assert row_config(base, FEDNH_TABLE1, "tinyimagenet", rows["FedAvg"]).model.block_norm
    assert base.train.augment == "crop_flip"


# ---------------------------------------------------------------------- never crash


def test_divergence_is_detected_before_evaluation_and_recorded(tmp_path):
    algorithm = {"name": "fedrc", "params": {"num_clusters": 2}}
    cfg = validate_config(tiny_config(tmp_path, algorithm=algorithm, train__lr=1e6))
    with pytest.raises(DivergedError) as err:
        run_experiment(cfg)
    assert err.value.round == 1 and "train.lr" in str(err.value)
    summary = RunDir(tmp_path / "runs" / "tiny").read_summary()
    assert summary["status"] == "diverged" and summary["diverged_round"] == 1


def fedshift(*args: str, cwd):
    return run_cli(*args, cwd=cwd)


def test_diverging_run_exits_3_with_one_line(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    res = fedshift("run", str(path), "train.lr=1e6", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert "Traceback" not in res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "diverged in round 1" in lines[0] and "train.lr" in lines[0]
    assert (
        yaml.safe_load((tmp_path / "runs" / "tiny" / "summary.json").read_text())["status"]
        == "diverged"
    )


def test_uncreatable_output_directory_exits_2_before_any_work(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for out in ("/proc/fedshift-out", str(blocker / "runs")):
        res = fedshift("run", str(path), f"output.dir={out}", cwd=tmp_path)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and "cannot be created or written" in lines[0], lines
