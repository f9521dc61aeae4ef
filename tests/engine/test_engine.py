"""End-to-end runs on tiny scenarios: convergence, resume, run directory contents."""

import json
import resource

import pytest

from fedshift.config import validate_config
from fedshift.run.experiment import run_experiment
from fedshift.run.folder import RunDir
from tests.conftest import tiny_config


def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_fedavg_iid_reaches_centralised_accuracy(tmp_path):
    """FedAvg on IID synthetic data, trained to convergence, ends within a few points of
    centralised training (one client holding all the data) on the same test set."""
    common = {
        "train__rounds": 30,
        "eval__every": 30,
        "train__lr": 0.02,
        "scenario__dataset_options": {"n_train": 3000, "n_test": 1000, "dim": 16, "num_classes": 4},
        "scenario__test_clients": {"adapt_fraction": 0.0},
    }  # score all 1000 test samples
    central = validate_config(
        tiny_config(tmp_path, name="central", scenario__num_clients=1, **common)
    )
    fed = validate_config(tiny_config(tmp_path, name="fed", scenario__num_clients=10, **common))
    acc_c = run_experiment(central).history[-1]["global_acc"]
    acc_f = run_experiment(fed).history[-1]["global_acc"]
    assert acc_c > 60, f"centralised training itself failed ({acc_c:.1f}%)"
    assert abs(acc_f - acc_c) < 5, (acc_f, acc_c)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "local"])
def test_resume_equals_uninterrupted(tmp_path, algorithm):
    raw = tiny_config(
        tmp_path, algorithm={"name": algorithm}, train__rounds=4, train__participation=0.5
    )
    full = run_experiment(validate_config({**raw, "name": "full"}))
    part_cfg = validate_config({**raw, "name": "part", "train": {**raw["train"], "rounds": 2}})
    run_experiment(part_cfg)
    resumed_cfg = validate_config({**raw, "name": "part"})
    resumed = run_experiment(resumed_cfg, run_dir=tmp_path / "runs" / "part", resume=True)
    assert [h["round"] for h in resumed.history] == [1, 2, 3, 4]
    for a, b in zip(full.history, resumed.history, strict=True):
        for key in ("global_acc", "local_acc", "train_acc", "train_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), key


def test_run_directory_contents(tmp_path):
    cfg = validate_config(
        tiny_config(tmp_path, output={"dir": str(tmp_path / "runs"), "plots": True})
    )
    rss_before = peak_rss_mb()
    res = run_experiment(cfg)
    rss_after = peak_rss_mb()
    names = {p.name for p in res.run_dir.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt", "curves.png"} <= names
    assert not [n for n in names if n.startswith(".")], "temp files left behind"
    lines = (res.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1, 2, 3]
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert set(summary["protocols"]) == {"last", "best", "best_train", "best_gm", "top5"}
    assert summary["weights"] == "trained from scratch"
    assert summary["executor"] == "batched"
    # this process's peak RSS (MB) when the run ended: between the peaks before and after it
    assert rss_before - 0.1 <= summary["peak_host_rss_mb"] <= rss_after + 0.1, summary
    assert summary["protocols"]["last"]["round"] == 3
    assert RunDir(res.run_dir).read_metrics()[0]["round"] == 1


def test_existing_run_is_not_overwritten(tmp_path):
    from fedshift.core.errors import FedshiftError

    cfg = validate_config(tiny_config(tmp_path, train__rounds=1))
    run_experiment(cfg)
    with pytest.raises(FedshiftError, match="already holds a run"):
        run_experiment(cfg)


def test_local_clients_keep_their_own_models(tmp_path):
    """Under label skew, Local's own-test-split accuracy beats the average of local models."""
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm={"name": "local"},
            train__rounds=5,
            scenario__label_shift={"kind": "pathological", "classes_per_client": 1},
        )
    )
    h = run_experiment(cfg).history[-1]
    assert h["local_acc"] > 95 and h["global_acc"] < 60
