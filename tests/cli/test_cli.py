"""CLI: config errors exit 2 with one line and no traceback; commands produce their outputs."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli, tiny_config, write_config


def fedshift(*args: str, cwd: Path):
    return run_cli(*args, cwd=cwd)


@pytest.fixture
def cfg_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    return path


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.lr=-1", "train.lr"),
        ("train.participation=1.5", "train.participation"),
        ("train.participation=0", "train.participation"),
        ("scenario.label_shift.alpha=0", "scenario.label_shift.alpha"),
        ("scenario.num_clients=5000", "num_clients"),
        ("scenario.dataset=imagenet-1k", "unknown dataset"),
        ("algorithm.name=fedmagic", "unknown algorithm"),
        ("algorithm.params={mu: 0.1}", "algorithm.params.mu"),
        ("trian.rounds=3", "trian"),
        ("scenario.feature_shift.styles=[warp_drive]", "warp_drive"),
        ("model.name=vgg99", "unknown model"),
    ],
)
def test_config_errors_exit_2_with_one_line(tmp_path, cfg_file, override, needle):
    extra = []
    if "styles" in override:  # feature styles only matter where a client type wants one
        extra = [
            "scenario.dataset=digits",
            "scenario.dataset_options={}",
            "scenario.mix={types: [{fraction: 1.0, feature: true}]}",
        ]
    res = fedshift("run", str(cfg_file), override, *extra, cwd=tmp_path)
    assert res.returncode == 2, res.stderr + res.stdout
    assert "Traceback" not in res.stderr
    lines = [x for x in res.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1, res.stderr
    assert needle in lines[0], lines[0]


def test_missing_config_file(tmp_path):
    res = fedshift("run", "nope.yaml", cwd=tmp_path)
    assert res.returncode == 2 and "not found" in res.stderr and "Traceback" not in res.stderr


def test_run_and_report(tmp_path, cfg_file):
    res = fedshift("run", str(cfg_file), "train.rounds=2", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "global acc" in res.stdout
    run_dir = tmp_path / "runs" / "tiny"
    rep = fedshift(
        "report",
        str(run_dir),
        "--protocol",
        "last",
        "--markdown",
        str(tmp_path / "t.md"),
        cwd=tmp_path,
    )
    assert rep.returncode == 0, rep.stderr
    assert "| tiny |" in (tmp_path / "t.md").read_text()
    again = fedshift("run", str(cfg_file), cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr


def test_compare_writes_table_and_plot(tmp_path, cfg_file):
    res = fedshift(
        "compare",
        str(cfg_file),
        "--algorithms",
        "fedavg,fedprox,local",
        "train.rounds=2",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    out = tmp_path / "runs" / "tiny"
    table = (out / "comparison.md").read_text()
    for a in ("fedavg", "fedprox", "local"):
        assert f"| {a} |" in table
    assert (out / "comparison.png").stat().st_size > 1000


def test_scenario_command(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg["scenario"] = {
        "dataset": "digits",
        "num_clients": 8,
        "concepts": ["identity", "reverse"],
        "feature_shift": {"styles": ["fog"]},
        "mix": {
            "types": [
                {"fraction": 0.5, "concepts": [0, 1]},
                {"fraction": 0.5, "concepts": [0, 1], "feature": True},
            ]
        },
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = fedshift("scenario", str(path), "--out", str(tmp_path / "s.png"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "fog/" in res.stdout and "test-only" in res.stdout
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert "leakage audit" in res.stdout and "single-model bound" in res.stdout


def test_scenario_command_prints_the_leak_of_the_authors_resplit(tmp_path):
    cfg = tiny_config(tmp_path, train__rounds=2)
    cfg["scenario"] = {
        "dataset": "digits",
        "num_clients": 6,
        "label_shift": {"kind": "iid"},
        "concepts": ["identity", "reverse"],
        "test_clients": {"enabled": False},
        "timeline": {
            "rounds_per_step": 1,
            "split": "per_load",
            "steps": [{"concepts": [0, 1]}, {"concepts": [0, 1]}],
        },
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = fedshift("scenario", str(path), "--out", str(tmp_path / "t.png"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = [x for x in res.stdout.splitlines() if x.strip().startswith("│") and "│" in x[1:]]
    leak = {r.split("│")[1].strip(): float(r.split("│")[2]) for r in rows[-2:]}
    assert set(leak) == {"1", "2"} and leak["2"] > 50  # step 2 tests step 1's training images


@pytest.mark.signals
def test_killed_run_resumes_to_the_same_metrics(tmp_path):
    """SIGTERM mid-run exits 130 with completed rounds saved; --resume ends like a clean run."""
    import json
    import os
    import signal
    import time

    def write(name: str) -> Path:
        cfg = tiny_config(
            tmp_path,
            name=name,
            train__rounds=12,
            train__participation=0.5,
            scenario__dataset_options={
                "n_train": 6000,
                "n_test": 400,
                "dim": 128,
                "num_classes": 4,
            },
        )
        cfg["model"]["width"] = 256  # rounds long enough (~1 s) to be interrupted mid-run
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    proc = subprocess.Popen(
        [sys.executable, "-m", "fedshift.cli", "run", str(write("killed"))],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "runs" / "killed" / "metrics.jsonl"
    deadline = time.time() + 900  # generous: a machine busy with other work is slow to start
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    done = len(metrics.read_text().splitlines())
    assert 3 <= done < 12, "the run was not interrupted mid-way"

    res = fedshift("run", "--resume", str(tmp_path / "runs" / "killed"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    clean = fedshift("run", str(write("clean")), cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    rows = [
        [json.loads(x) for x in (tmp_path / "runs" / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("killed", "clean")
    ]
    assert [r["round"] for r in rows[0]] == list(range(1, 13))
    for a, b in zip(*rows, strict=True):
        for key in ("global_acc", "local_acc", "train_acc", "train_loss"):
            assert a[key] == b[key], (a["round"], key)


def test_bench_command(tmp_path):
    out = tmp_path / "b.json"
    res = fedshift(
        "bench",
        "--device",
        "cpu",
        "--models",
        "fmnist_cnn",
        "--clients",
        "2",
        "--per-client",
        "128",
        "--repeats",
        "1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    import json

    rows = json.loads(out.read_text())
    assert [r["loss"] for r in rows] == ["FedAvg", "K=3 weighted"]
    assert all(
        r["central_sps"] > 0 and r["batched_sps"] > 0 and r["sequential_sps"] > 0 for r in rows
    )
    for r in rows:  # the plain-PyTorch limit is measured and the ratios are against it
        assert r["plain_sps"] > 0
        assert r["batched_over_plain"] == pytest.approx(r["batched_sps"] / r["plain_sps"], abs=2e-3)
    assert "plain PyTorch (p)" in res.stdout
    bad = fedshift("bench", "--models", "vgg", cwd=tmp_path)
    assert bad.returncode == 2 and "unknown 'vgg'" in bad.stderr


def test_report_names_runs_apart_by_their_shortest_distinct_tails():
    from pathlib import Path

    from fedshift.reporting.tables import run_names

    a, b, c = Path("s/lr=0.1/seed1"), Path("s/lr=0.3/seed1"), Path("x/other")
    assert run_names([a, b, c]) == {a: "lr=0.1/seed1", b: "lr=0.3/seed1", c: "x/other"}
    assert run_names([c]) == {c: "other"}


def test_export_refuses_a_used_folder_and_overwrite_replaces_the_old_export(tmp_path, cfg_file):
    out = tmp_path / "out"
    assert fedshift("export", cfg_file, out, cwd=tmp_path).returncode == 0  # 6 clients
    assert sorted(p.name for p in out.iterdir()) == [f"client_{i}" for i in range(6)]
    res = fedshift("export", cfg_file, out, "scenario.num_clients=4", cwd=tmp_path)
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "--overwrite" in lines[0], res.stderr
    (out / "notes.txt").write_text("mine")  # not an export's: kept
    res = fedshift("export", cfg_file, out, "scenario.num_clients=4", "--overwrite", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [*(f"client_{i}" for i in range(4)), "notes.txt"]  # no client_4, client_5
    for folder in out.glob("client_*"):
        assert folder.stat().st_mode & 0o777 == 0o700
        for name in ("train.npz", "test.npz", "client.json"):
            assert (folder / name).stat().st_mode & 0o777 == 0o600, folder / name


def test_export_to_a_path_that_cannot_be_a_folder_is_one_line(tmp_path, cli):
    cfg = write_config(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    line = cli("export", cfg, "afile/out").error()
    assert "'afile/out' cannot be created or written (afile is a file)" in line, line
    assert "give OUT a new or empty folder that you can write to" in line, line
    line = cli("export", cfg, "afile").error()
    assert "'afile' is a file, not a folder" in line and "give OUT" in line, line


def test_export_into_a_read_only_folder_is_one_line(tmp_path, cli, read_only_dir):
    cfg = write_config(tmp_path)
    line = cli("export", cfg, "ro/out").error()
    assert "cannot be created or written (Permission denied)" in line, line
