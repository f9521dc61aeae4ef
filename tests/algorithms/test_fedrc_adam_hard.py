"""FedRC-Adam (App. H.3) and hard clustering (Table 15: TeHC, TrHC): hand-computed Adam steps,
faster convergence than the plain E-step, the per-client Adam state, TrHC's single trained
and predicting model, executor equivalence and resume."""

from __future__ import annotations

import math

import pytest
import torch

from fedshift.algorithms.base import ClientData, ClientResult, RoundContext, softmax_probs
from fedshift.algorithms.fedem import e_step, label_statistics, omega_from_gamma
from fedshift.algorithms.fedrc import (
    ADAM_KEYS,
    FedRC,
    FedRCFT,
    adam_gamma_step,
    hard_gamma,
    renormalise_rows,
    smooth_label_stats,
)
from fedshift.config import validate_config
from fedshift.core.errors import ConfigError
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.run.experiment import make_algorithm
from tests.algorithms.conftest import TWO_CONCEPTS
from tests.conftest import (
    assert_close64,
    assert_history_same,
    assert_resume_equals_uninterrupted,
    linear_algo,
    run_executors,
    tiny_config,
)

CTX = RoundContext(1)


# ---------------------------------------------------------------------- pure math


def _adam_by_hand(prev, m, v, target, alpha, b1, b2, eps):
    """Eqs. 99-103 on plain floats, one sample: its new γ, ν and a."""
    g = [p - t for p, t in zip(prev, target, strict=True)]
    m = [b1 * a + (1 - b1) * x for a, x in zip(m, g, strict=True)]
    v = [b2 * a + (1 - b2) * x * x for a, x in zip(v, g, strict=True)]
    new = [
        max(p - alpha * (a / (1 - b1)) / (math.sqrt(b / (1 - b2)) + eps), 0.0)
        for p, a, b in zip(prev, m, v, strict=True)
    ]
    return [x / sum(new) for x in new], m, v


