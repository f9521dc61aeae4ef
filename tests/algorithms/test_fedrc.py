"""FedRC / FedEM: hand-computed E-step and label statistics, adaptive removal, prediction,
executor equivalence and an end-to-end clustering check."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedshift.algorithms.base import ClientData, ClientResult, ModelOps, RoundContext
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.fedem import (
    FedEM,
    adaptive_keep,
    add_noise,
    drop_clusters,
    e_step,
    label_statistics,
    log_prior_of_labels,
    normalise_label_stats,
    omega_from_gamma,
)
from fedshift.algorithms.fedrc import FedRC, FedRCParams
from fedshift.algorithms.registry import get_algorithm
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, sim_config
from tests.algorithms.conftest import TWO_CONCEPTS
from tests.conftest import (
    RUN,
    assert_close64,
    assert_history_same,
    linear_algo,
    run_executors,
    tiny_config,
)

CTX = RoundContext(1)


# ---------------------------------------------------------------------- pure math


def test_e_step_by_hand():
    losses = torch.tensor([[1.0, 2.0], [0.5, 0.5]])
    omega = torch.tensor([0.25, 0.75])
    g = e_step(losses, omega.log())
    # row 0: 0.25 e^-1 vs 0.75 e^-2; row 1: equal losses, so γ = ω
    a, b = 0.25 * math.exp(-1), 0.75 * math.exp(-2)
    expected = torch.tensor([[a / (a + b), b / (a + b)], [0.25, 0.75]])
    torch.testing.assert_close(g, expected)
    torch.testing.assert_close(g.sum(1), torch.ones(2))
    torch.testing.assert_close(omega_from_gamma(g), expected.mean(0))

    # with the label prior: sample 0 has label 0, sample 1 label 1; C [K=2, C=2]
    prior = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
    y = torch.tensor([0, 1])
    lp = log_prior_of_labels(prior, y)
    torch.testing.assert_close(lp, torch.tensor([[0.8, 0.4], [0.2, 0.6]]).log())
    g = e_step(losses, omega.log(), lp)
    a, b = 0.25 * math.exp(-1) / 0.8, 0.75 * math.exp(-2) / 0.4
    c, d = 0.25 * math.exp(-0.5) / 0.2, 0.75 * math.exp(-0.5) / 0.6
    expected = torch.tensor([[a / (a + b), b / (a + b)], [c / (c + d), d / (c + d)]])
    torch.testing.assert_close(g, expected)
    torch.testing.assert_close(g.sum(1), torch.ones(2))


def test_e_step_stable_for_large_losses():
    g = e_step(torch.tensor([[1000.0, 1001.0]]), torch.tensor([0.5, 0.5]).log())
    torch.testing.assert_close(g, torch.tensor([[1 / (1 + math.exp(-1)), 1 / (1 + math.e)]]))


def test_uniform_prior_equals_no_prior():
    losses = torch.rand(7, 3) * 4
    log_om = torch.tensor([0.2, 0.3, 0.5]).log()
    y = torch.randint(0, 4, (7,))
    uniform = torch.full((3, 4), 0.25)
    torch.testing.assert_close(
        e_step(losses, log_om, log_prior_of_labels(uniform, y)), e_step(losses, log_om)
    )


def test_label_statistics_and_normalisation():
    gamma = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    y = torch.tensor([0, 2, 0])
    s = label_statistics(gamma, y, 3)
    torch.testing.assert_close(s, torch.tensor([[1.4, 0.0, 0.2], [0.6, 0.0, 0.8]]))
    prior = normalise_label_stats(s)
    tot0, tot1 = 1.4 + 1e-8 + 0.2, 0.6 + 1e-8 + 0.8
    torch.testing.assert_close(
        prior,
        torch.tensor(
            [[1.4 / tot0, 1e-8 / tot0, 0.2 / tot0], [0.6 / tot1, 1e-8 / tot1, 0.8 / tot1]]
        ),
    )
    # an all-zero row becomes uniform; negative (noisy) entries are clamped to 1e-8
    p = normalise_label_stats(torch.tensor([[0.0, 0.0], [-3.0, 1.0]]))
    torch.testing.assert_close(p, torch.tensor([[0.5, 0.5], [1e-8 / (1 + 1e-8), 1 / (1 + 1e-8)]]))
    assert (p > 0).all()


def test_noise_is_seeded():
    s = torch.ones(2, 3)
    a = add_noise(s, 25.0, torch.Generator().manual_seed(3))
    b = add_noise(s, 25.0, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)
    assert (a - s).abs().max() > 1
    assert add_noise(s, 0.0, torch.Generator()) is s


def test_adaptive_keep_rule():
    # masses 50/3/47 of N=100: cluster 1 has 0.03 < δ = 0.05
    keep = adaptive_keep(torch.tensor([50.0, 3.0, 47.0]), 0.05)
    assert keep.tolist() == [True, False, True]
    assert adaptive_keep(torch.tensor([40.0, 10.0, 50.0]), 0.05).all()
    assert adaptive_keep(torch.tensor([1.0, 0.0]), 0.9).tolist() == [True, False]
    torch.testing.assert_close(
        drop_clusters(torch.tensor([0.5, 0.1, 0.4]), keep), torch.tensor([0.5, 0.4]) / 0.9
    )


# ---------------------------------------------------------------------- tiny linear model


def softmax(v):
    e = [math.exp(a) for a in v]
    return [a / sum(e) for a in e]


def test_mixture_prediction_by_hand():
    algo, server, data, _ = linear_algo()
    client = {"omega": torch.tensor([0.3, 0.7]), "cluster_ids": [0, 1]}
    probs = algo.predict(server, client, data, torch.tensor([0]))  # x = 2
    p0, p1 = softmax([2.0, 0.0, -2.0]), softmax([-2.0, 1.0, 2.0])
    expected = torch.tensor([[0.3 * a + 0.7 * b for a, b in zip(p0, p1, strict=True)]])
    torch.testing.assert_close(probs, expected)
    assert algo.cluster_of(server, client) == 1

    hard, server, data, _ = linear_algo(hard_predict=True)
    probs = hard.predict(server, client, data, torch.tensor([0]))
    torch.testing.assert_close(probs, torch.tensor([p1]))


def test_client_task_e_step_and_upload():
    algo, server, data, x = linear_algo()
    client: dict = {}
    task = algo.client_task(server, client, data, CTX)
    assert client == {}  # the task reads the client state, never writes it
    logits = [x @ m["params"]["weight"].T for m in server["models"]]
    ce = torch.stack(
        [nn.functional.cross_entropy(lg, data.y_train, reduction="none") for lg in logits], 1
    )
    gamma = torch.softmax(-ce, 1)  # uniform ω, no prior yet
    torch.testing.assert_close(task.extras["gamma"], gamma)
    assert task.params[0] is server["models"][0]["params"]  # referenced, not cloned
    # the upload (one hook) reaches aggregate with the result; ω stays with the client
    up = algo.upload(task, task.params, task.buffers, data)
    torch.testing.assert_close(up["label_stats"], label_statistics(gamma, data.y_train, 3))
    torch.testing.assert_close(up["gamma_mass"], gamma.sum(0))
    r = ClientResult(cid=0, num_samples=4, params=task.params, buffers=task.buffers, upload=up)
    client = algo.client_update(server, client, task, r)
    torch.testing.assert_close(client["omega"], gamma.mean(0))
    new = algo.aggregate(server, [r], CTX)
    torch.testing.assert_close(new["prior"], normalise_label_stats(up["label_stats"]))
    # the next round's E-step divides by the prior
    task2 = algo.client_task(new, client, data, CTX)
    expected = e_step(ce, client["omega"].log(), log_prior_of_labels(new["prior"], data.y_train))
    torch.testing.assert_close(task2.extras["gamma"], expected)


def test_fedem_equals_fedrc_with_uniform_prior():
    rc, server, data, _ = linear_algo()
    em = FedEM(FedEM.Params(num_clusters=2), rc.ops, 3, **RUN)
    omega = torch.tensor([0.4, 0.6])
    client = {"omega": omega, "cluster_ids": [0, 1]}
    g_em = em.client_task(server, client, data, CTX).extras["gamma"]
    g_rc = rc.client_task(server, client, data, CTX).extras["gamma"]
    torch.testing.assert_close(g_rc, g_em)  # no prior yet: identical
    server["prior"] = torch.full((2, 3), 1 / 3)
    g_rc = rc.client_task(server, client, data, CTX).extras["gamma"]
    torch.testing.assert_close(g_rc, g_em)
    task = em.client_task(server, {}, data, CTX)
    assert "label_stats" not in em.upload(task, task.params, task.buffers, data)


def test_adaptive_removal_keeps_state_consistent():
    ops = ModelOps(lambda: nn.Linear(1, 3), torch.device("cpu"))
    algo = FedRC(FedRCParams(num_clusters=3, adaptive_delta=0.05), ops, 3, **RUN)
    server = algo.init_server_state([ops.init(k) for k in range(3)])
    stats = torch.tensor([[10.0, 0.0, 0.0], [0.1, 0.1, 0.0], [0.0, 5.0, 5.0]])
    results = []
    for cid in range(2):
        p = [m["params"] for m in server["models"]]
        b = [m["buffers"] for m in server["models"]]
        up = {"label_stats": stats, "gamma_mass": stats.sum(1)}
        results.append(ClientResult(cid=cid, num_samples=10, params=p, buffers=b, upload=up))
    new = algo.aggregate(server, results, CTX)
    assert new["cluster_ids"] == [0, 2] and len(new["models"]) == 2
    assert new["models"][1] is not None and new["prior"].shape == (2, 3)
    assert all(s.shape == (2, 3) for s in new["label_stats"].values())
    client = {"omega": torch.tensor([0.5, 0.1, 0.4]), "cluster_ids": [0, 1, 2]}
    torch.testing.assert_close(algo.live_omega(new, client), torch.tensor([0.5, 0.4]) / 0.9)
    assert len(algo.mixture(new, client, None)) == 2
    assert algo.cluster_of(new, client) == 0
    data = ClientData(
        cid=0,
        train_idx=torch.arange(3),
        y_train=torch.tensor([0, 1, 2]),
        inputs=lambda i: torch.ones(len(i), 1),
    )
    task = algo.client_task(new, client, data, CTX)
    assert len(task.params) == 2 and task.extras["gamma"].shape == (3, 2)
    r = ClientResult(cid=0, num_samples=3, params=task.params, buffers=task.buffers)
    assert algo.client_update(new, client, task, r)["cluster_ids"] == [0, 2]
    assert algo.adapt_test_client(new, data, {})["omega"].shape == (2,)


def test_registered():
    for name in ("fedrc", "fedem", "fedrc-ft", "fedrc-shared"):
        cls = get_algorithm(name)
        assert cls.supports_batched and not issubclass(cls, Personalised)


# ---------------------------------------------------------------------- simulations


def run(cfg, executor):
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    return Simulator(algo, data, sim_config(cfg), executor).run()


def run64(cfg, executor):
    """The run of ``cfg`` on ``executor`` in float64 (see F64_ATOL in fedshift/testing.py)."""
    return run_executors(cfg, (executor,))[0]


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fedrc", "params": {"num_clusters": 3}},
        {"name": "fedem", "params": {"num_clusters": 3}},
        {"name": "fedrc-shared", "params": {"num_clusters": 3}},
    ],
    ids=lambda a: a["name"],
)
def test_executor_equivalence(tmp_path, algorithm):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm=algorithm,
            train__rounds=3,
            train__participation=0.5,
            **TWO_CONCEPTS,
        )
    )
    seq = run64(cfg, SequentialExecutor())
    for vectorize in ("vmap", "loop"):
        bat = run64(cfg, BatchedExecutor(2, vectorize))
        for i, (ms, mb) in enumerate(zip(seq.server["models"], bat.server["models"], strict=True)):
            for key, v in ms["params"].items():
                assert_close64(mb["params"][key], v, f"{vectorize}: model {i} {key}")
        if seq.server["prior"] is not None:
            assert_close64(bat.server["prior"], seq.server["prior"], f"{vectorize}: prior")
        for cid, st in seq.clients.items():
            assert_close64(bat.clients[cid]["omega"], st["omega"], f"{vectorize}: omega {cid}")
        assert_history_same(seq, bat)


def test_shared_extractor_bodies_stay_identical(tmp_path):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm={"name": "fedrc-shared", "params": {"num_clusters": 2}},
            train__rounds=2,
            **TWO_CONCEPTS,
        )
    )
    st = run(cfg, BatchedExecutor(4, "loop"))
    m0, m1 = st.server["models"]
    heads = [k for k in m0["params"] if k.startswith("head.")]
    assert heads and len(heads) < len(m0["params"])
    for k in m0["params"]:
        same = torch.equal(m0["params"][k], m1["params"][k])
        assert same == (k not in heads), k


def test_fedrc_ft_and_adaptive_variants_run(tmp_path):
    for params in (
        {"name": "fedrc-ft", "params": {"num_clusters": 2, "ft_batch_size": 32, "ft_lr": 0.02}},
        {"name": "fedrc", "params": {"num_clusters": 4, "adaptive_delta": 0.3, "noise_std": 5.0}},
    ):
        cfg = validate_config(
            tiny_config(tmp_path, algorithm=params, train__rounds=3, **TWO_CONCEPTS)
        )
        st = run(cfg, BatchedExecutor(4, "loop"))
        h = st.history[-1]
        assert h["local_acc"] > 30 and h["global_acc"] > 25, h  # chance: 25 (4 classes)
        K = len(st.server["models"])
        assert len(st.server["cluster_ids"]) == K and st.server["prior"].shape[0] == K
        if params["name"] == "fedrc":
            assert K < 4  # δ = 0.3 with 4 clusters removes at least one
        # each evaluation logs the live clusters by their first ids and their share of γ
        assert h["num_models"] == K and h["cluster_ids"] == st.server["cluster_ids"]
        assert len(h["cluster_share"]) == K and sum(h["cluster_share"]) == pytest.approx(1.0)
        assert min(h["cluster_share"]) >= (0.3 if params["name"] == "fedrc" else 0.0) - 1e-6


def test_fedrc_clusters_by_concept_and_beats_fedavg(tmp_path):
    def cfg(algorithm):
        return validate_config(
            tiny_config(
                tmp_path,
                algorithm=algorithm,
                train__rounds=15,
                train__lr=0.1,
                train__local_epochs=2,
                scenario__num_clients=8,
                scenario__dataset_options={
                    "n_train": 1600,
                    "n_test": 400,
                    "dim": 16,
                    "num_classes": 4,
                    "separation": 6.0,
                },
                **TWO_CONCEPTS,
            )
        )

    rc = run(cfg({"name": "fedrc", "params": {"num_clusters": 2}}), BatchedExecutor(8, "loop"))
    avg = run(cfg({"name": "fedavg"}), BatchedExecutor(8, "loop"))
    h_rc, h_avg = rc.history[-1], avg.history[-1]
    assert h_rc["ari_concept"] > 0.8
    assert h_rc["global_acc"] > h_avg["global_acc"] + 10
