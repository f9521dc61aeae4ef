"""The drift table of a comparison: each method's reactions (cluster changes) and local accuracy
scored against the scenario's true concept per client and round."""

from __future__ import annotations

import numpy as np
import pytest

from fedshift.config import validate_config
from fedshift.reporting.drift_report import drift_markdown, run_arrays, run_drift
from tests.conftest import tiny_config

# two clients, six rounds; client 1 changes concept at round 4
TRUTH = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]])


def record(rnd, acc, clusters=None):
    rec = {"round": rnd, "local_acc": acc}
    if clusters is not None:
        rec["clusters"] = clusters
    return rec


def test_a_cluster_change_two_rounds_after_the_drift_is_a_delay_of_two():
    hist = [
        record(1, 80.0, [0, 0]),
        record(2, 80.0, [0, 0]),
        record(3, 80.0, [0, 0]),
        record(4, 50.0, [0, 0]),
        record(5, 70.0, [0, 0]),
        record(6, 79.0, [0, 1]),  # client 1 moves to its own cluster at round 6
    ]
    out = run_drift(hist, TRUTH)
    assert (out["changes"], out["detected"], out["detection_rate"]) == (1, 1, 1.0)
    assert out["mean_delay"] == 2.0
    assert out["false_alarms_per_100"] == 0.0
    # level before the change: 80; back within 2 points (>= 78) at round 6, 2 rounds after 4
    assert out["mean_recovery"] == 2.0
    assert out["accuracy_auc"] == pytest.approx((80 * 2 + 65 + 60 + 74.5) / 5)


def test_a_cluster_change_without_drift_is_a_false_alarm():
    hist = [record(r, 80.0, [0, 0]) for r in (1, 2, 3, 4)]
    hist += [record(5, 80.0, [1, 0]), record(6, 80.0, [1, 0])]  # client 0 moves, never drifted
    out = run_drift(hist, TRUTH)
    assert out["detected"] == 0 and out["missed"] == 1
    assert out["false_alarms_per_100"] == pytest.approx(100 * 1 / 12)


def test_a_method_without_assignments_has_no_detection_measures():
    hist = [record(r, 70.0) for r in range(1, 7)]
    out = run_drift(hist, TRUTH)
    assert out["detection_rate"] is None and out["mean_delay"] is None
    assert out["false_alarms_per_100"] is None
    assert out["accuracy_auc"] == pytest.approx(70.0)
    assert "| a | 70.00 | n/a | n/a | n/a |" in drift_markdown([{"run": "a", **out}])


def test_unevaluated_rounds_are_unknown_not_zero():
    assign, acc = run_arrays([record(2, 60.0, [1, 0]), record(4, 65.0, [1, 1])], 2, 5)
    assert assign.tolist() == [[-1, 1, -1, 1, -1], [-1, 0, -1, 1, -1]]
    assert np.isnan(acc[[0, 2, 4]]).all() and acc[1] == 60.0 and acc[3] == 65.0


def test_a_drift_comparison_scores_the_oracle_and_fedavg(tmp_path):
    """The Oracle keeps one model per true concept: it reacts to every concept change at once
    and never without one; FedAvg has no clusters to react with."""
    from fedshift.studies.compare import compare

    raw = tiny_config(
        tmp_path,
        scenario={
            "dataset": "digits",
            "num_clients": 10,
            "concepts": ["identity", "reverse"],
            "timeline": {
                "rounds_per_step": 2,
                "assignment": "switch",
                "steps": [{"concepts": [0, 1]}, {"concepts": [0, 1], "switch": 0.4}],
            },
        },
        model={"name": "lenet_small"},
        train={"batch_size": 32, "lr": 0.05},
    )
    res = compare(validate_config(raw), ["fedavg", "oracle"])
    rows = {r["run"]: r for r in res.drift}
    assert rows["oracle"]["changes"] == 4  # 40% of 10 clients switch at round 3
    assert (rows["oracle"]["detection_rate"], rows["oracle"]["mean_delay"]) == (1.0, 0.0)
    assert rows["oracle"]["false_alarms_per_100"] == 0.0
    assert rows["fedavg"]["detection_rate"] is None
    assert (res.out_dir / "drift.md").read_text().count("| oracle |") == 1
    assert (res.out_dir / "drift.png") in res.files and (
        res.out_dir / "drift.png"
    ).stat().st_size > 5000


def test_per_client_accuracy_and_onsets_score_each_client_from_its_own_drift():
    """With ``local_acc_clients`` recovery is each client's; with onsets a drift that changes
    no concept (client 0 at round 3) is recovered from too, and still not a detection."""
    accs = [[80, 80], [80, 80], [60, 80], [70, 80], [79, 40], [79, 79]]
    hist = [{"round": r + 1, "local_acc": sum(a) / 2, "local_acc_clients": a}
            for r, a in enumerate(accs)]  # fmt: skip
    onsets = np.zeros(TRUTH.shape, bool)
    onsets[0, 2] = onsets[1, 3] = True  # client 0 at round 3, client 1 (its change) at 4
    assign, acc = run_arrays(hist, 2, 6)
    assert assign is None and acc.shape == (2, 6) and acc[1, 4] == 40
    out = run_drift(hist, TRUTH, onsets=onsets)
    # client 0: 80 -> 60 at round 3, back to >= 78 at round 5 (2 rounds); client 1: its level
    # is 80, it dips at round 5 and is back at round 6: 80 at round 4 is 0 rounds after 4
    assert out["onsets"] == 2 and out["changes"] == 1 and out["detected"] is None
    assert out["mean_recovery"] == pytest.approx((2 + 0) / 2)
    plain = run_drift(hist, TRUTH)  # concept changes only: client 1's
    assert plain["onsets"] == 1 and plain["mean_recovery"] == 0


def test_drift_bench_rows_and_their_configs():
    from fedshift.config import load_config
    from fedshift.studies.papers.drift_bench import DRIFT_BENCH, KINDS, METHODS
    from fedshift.studies.reproduce import plan_table

    base = load_config("configs/drift/bench.yaml")
    jobs = plan_table(DRIFT_BENCH, "fmnist", base, seeds=2)
    assert len(jobs) == 2 * (len(KINDS) * len(METHODS) + 6)  # + FedDAA, FedDrift check5 x 3
    for job in jobs:
        kind = job.label.rsplit("[", 1)[1].rstrip("]")
        drift = job.cfg.scenario.drift.model_dump(exclude_none=True)
        want = KINDS[kind]
        assert [e["kind"] for e in drift["events"]] == [e["kind"] for e in want["events"]]
        assert drift["start"] == want.get("start", [0])
        assert job.cfg.train.rounds == 30 and job.cfg.eval.every == 1
    check5 = [j for j in jobs if "check5" in j.label]
    assert {j.cfg.algorithm.params["check_every"] for j in check5} == {5}