def test_adam_gamma_step_two_steps_by_hand():
    """The code's β₁ = β₂ = 0.5, α = 1: step 1 from uniform γ toward [0.8, 0.2] is a sign step
    (m̂ = g, √v̂ = |g|) that lands on [1, 0]; step 2 toward [0.6, 0.4] moves back by
    0.25/√0.205 (m̂ = 0.25, v̂ = 0.205)."""
    a, b1, b2, eps = 1.0, 0.5, 0.5, 1e-8
    g0, z = torch.tensor([[0.5, 0.5]], dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
    t1 = torch.tensor([[0.8, 0.2]], dtype=torch.float64)
    g1, m1, v1 = adam_gamma_step(g0, t1, z, z, a, b1, b2, eps)
    torch.testing.assert_close(m1, torch.tensor([[-0.15, 0.15]], dtype=torch.float64))
    torch.testing.assert_close(v1, torch.tensor([[0.045, 0.045]], dtype=torch.float64))
    torch.testing.assert_close(g1, torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    t2 = torch.tensor([[0.6, 0.4]], dtype=torch.float64)
    g2, m2, v2 = adam_gamma_step(g1, t2, m1, v1, a, b1, b2, eps)
    torch.testing.assert_close(m2, torch.tensor([[0.125, -0.125]], dtype=torch.float64))
    torch.testing.assert_close(v2, torch.tensor([[0.1025, 0.1025]], dtype=torch.float64))
    s = 0.25 / (math.sqrt(0.205) + eps)  # ≈ 0.5522
    torch.testing.assert_close(g2, torch.tensor([[1 - s, s]], dtype=torch.float64))


def test_adam_gamma_step_paper_betas_by_hand():
    """The paper's β₁ = 0.9, β₂ = 0.99 (unequal, so swapping them shows), two steps and a
    3-cluster sample where the clamp at 0 and the renormalisation act."""
    a, b1, b2, eps = 1.0, 0.9, 0.99, 1e-8
    prev = [[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]
    t1 = [[0.8, 0.2, 0.0], [0.6, 0.3, 0.1]]
    t2 = [[0.6, 0.4, 0.0], [0.5, 0.2, 0.3]]
    g, m, v = (torch.tensor(prev, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64),
               torch.zeros(2, 3, dtype=torch.float64))  # fmt: skip
    hand = [(prev[i], [0.0] * 3, [0.0] * 3) for i in range(2)]
    for target in (t1, t2):
        g, m, v = adam_gamma_step(g, torch.tensor(target, dtype=torch.float64), m, v,
                                  a, b1, b2, eps)  # fmt: skip
        hand = [_adam_by_hand(*hand[i], target[i], a, b1, b2, eps) for i in range(2)]
        torch.testing.assert_close(g, torch.tensor([h[0] for h in hand], dtype=torch.float64))
        torch.testing.assert_close(m, torch.tensor([h[1] for h in hand], dtype=torch.float64))
        torch.testing.assert_close(v, torch.tensor([h[2] for h in hand], dtype=torch.float64))
    # written out for sample 0, step 2: m = 0.9·(−0.03) + 0.1·0.4 = 0.013, v = 0.99·0.0009 +
    # 0.01·0.16 = 0.002491, step = (0.013/0.1) / √(0.002491/0.01) ≈ 0.2605
    step = 0.13 / (math.sqrt(0.2491) + eps)
    torch.testing.assert_close(g[0], torch.tensor([1 - step, step, 0.0], dtype=torch.float64))
    # sample 1, step 1: g = [−0.4, 0, 0.4], a sign step: [1.2, 0.3, −0.5 → 0] / 1.5
    g1, _, _ = adam_gamma_step(torch.tensor([prev[1]]), torch.tensor([t1[1]]),
                               torch.zeros(1, 3), torch.zeros(1, 3), a, b1, b2, eps)  # fmt: skip
    torch.testing.assert_close(g1, torch.tensor([[0.8, 0.2, 0.0]]))


def test_hard_gamma_renormalise_and_smoothing():
    g = torch.tensor([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
    torch.testing.assert_close(hard_gamma(g, 1), torch.tensor([[0.0, 1.0]] * 3))
    torch.testing.assert_close(
        renormalise_rows(torch.tensor([[0.5, 0.4], [0.0, 0.0]])),
        torch.tensor([[0.5 / 0.9, 0.4 / 0.9], [0.5, 0.5]]),
    )
    torch.testing.assert_close(
        smooth_label_stats(torch.tensor([[1.0, 0.0, 2.0, 0.0]])),
        torch.tensor([[1.25, 0.25, 2.25, 0.25]]),
    )


# ---------------------------------------------------------------------- FedRC-Adam in FedRC


def _rounds(algo, server, data, n: int) -> tuple[list[torch.Tensor], dict]:
    """``n`` rounds of one client at fixed models (no training): its ω after each."""
    client: dict = {}
    omegas = []
    for _ in range(n):
        task = algo.client_task(server, client, data, CTX)
        r = ClientResult(cid=0, num_samples=4, params=task.params, buffers=task.buffers)
        client = algo.client_update(server, client, task, r)
        omegas.append(client["omega"])
    return omegas, client


def test_adam_reaches_the_fixed_point_faster_than_em():
    """Fixed models under which every sample favours cluster 0: EM's ω converges to [1, 0] only
    geometrically (0.978 after 3 rounds, still < 0.999 after 5); FedRC-Adam (paper defaults)
    is there exactly after 3 rounds."""
    em, server, data, _ = linear_algo()
    adam, _, _, _ = linear_algo(omega_update="adam")
    losses = em.sample_losses(server, data)
    fixed = torch.tensor([0.5, 0.5])
    for _ in range(2000):
        fixed = omega_from_gamma(e_step(losses, fixed.log()))
    torch.testing.assert_close(fixed, torch.tensor([1.0, 0.0]))
    om_em, _ = _rounds(em, server, data, 5)
    om_adam, _ = _rounds(adam, server, data, 5)
    dist = lambda om: float((om - fixed).abs().max())  # noqa: E731
    assert dist(om_adam[2]) < 1e-6 < 0.01 < dist(om_em[2])
    assert all(dist(om_adam[t]) < dist(om_em[t]) for t in range(1, 5))
    assert dist(om_em[4]) > 1e-3


def test_adam_state_is_kept_and_used():
    algo, server, data, _ = linear_algo(omega_update="adam", adam_beta1=0.5, adam_beta2=0.5)
    _, client = _rounds(algo, server, data, 1)
    assert set(ADAM_KEYS) <= set(client) and client["gamma"].shape == (4, 2)
    torch.testing.assert_close(client["omega"], client["gamma"].mean(0))
    # round 2: target from ω = mean of the kept γ, then one step from the kept state
    task = algo.client_task(server, client, data, CTX)
    target = e_step(algo.sample_losses(server, data), client["omega"].log())
    expected = adam_gamma_step(client["gamma"], target, client["gamma_m"], client["gamma_v"],
                               1.0, 0.5, 0.5, 1e-8)  # fmt: skip
    torch.testing.assert_close(task.extras["gamma"], expected[0])
    torch.testing.assert_close(task.info["omega"], expected[0].mean(0))
    # the label statistics are those of the Adam γ (smoothed by 1/C with smooth_stats)
    up = algo.upload(task, task.params, task.buffers, data)
    torch.testing.assert_close(up["label_stats"], label_statistics(expected[0], data.y_train, 3))
    smooth, _, _, _ = linear_algo(omega_update="adam", smooth_stats=True)
    up2 = smooth.upload(task, task.params, task.buffers, data)
    torch.testing.assert_close(up2["label_stats"], up["label_stats"] + 1 / 3)
    # plain FedRC keeps no Adam state
    plain, _, _, _ = linear_algo()
    assert not set(ADAM_KEYS) & set(_rounds(plain, server, data, 1)[1])


def test_adam_state_follows_removed_clusters_and_time_steps():
    algo = FedRC(FedRC.Params(num_clusters=3, omega_update="adam"), None, 3, seed=0, train=None)
    client = {
        "omega": torch.tensor([0.35, 0.2, 0.45]),
        "cluster_ids": [0, 1, 2],
        "gamma": torch.tensor([[0.5, 0.1, 0.4], [0.2, 0.3, 0.5]]),
        "gamma_m": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
        "gamma_v": torch.tensor([[7.0, 8.0, 9.0], [10.0, 11.0, 12.0]]),
    }
    g, m, v = algo.live_adam({"cluster_ids": [0, 2]}, client, 2)
    torch.testing.assert_close(g, torch.tensor([[0.5 / 0.9, 0.4 / 0.9], [0.2 / 0.7, 0.5 / 0.7]]))
    torch.testing.assert_close(m, torch.tensor([[1.0, 3.0], [4.0, 6.0]]))
    torch.testing.assert_close(v, torch.tensor([[7.0, 9.0], [10.0, 12.0]]))
    assert algo.live_adam({"cluster_ids": [0, 1, 2]}, client, 2)[0] is client["gamma"]
    assert algo.live_adam({"cluster_ids": [0, 1, 2, 3]}, client, 2) is None  # a cluster added
    assert algo.live_adam({"cluster_ids": [0, 1, 2]}, client, 5) is None  # other samples
    data = ClientData(cid=0, train_idx=torch.arange(2), y_train=torch.tensor([0, 1]),
                      inputs=lambda i: i, step=2, prev_idx=torch.arange(2))  # fmt: skip
    assert algo.step_update({}, client, data, RoundContext(5, step=2)) == {}


# ---------------------------------------------------------------------- TrHC / TeHC


def test_hard_train_needs_hard_predict():
    with pytest.raises(ConfigError, match=r"hard_train.*hard_predict: true"):
        FedRC.parse_params({"hard_train": True})
    hp = FedRC.parse_params({"hard_train": True, "hard_predict": True})
    assert hp.hard_train and hp.hard_predict
    assert FedRC.parse_params({"hard_predict": True}).hard_train is False  # TeHC alone


def test_trhc_task_is_one_hot_on_the_top_model():
    algo, server, data, _ = linear_algo(hard_train=True, hard_predict=True)
    client = {"omega": torch.tensor([0.3, 0.7]), "cluster_ids": [0, 1]}
    task = algo.client_task(server, client, data, CTX)
    soft = e_step(algo.sample_losses(server, data), client["omega"].log())
    k = int(torch.argmax(soft.mean(0)))
    torch.testing.assert_close(task.info["omega"], soft.mean(0))  # ω stays soft
    torch.testing.assert_close(task.extras["gamma"], hard_gamma(soft, k))
    assert [p.trainable for p in task.phases] == [((k, None),)]
    up = algo.upload(task, task.params, task.buffers, data)
    torch.testing.assert_close(up["gamma_mass"], hard_gamma(soft, k).sum(0))


@pytest.mark.parametrize("hard", [False, True])
def test_trhc_trains_only_the_top_model(hard):
    """With weight decay and momentum on: under TrHC the other model comes back bit for bit;
    soft FedRC (the control) changes both."""
    hp = {"hard_train": True, "hard_predict": True} if hard else {}
    algo, server, data, _ = linear_algo(**hp)
    client = {"omega": torch.tensor([0.45, 0.55]), "cluster_ids": [0, 1]}
    task = algo.client_task(server, client, data, CTX)
    k = int(torch.argmax(task.info["omega"]))
    work = RoundWork.of(lr=0.1, momentum=0.9, weight_decay=0.01, batch_size=2, local_epochs=2)
    res = SequentialExecutor().train_one(algo, task, data, work)
    for m in range(2):
        for name, start in server["models"][m]["params"].items():
            same = torch.equal(res.params[m][name], start)
            assert same == (hard and m != k), (m, name)


def test_trhc_and_tehc_predict_with_one_model():
    for hp in ({"hard_predict": True}, {"hard_train": True, "hard_predict": True}):
        algo, server, data, _ = linear_algo(**hp)
        client = {"omega": torch.tensor([0.3, 0.7]), "cluster_ids": [0, 1]}
        mix = algo.mixture(server, client, data)
        assert len(mix) == 1 and mix[0][0] == 1.0 and mix[0][1] is server["models"][1]["params"]
        probs = algo.predict(server, client, data, torch.tensor([0, 1]))
        logits = data.inputs(torch.tensor([0, 1])) @ server["models"][1]["params"]["weight"].T
        torch.testing.assert_close(probs, softmax_probs(logits))


# ---------------------------------------------------------------------- simulations


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fedrc", "params": {"num_clusters": 3, "omega_update": "adam",
                                     "smooth_stats": True}},
        {"name": "fedrc", "params": {"num_clusters": 4, "omega_update": "adam",
                                     "adam_beta1": 0.5, "adam_beta2": 0.5,
                                     "adaptive_delta": 0.3}},
        {"name": "fedrc", "params": {"num_clusters": 3, "hard_train": True,
                                     "hard_predict": True}},
        {"name": "fedrc-shared", "params": {"num_clusters": 3, "hard_train": True,
                                            "hard_predict": True}},
    ],
    ids=["adam", "adam-adaptive", "trhc", "trhc-shared"],
)  # fmt: skip
def test_executor_equivalence(tmp_path, algorithm):
    """Sequential and batched (vmap, loop) runs agree. Not bit for bit: the E-step and the Adam
    step are the same code on both (built before training), but the batched executor's stacked
    SGD and TrHC's grouping of clients by trained model change the summation order, so models,
    ω and γ agree to the float64 executor tolerance (F64_ATOL, fedshift/testing.py) and the
    accuracies exactly (assert_history_same)."""
    cfg = validate_config(
        tiny_config(tmp_path, algorithm=algorithm, train__rounds=3, train__participation=0.5,
                    train__momentum=0.9, train__weight_decay=1e-3, **TWO_CONCEPTS)
    )  # fmt: skip
    seq, vmap, loop = run_executors(
        cfg, (SequentialExecutor(), BatchedExecutor(2, "vmap"), BatchedExecutor(2, "loop"))
    )
    for name, bat in (("vmap", vmap), ("loop", loop)):
        assert bat.server["cluster_ids"] == seq.server["cluster_ids"]
        for i, (ms, mb) in enumerate(zip(seq.server["models"], bat.server["models"], strict=True)):
            for key, v in ms["params"].items():
                assert_close64(mb["params"][key], v, f"{name}: model {i} {key}")
        assert_close64(bat.server["prior"], seq.server["prior"], f"{name}: prior")
        assert bat.clients.keys() == seq.clients.keys()
        for cid, st in seq.clients.items():
            assert bat.clients[cid].keys() == st.keys()
            for key in ("omega", *ADAM_KEYS):
                if key in st:
                    assert_close64(bat.clients[cid][key], st[key], f"{name}: {key} {cid}")
        assert_history_same(seq, bat)
    if algorithm["params"].get("omega_update") == "adam":
        assert all(set(ADAM_KEYS) <= set(st) for st in seq.clients.values())
    if "adaptive_delta" in algorithm["params"]:
        assert len(seq.server["models"]) < 4  # a removal happened: the Adam state followed it


def test_adam_and_trhc_resume_exactly(tmp_path):
    """The Adam moments live in the client state, so a run killed after round 2 and resumed
    has the uninterrupted run's metrics."""
    params = {"num_clusters": 2, "omega_update": "adam", "hard_train": True, "hard_predict": True}
    cfg = validate_config(
        tiny_config(tmp_path, algorithm={"name": "fedrc", "params": params}, train__rounds=4,
                    train__participation=0.5, **TWO_CONCEPTS)
    )  # fmt: skip
    full = assert_resume_equals_uninterrupted(cfg, stop_at=2)
    assert len(full.history) == 4


def test_trhc_fine_tunes_and_shares_the_body_like_it_trains(tmp_path):
    """FedRC-FT under TrHC tunes only the top-ω model on a one-hot γ; FedRC-shared under TrHC
    trains the body (read from model 0) and the top model's head only."""
    ft, server, data, _ = linear_algo(cls=FedRCFT, hard_train=True, hard_predict=True)
    client = {"omega": torch.tensor([0.3, 0.7]), "cluster_ids": [0, 1]}
    task = ft.fine_tune_task(server, client, data)
    assert task.phases[0].trainable == ((1, None),)
    soft = e_step(ft.sample_losses(server, data), client["omega"].log())
    torch.testing.assert_close(task.extras["gamma"], hard_gamma(soft, 1))

    params = {"num_clusters": 3, "hard_train": True, "hard_predict": True}
    cfg = validate_config(
        tiny_config(tmp_path, algorithm={"name": "fedrc-shared", "params": params})
    )
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    server = algo.init_server_state([algo.ops.init(k) for k in range(3)])
    names = list(server["models"][0]["params"])
    heads = tuple(n for n in names if n in algo.head_names)
    body = tuple(n for n in names if n not in algo.head_names)
    assert heads and body
    assert algo.hard_trainable(server, 0) == ((0, None),)
    assert algo.hard_trainable(server, 2) == ((0, body), (2, heads))
