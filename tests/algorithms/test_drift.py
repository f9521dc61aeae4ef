"""Drift over time: the timeline scenarios (FedDAA's deal, the switch rule, test tasks), the math
of NCD, RDLD, FedDrift, Flash and A-FedAvg by hand, the step-average protocol, early stopping,
and the engine over step boundaries (executors agree, kill and resume equals a clean run)."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from fedshift.algorithms.afedavg import adaptive_lr
from fedshift.algorithms.base import LocalTask, Phase
from fedshift.algorithms.feddaa import choose_cluster_count, data_prototype, detect_drift
from fedshift.algorithms.feddrift import accuracy_distance, drifted, merge_groups
from fedshift.algorithms.flash import FlashParams, flash_step
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.data.timeline import deal_pieces
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.reporting.protocols import select_round
from fedshift.run.experiment import make_algorithm, run_experiment
from fedshift.run.folder import RunDir
from tests.conftest import (
    RUN,
    as_float64,
    assert_close64,
    assert_history_same,
    assert_resume_equals_uninterrupted,
    float64,
    run_executors,
    timeline_config,
    tiny_config,
)

CPU = torch.device("cpu")


# ---------------------------------------------------------------------- scenarios


def test_feddaa_deal_of_pieces():
    rng = np.random.default_rng(0)
    concepts = (np.arange(60) * 4) // 60  # pieces 0-14 -> 0, 15-29 -> 1, ...
    t1 = deal_pieces(concepts, [0, 1], 60, rng)
    assert Counter(Counter(t1.tolist()).values()) == {2: 30}  # every c1/c2 piece twice
    t2 = deal_pieces(concepts, [0, 1, 2], 60, rng)
    per_concept = Counter(concepts[t2].tolist())
    assert per_concept == {0: 20, 1: 20, 2: 20}
    assert all(len(set(t2[concepts[t2] == c])) == 15 for c in range(3))  # 15 + 5 duplicates
    t3 = deal_pieces(concepts, [0, 1, 2, 3], 60, rng)
    assert sorted(t3.tolist()) == list(range(60))  # a permutation


def test_timeline_scenario_steps_styles_history_and_tasks(tmp_path):
    cfg = timeline_config(tmp_path)
    assert cfg.train.rounds == 6  # steps x rounds_per_step
    data = build_scenario(cfg.scenario, cfg.seed)
    assert data.num_steps == 3 and [data.step_of_round(r) for r in range(1, 7)] == [
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    s1, s2, s3 = data.steps
    assert {c.concept for c in s1} == {0, 1} and {c.concept for c in s2} == {0, 1, 2}
    assert all(c.prev is None and not c.drifted for c in s1)
    for a, b in zip(s1, s2, strict=True):
        assert b.prev is a and b.drifted == (a.concept != b.concept)
        assert b.style.label() == "rotate(90)"
    # the previous data is the previous step's styled images; labels follow each concept's map
    c = s2[0]
    x_prev, x_now = data.x[c.prev.train_idx[:3]], data.x[c.train_idx[:3]]
    assert x_prev.shape == x_now.shape and c.prev.style.label() == "clean"
    tasks = {t.task for t in data.test_clients}
    assert len(data.test_clients) == 9 and "c2@rotate(180)" in tasks and "c0" in tasks
    t = next(t for t in data.test_clients if t.task == "c1@rotate(90)")
    assert torch.equal(t.y_test, 9 - next(u for u in data.test_clients if u.task == "c0").y_test)
    assert data.at_step(2).clients is s2 and data.at_step(2).step == 2
    with pytest.raises(Exception, match="train.rounds"):
        raw = cfg.model_dump(mode="json")
        raw["train"]["rounds"] = 5
        validate_config(raw)


def test_switch_assignment_moves_a_share_of_clients(tmp_path):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            scenario={
                "dataset": "digits",
                "num_clients": 20,
                "concepts": ["identity", "reverse", "shift:1"],
                "timeline": {
                    "rounds_per_step": 1,
                    "assignment": "switch",
                    "steps": [{"concepts": [0, 1]}, {"concepts": [0, 1, 2], "switch": 0.3}],
                },
            },
            model={"name": "lenet_small"},
            train={"batch_size": 32, "lr": 0.05},
        )
    )
    data = build_scenario(cfg.scenario, cfg.seed)
    s1, s2 = data.steps
    assert Counter(c.concept for c in s1) == {0: 10, 1: 10}
    assert sum(c.drifted for c in s2) == 6  # 30% of 20
    assert all(torch.equal(a.train_idx, b.train_idx) for a, b in zip(s1, s2, strict=True))


# ---------------------------------------------------------------------- FedDAA math


def test_data_prototype_by_hand():
    logits = torch.tensor([[1.0, 0.0, 0.0], [3.0, 0.0, 2.0], [0.0, 5.0, 1.0]])
    y = torch.tensor([0, 0, 1])
    p = data_prototype(logits, y, 3).view(3, 3)
    torch.testing.assert_close(p[0], torch.tensor([2.0, 0.0, 1.0]))
    torch.testing.assert_close(p[1], torch.tensor([0.0, 5.0, 1.0]))
    assert torch.equal(p[2], torch.zeros(3))  # no sample of class 2: a zero row


def test_ncd_picks_the_number_of_centres():
    rng = np.random.default_rng(0)
    for true_c in (2, 3, 4):
        centres = rng.normal(scale=10.0, size=(true_c, 16))
        protos = np.concatenate([c + rng.normal(scale=0.5, size=(8, 16)) for c in centres])
        c, found, scores = choose_cluster_count(protos, 9, seed=1)
        assert c == true_c, scores
        assert found.shape == (true_c, 16) and max(scores, key=scores.get) == true_c
    # the ablation fixes the count
    assert choose_cluster_count(protos, 9, seed=1, fixed=2)[0] == 2


def test_rdld_flags_a_concept_change_not_a_rotation():
    torch.manual_seed(0)
    R = 4
    y = torch.arange(R).repeat(25)
    logits = 5.0 * torch.nn.functional.one_hot(y, R).float() + 0.1 * torch.randn(100, R)
    ident = data_prototype(logits, y, R)
    reverse = data_prototype(logits, (R - 1) - y, R)  # the same inputs, labels remapped
    centres = torch.stack([ident, reverse])
    rotated = data_prototype(logits + 0.5 * torch.randn(100, R), y, R)  # P(x) moved a little
    assert not detect_drift(ident, rotated, centres)
    assert detect_drift(ident, reverse, centres)


# ---------------------------------------------------------------------- baselines' math


def test_feddrift_distance_merge_and_detection_by_hand():
    # models 0 and 1 fit the same data (cross accuracies close); model 2 another concept
    A = np.array([[0.8, 0.75, 0.1], [0.78, 0.82, 0.12], [0.1, 0.1, 0.9]])
    assert accuracy_distance(A, 0, 1) == pytest.approx(0.05)  # max(0.8-0.75, 0.82-0.78)
    assert accuracy_distance(A, 0, 2) == pytest.approx(0.8)
    assert accuracy_distance(np.array([[0.5, 0.9], [0.9, 0.5]]), 0, 1) == 0.0  # clipped at 0
    assert merge_groups(A, 0.06) == [[0, 1], [2]]
    assert merge_groups(A, 0.04) == [[0], [1], [2]]
    # complete linkage: 0-1 and 1-2 close, 0-2 far: 2 does not join {0, 1}
    chain = np.array([[0.9, 0.87, 0.8], [0.86, 0.9, 0.87], [0.8, 0.86, 0.9]])
    assert merge_groups(chain, 0.05) == [[0, 1], [2]]
    assert drifted(0.8, 0.7, 0.06) and not drifted(0.8, 0.75, 0.06)


def _fd_model(v: float) -> dict:
    return {"params": {"w": torch.full((2,), v)}, "buffers": {}}


def _fd_uploads(correct: dict[int, dict[int, list[int]]]) -> dict:
    """Step uploads of FedDrift: per client, correct counts of every model on each step's
    data (10 samples each)."""
    return {c: {"correct": per, "n": dict.fromkeys(per, 10)} for c, per in correct.items()}


def test_feddrift_start_step_isolates_assigns_merges_and_respects_the_cap():
    from fedshift.algorithms.base import RoundContext
    from fedshift.algorithms.feddrift import FedDrift, FedDriftParams

    algo = FedDrift(FedDriftParams(), None, 3, **RUN)
    s = algo.init_server_state([(_fd_model(0.0)["params"], {}), (_fd_model(1.0)["params"], {})])
    # step 1: everyone on its best model, nobody drifts (no history)
    up1 = {0: [5, 2], 1: [6, 1], 2: [1, 7], 3: [2, 8]}
    s = algo.start_step(
        s, _fd_uploads({c: {1: v} for c, v in up1.items()}), RoundContext(1, step=1)
    )
    assert s["assign"] == {0: 0, 1: 0, 2: 1, 3: 1} and not any(s["drifted"].values())
    # step 2: client 0's best accuracy falls 0.5 -> 0.2: drift, a copy of its best model,
    # isolated for h_w = 1 step; the others move to their best model
    up2 = {c: {1: up1[c], 2: v} for c, v in {0: [2, 1], 1: [6, 1], 2: [1, 7], 3: [2, 8]}.items()}
    s = algo.start_step(s, _fd_uploads(up2), RoundContext(21, step=2))
    assert s["ids"] == [0, 1, 2] and s["assign"] == {0: 2, 1: 0, 2: 1, 3: 1}
    assert s["drifted"] == {0: True, 1: False, 2: False, 3: False}
    assert s["isolated"] == {2: 3} and torch.equal(s["models"][2]["params"]["w"], torch.zeros(2))
    assert s["history"][0] == {1: 0, 2: 2}
    # step 3: the isolation is over; model 2 is close to model 0 on their data
    # (D(0, 2) = max(23/40 - 10/20, 11/20 - 22/40) = 0.075): merged at delta 0.1, not at 0.06
    s["models"][2] = _fd_model(3.0)
    up3 = {
        0: {1: [5, 2, 5], 2: [2, 1, 2], 3: [8, 1, 9]},
        1: {1: [6, 1, 6], 2: [6, 1, 6], 3: [6, 1, 5]},
        2: {1: [1, 7, 1], 2: [1, 7, 1], 3: [1, 7, 1]},
        3: {1: [2, 8, 2], 2: [2, 8, 2], 3: [2, 8, 2]},
    }
    kept = algo.start_step(s, _fd_uploads(up3), RoundContext(41, step=3))
    assert kept["ids"] == [0, 1, 2] and kept["assign"][0] == 2 and kept["isolated"] == {}
    assert not kept["drifted"][0] and kept["last_acc"][0] == pytest.approx(0.9)
    loose = FedDrift(FedDriftParams(merge_delta=0.1), None, 3, **RUN)
    merged = loose.start_step(s, _fd_uploads(up3), RoundContext(41, step=3))
    assert merged["ids"] == [0, 1] and merged["assign"] == {0: 0, 1: 0, 2: 1, 3: 1}
    assert merged["history"][0] == {1: 0, 2: 0, 3: 0}
    # weighted by pieces: model 0 held 4 (client, step) pieces, model 2 held 2
    torch.testing.assert_close(merged["models"][0]["params"]["w"], torch.full((2,), 1.0))
    # at the cap, the least recently used model not used this step gives its slot
    capped = FedDrift(FedDriftParams(max_clusters=2), None, 3, **RUN)
    c = capped.init_server_state([(_fd_model(0.0)["params"], {}), (_fd_model(1.0)["params"], {})])
    c = capped.start_step(
        c, _fd_uploads({k: {1: v} for k, v in up1.items()}), RoundContext(1, step=1)
    )
    up2[1][2] = [6, 6]  # client 1 also fits model 1 (model 0 goes at the cap)
    c = capped.start_step(c, _fd_uploads(up2), RoundContext(21, step=2))
    assert len(c["models"]) == 2 and c["ids"] == [1, 2]
    assert c["assign"] == {0: 2, 1: 1, 2: 1, 3: 1} and c["drifted"][0]
    assert all(0 not in h.values() for h in c["history"].values())  # model 0's data dropped
    # h_w = 2: at step 3 client 0 is still isolated: it stays although model 0 is better
    # for it, and its model does not merge
    slow = FedDrift(FedDriftParams(h_w=2, merge_delta=0.1), None, 3, **RUN)  # h_w=1 merged, above
    w = slow.init_server_state([(_fd_model(0.0)["params"], {}), (_fd_model(1.0)["params"], {})])
    w = slow.start_step(
        w, _fd_uploads({k: {1: v} for k, v in up1.items()}), RoundContext(1, step=1)
    )
    up2[1][2] = [6, 1]
    w = slow.start_step(w, _fd_uploads(up2), RoundContext(21, step=2))
    up3[0][3] = [9, 1, 2]
    w = slow.start_step(w, _fd_uploads(up3), RoundContext(41, step=3))
    assert w["assign"][0] == 2 and w["isolated"] == {2: 4} and w["ids"] == [0, 1, 2]


def test_feddrift_trains_a_client_on_its_data_of_every_step_with_its_model():
    from fedshift.algorithms.base import ClientData, RoundContext
    from fedshift.algorithms.feddrift import FedDrift, FedDriftParams

    pieces = {s: (torch.arange(10 * s, 10 * s + 3), torch.full((3,), s)) for s in (1, 2, 3)}
    server = {
        "models": [_fd_model(0.0), _fd_model(1.0)],
        "ids": [0, 5],
        "assign": {7: 5},
        "history": {7: {1: 5, 2: 0, 3: 5}},
    }
    view = ClientData(7, pieces[3][0], pieces[3][1], inputs=None, step=3)
    task = FedDrift(FedDriftParams(), None, 4, **RUN).client_task(
        server, {"data": pieces}, view, RoundContext(41, step=3)
    )
    assert task.info["cluster"] == 1 and task.params[0] is server["models"][1]["params"]
    assert torch.equal(task.train_idx, torch.cat([pieces[1][0], pieces[3][0]]))
    assert torch.equal(task.y_train, torch.tensor([1, 1, 1, 3, 3, 3]))
    current = FedDrift(FedDriftParams(train_on="current"), None, 4, **RUN)
    assert (
        current.client_task(server, {"data": pieces}, view, RoundContext(41, step=3)).train_idx
        is None
    )


def test_flash_server_step_by_hand():
    hp = FlashParams(server_lr=0.1, tau=1e-9)
    w = torch.tensor([1.0, 2.0])
    d1 = torch.tensor([0.2, -0.1])
    w1, m, v, d = flash_step(w, d1, None, None, None, hp)
    torch.testing.assert_close(m, d1)
    torch.testing.assert_close(v, d1**2)
    assert torch.equal(d, torch.zeros(2))
    torch.testing.assert_close(w1, w + 0.1 * d1 / (d1.abs() + 1e-9))  # first step: sign-like
    d2 = torch.tensor([0.1, 0.1])
    w2, m2, v2, dd2 = flash_step(w1, d2, m, v, d, hp)
    m_ref = 0.5 * m + 0.5 * d2
    v_ref = 0.5 * v + 0.5 * d2**2
    beta3 = v.norm() / ((d2**2 - v_ref).norm() + v.norm())
    d_ref = (1 - beta3) * (d2**2 - v_ref)
    torch.testing.assert_close(m2, m_ref)
    torch.testing.assert_close(dd2, d_ref)
    torch.testing.assert_close(w2, w1 + 0.1 * m_ref / (v_ref.sqrt() - d_ref + 1e-9))
    w_bn, *_ = flash_step(w1, d2, m, v, d, hp, norm_layer=True)
    torch.testing.assert_close(w_bn, w1 + m_ref)  # normalisation layers: momentum only


def test_afedavg_learning_rate_by_hand():
    b = 0.5
    lr, st = adaptive_lr({}, torch.tensor([2.0, 4.0]), 0.06, b, b, b)
    mean1 = (0.5 * torch.tensor([2.0, 4.0])) / 0.5  # bias-corrected
    assert torch.equal(st["mean"], mean1) and st["var"] == pytest.approx(0.5 * 10.0)
    assert lr == pytest.approx(0.06)  # r = 1 in the first two rounds: coeff 1
    lr, st = adaptive_lr(st, torch.tensor([2.0, 4.0]), 0.06, b, b, b)
    assert lr == pytest.approx(0.06)
    # a still model: the variance shrinks, the ratio < 1, the lr drops below lr0
    lr3, st3 = adaptive_lr(st, torch.tensor([2.0, 4.0]), 0.06, b, b, b)
    var_hat, prev_hat = st3["var"] / (1 - b**3), st["var"] / (1 - b**2)
    coeff = (b * st["coeff"] + (1 - b) * var_hat / prev_hat) / (1 - b**3)
    assert lr3 == pytest.approx(min(0.06, 0.06 * coeff)) and lr3 < 0.06
    # a jump (drift) raises the variance: the lr goes back up
    lr4, _ = adaptive_lr(st3, torch.tensor([9.0, -5.0]), 0.06, b, b, b)
    assert lr4 > lr3


def test_step_average_protocol():
    hist = [
        {"round": 1, "step": 1, "local_acc": 10.0, "global_acc_c0": 50.0},
        {"round": 2, "step": 1, "local_acc": 20.0, "global_acc_c0": 60.0},
        {"round": 3, "step": 2, "local_acc": 40.0, "global_acc_c0": 40.0},
        {"round": 4, "step": 3, "local_acc": 30.0, "global_acc_c0": 45.0, "drift_recall": 80.0},
        {"round": 5, "step": 4, "local_acc": 30.0, "global_acc_c0": 40.0, "drift_recall": 60.0},
    ]
    out = select_round(hist, "steps")
    assert out["local_acc"] == pytest.approx(30.0)  # (20 + 40 + 30 + 30) / 4: each step's last
    assert out["drift_recall"] == pytest.approx(70.0)  # over the steps that record it
    assert out["round"] == 5 and out["steps_averaged"] == 4
    assert out["last_global_acc_c0"] == 40.0 and out["forgetting"] == pytest.approx(20.0)


# ---------------------------------------------------------------------- early stopping


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_early_stopping_is_the_same_under_both_executors(tmp_path, vectorize):
    """In float64 (see F64_ATOL in fedshift/testing.py)."""
    with float64():
        _early_stopping_is_the_same_under_both_executors(tmp_path, vectorize)


def _early_stopping_is_the_same_under_both_executors(tmp_path, vectorize):
    cfg = validate_config(tiny_config(tmp_path))
    data = as_float64(build_scenario(cfg.scenario, cfg.seed))
    algo = make_algorithm(cfg, data, CPU)
    p, b = algo.ops.init(0)
    work = RoundWork.of(
        lr=0.05, momentum=0.0, weight_decay=0.0, batch_size=64, local_epochs=5, drop_last=True
    )
    views = [client_data(data, c) for c in data.clients[:3]]
    for stop, expect_stop in ((100.0, True), (None, False)):
        jobs = [(LocalTask([p], [b], phases=(Phase(stop_below=stop),)), v) for v in views]
        seq = list(SequentialExecutor().train(algo, jobs, work))
        bat = sorted(BatchedExecutor(2, vectorize).train(algo, jobs, work), key=lambda r: r.cid)
        per_epoch = views[0].num_train // 64
        for a, c in zip(seq, bat, strict=True):
            want = 2 * per_epoch if expect_stop else 5 * per_epoch  # a huge bar stops at epoch 2
            assert a.telemetry["steps"] == c.telemetry["steps"] == want
            for k in p:
                assert_close64(c.params[0][k], a.params[0][k], f"client {a.cid} {k}")


# ---------------------------------------------------------------------- the engine over time


@pytest.mark.parametrize(
    "algorithm, vectorize", [("feddaa", "vmap"), ("feddaa", "loop"), ("feddrift", "vmap")]
)
def test_drift_executors_agree_over_step_boundaries(tmp_path, algorithm, vectorize):
    cfg = timeline_config(tmp_path, algorithm)
    ex = (SequentialExecutor(), BatchedExecutor(3, vectorize))
    seq, bat = run_executors(cfg, ex)  # float64: see F64_ATOL in fedshift/testing.py
    assert len(seq.server["models"]) == len(bat.server["models"])
    for i, (ms, mb) in enumerate(zip(seq.server["models"], bat.server["models"], strict=True)):
        for k in ms["params"]:
            assert_close64(mb["params"][k], ms["params"][k], f"model {i} {k}")
    for hs, hb in zip(seq.history, bat.history, strict=True):
        assert hs["step"] == hb["step"] and hs.get("num_models") == hb.get("num_models")
    assert_history_same(seq, bat, ("local_acc",))


@pytest.mark.parametrize(
    "algorithm, stop_at",  # at a step's end, and in the middle of the next
    [("feddaa", 2), ("feddaa", 3), ("feddrift", 3)],
)
def test_kill_and_resume_across_a_step_boundary(tmp_path, algorithm, stop_at):
    assert_resume_equals_uninterrupted(timeline_config(tmp_path, algorithm, name="full"), stop_at)


@pytest.mark.parametrize(
    "algorithm, params",
    [
        ("feddaa", {}),
        # the code profile: the model count is the true one, test tasks carry ω
        ("feddaa", {"cluster_count": "truth", "test_omega": "carried"}),
        ("feddrift", {}),
        ("oracle", {}),
        ("flash", {}),
        ("afedavg", {}),
        ("fedrc", {"num_clusters": 2}),
    ],
)
def test_drift_methods_run_and_report_their_diagnostics(tmp_path, algorithm, params):
    cfg = timeline_config(tmp_path, algorithm, params)
    res = run_experiment(cfg)
    last = res.history[-1]
    assert last["step"] == 3
    # the clients learn their (drifting) tasks: above chance (10 digits), loss below uniform
    assert last["local_acc"] > 15 and last["train_loss"] < math.log(10), last
    assert "global_acc_c2@rotate(180)" in last
    if algorithm in ("feddaa", "feddrift"):
        # the logged precision and recall are the method's step-3 flags against the truth
        data = build_scenario(cfg.scenario, cfg.seed).at_step(3)
        algo = make_algorithm(cfg, data, CPU)
        state, _ = RunDir(res.run_dir).load_checkpoint(CPU)
        pairs = [(algo.drift_flag(state.clients.get(c.cid) or {}), c.drifted) for c in data.clients]
        pairs = [(bool(f), bool(t)) for f, t in pairs if f is not None]
        tp = sum(f and t for f, t in pairs)
        assert last["drift_precision"] == pytest.approx(100 * tp / max(1, sum(f for f, _ in pairs)))
        assert last["drift_recall"] == pytest.approx(100 * tp / max(1, sum(t for _, t in pairs)))
    if algorithm == "oracle" or params.get("cluster_count") == "truth":
        assert [h["num_models"] for h in res.history] == [2, 2, 3, 3, 3, 3]  # one per concept
    if algorithm == "oracle":
        assert last["ari_concept"] == pytest.approx(1.0)
    summary = select_round(res.history, "steps")
    assert summary["steps_averaged"] == 3 and "forgetting" in summary
    written = json.loads((res.run_dir / "summary.json").read_text())
    assert written["protocols"]["steps"]["steps_averaged"] == 3


def test_compare_of_a_timeline_reports_the_steps_protocol(tmp_path):
    from fedshift.studies.compare import compare

    res = compare(timeline_config(tmp_path, "fedavg"), ["fedavg", "oracle"])
    assert res.protocol == "steps"
    rows = {r["run"]: r for r in res.rows()}
    assert set(rows) == {"fedavg", "oracle"} and "forgetting" in rows["oracle"]
    want = select_round(res.histories["oracle"], "steps")["local_acc"]
    assert rows["oracle"]["local_acc"] == pytest.approx(want)
    out = res.files[0].parent
    assert "time steps" in (out / "comparison.md").read_text()
    assert (out / "tasks.png").stat().st_size > 1000


def test_carried_omega_restarts_when_clusters_are_added():
    from fedshift.algorithms.fedrc import FedRC

    client = {"omega": torch.tensor([0.7, 0.2, 0.1]), "cluster_ids": [0, 1, 2]}
    dropped = FedRC.live_omega(None, {"cluster_ids": [0, 2]}, client)
    assert torch.allclose(dropped, torch.tensor([0.875, 0.125]))
    added = FedRC.live_omega(None, {"cluster_ids": [0, 1, 2, 3]}, client)
    assert torch.allclose(added, torch.full((4,), 0.25))


# ---------------------------------------------------------------------- FedDAA's modules at work


def _feddaa_at_step(tmp_path, step: int, **params):
    """A FedDAA instance, its data at ``step`` and a server state from fresh models."""
    cfg = timeline_config(tmp_path, params=params)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, CPU)
    server = algo.init_server_state([algo.ops.init(i) for i in range(2)])
    return algo, data.at_step(step), server


def test_daa_clean_clients_train_on_previous_and_current_drifted_on_current(tmp_path):
    from fedshift.algorithms.base import RoundContext

    algo, data, server = _feddaa_at_step(tmp_path, 2)
    c = data.clients[0]
    view = client_data(data, c)
    ctx = RoundContext(3, step=2)
    clean = algo.client_task(server, {"drifted": False}, view, ctx)
    assert torch.equal(clean.train_idx, torch.cat([c.prev.train_idx, c.train_idx]))
    assert torch.equal(clean.y_train, torch.cat([c.prev.y_train, c.y_train]))
    assert clean.extras["gamma"].shape == (len(clean.train_idx), 2)  # E-step over both
    drifted = algo.client_task(server, {"drifted": True}, view, ctx)
    assert drifted.train_idx is None and drifted.extras["gamma"].shape[0] == c.num_train
    no_daa, _, _ = _feddaa_at_step(tmp_path, 2, daa=False)
    assert no_daa.client_task(server, {"drifted": False}, view, ctx).train_idx is None


def test_ncd_sets_the_model_count_growing_and_shrinking(tmp_path):
    from fedshift.algorithms.base import RoundContext

    algo, data, server = _feddaa_at_step(tmp_path, 2)
    rng = np.random.default_rng(0)

    def uploads(k):  # 8 clients' prototypes around k well-separated centres
        centres = rng.normal(scale=20.0, size=(k, 100))
        return {
            c: {"prototype": torch.tensor(centres[c % k] + rng.normal(size=100))} for c in range(8)
        }

    grown = algo.start_step(server, uploads(3), RoundContext(3, step=2))
    assert (
        grown["ncd_count"] == 3 and len(grown["models"]) == 3 and grown["cluster_ids"] == [0, 1, 2]
    )
    assert grown["models"][:2] == server["models"]  # the old ones first, a fresh one appended
    fresh = grown["models"][2]["params"]
    assert not all(torch.equal(fresh[n], server["models"][0]["params"][n]) for n in fresh)
    # cluster 1 held the least responsibility mass in the step that ended: it goes
    grown["gamma_mass"] = {0: torch.tensor([5.0, 0.5, 3.0]), 1: torch.tensor([4.0, 0.2, 1.0])}
    shrunk = algo.start_step(grown, uploads(2), RoundContext(5, step=3))
    assert shrunk["ncd_count"] == 2 and len(shrunk["models"]) == 2
    assert shrunk["models"][0] is grown["models"][0] and shrunk["models"][1] is grown["models"][2]
    # the ablation keeps the count; the code profile takes the true one
    fixed, _, _ = _feddaa_at_step(tmp_path, 2, ncd=False)
    assert len(fixed.start_step(server, uploads(3), RoundContext(3, step=2))["models"]) == 2
    told, _, _ = _feddaa_at_step(tmp_path, 2, cluster_count="truth")
    ups = {c: {**u, "concept": c % 3} for c, u in uploads(2).items()}
    assert len(told.start_step(server, ups, RoundContext(3, step=2))["models"]) == 3


def test_rdld_on_a_trained_model_flags_concept_changes_not_label_drift():
    """Prototypes of a real model (an MLP trained on digits): a client whose P(y) is redrawn
    from Dir(DP) at DP in FedDAA's Table 5 grid keeps its nearest centre; one whose concept
    changes (y -> 9-y) does not."""
    from fedshift.data.sources import load_dataset

    torch.manual_seed(0)
    raw = load_dataset("digits", None)
    x = torch.tensor(raw.x_train, dtype=torch.float32).flatten(1) / 255.0
    y = torch.tensor(raw.y_train).long()
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(15):
        for b in torch.randperm(len(y)).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[b]), y[b]).backward()
            opt.step()
    with torch.no_grad():
        logits = net(x)
    rng = np.random.default_rng(0)
    by_class = [np.flatnonzero(raw.y_train == c) for c in range(10)]

    def proto(alpha: float, concept: int) -> torch.Tensor:
        cls = rng.choice(10, size=150, p=rng.dirichlet(np.full(10, alpha)))
        idx = torch.tensor([rng.choice(by_class[c]) for c in cls])
        return data_prototype(logits[idx], y[idx] if concept == 0 else 9 - y[idx], 10)

    for alpha in (0.5, 1.0, 2.0):
        current = torch.stack([proto(alpha, k % 2) for k in range(20)])
        count, centres, _ = choose_cluster_count(current.numpy(), 9, seed=0)
        centres = torch.as_tensor(centres, dtype=torch.float32)
        assert count == 2
        label_drift = [detect_drift(proto(alpha, 0), proto(alpha, 0), centres) for _ in range(10)]
        real_drift = [detect_drift(proto(alpha, 1), proto(alpha, 0), centres) for _ in range(10)]
        assert not any(label_drift) and all(real_drift), alpha


def test_carried_test_omega_does_not_depend_on_eval_every(tmp_path):
    def run(every):
        cfg = validate_config(
            tiny_config(
                tmp_path,
                name=f"every{every}",
                scenario__concepts=["identity", "reverse"],
                scenario__mix={
                    "types": [
                        {"fraction": 0.5, "concepts": [0]},
                        {"fraction": 0.5, "concepts": [1]},
                    ]
                },
                algorithm={"name": "fedrc", "params": {"num_clusters": 2, "test_omega": "carried"}},
                train={"rounds": 6, "batch_size": 32, "lr": 0.05},
                eval={"every": every},
            )
        )
        return {h["round"]: h for h in run_experiment(cfg).history}

    every1, every3 = run(1), run(3)
    assert sorted(every3) == [3, 6]
    for r in (3, 6):
        assert every3[r]["global_acc_c1"] == every1[r]["global_acc_c1"]
        assert every3[r]["global_acc_c0"] == every1[r]["global_acc_c0"]


def test_the_last_round_of_every_step_is_evaluated(tmp_path):
    cfg = timeline_config(tmp_path, "fedavg", eval={"every": 3})
    res = run_experiment(cfg)
    assert [h["round"] for h in res.history] == [2, 3, 4, 6]  # step ends 2, 4, 6 and round 3
    assert [h["step"] for h in res.history] == [1, 2, 2, 3]
