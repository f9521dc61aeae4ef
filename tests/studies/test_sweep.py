"""`fedshift sweep`: axes from comma-separated overrides, a grid of settings x seeds as resumable
runs, mean ± std per setting (checked against the runs' own metrics.jsonl), the best setting,
reuse on a second call, one-line errors, and the same numbers when the runs are Ray tasks.

One local sweep (2 learning rates x 2 seeds, 3 rounds) and one local Ray instance (2 CPUs, as
CI has) serve the module.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedshift import cli
from fedshift.config.grid import Axis, parse_grid, split_values
from fedshift.core.errors import ConfigError, DatasetNotFoundError, DivergedError, UnknownNameError
from fedshift.studies.sweep import plan_sweep, slug
from tests.conftest import require_extra, tiny_config

LRS, SEEDS = ("0.02", "0.3"), (0, 1)
GRID = [f"train.lr={','.join(LRS)}", f"seed={','.join(map(str, SEEDS))}"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread (as each Ray task has), no hand-offs on a busy CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(root)))
    return path


def sweep(*args: str):
    """`fedshift sweep ...` in this process; stdout and stderr apart."""
    return CliRunner().invoke(cli.app, ["sweep", *args])


@pytest.fixture(scope="module")
def local(config_file):
    res = sweep(str(config_file), *GRID)
    assert res.exit_code == 0, res.output
    return config_file.parent / "runs" / "tiny-sweep", res.stdout


def last_metric(run_dir: Path, key: str = "global_acc") -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])[key]


# ---------------------------------------------------------------------- the grid


def test_commas_make_axes_and_yaml_lists_stay_fixed():
    grid = parse_grid(
        [
            "train.lr=0.01,0.03",
            "seed=0,1,2",
            "algorithm.name=fedavg,fedprox",
            "scenario.concepts=[identity,reverse]",
            "scenario.mix={types: [{fraction: 1.0, concepts: [0, 1]}]}",
            "model.name='mlp,x'",
            "scenario.label_shift.alpha=[0.1],[0.5, 1]",
        ]
    )
    assert grid.axes == (
        Axis("train.lr", ("0.01", "0.03")),
        Axis("algorithm.name", ("fedavg", "fedprox")),
        Axis("scenario.label_shift.alpha", ("[0.1]", "[0.5, 1]")),
    )
    assert grid.seeds == (0, 1, 2)
    assert grid.fixed == (
        "scenario.concepts=[identity,reverse]",
        "scenario.mix={types: [{fraction: 1.0, concepts: [0, 1]}]}",
        "model.name='mlp,x'",
    )
    settings = grid.settings()  # every combination, the last axis changing fastest
    assert len(settings) == 8 and settings[1][2] == ("scenario.label_shift.alpha", "[0.5, 1]")
    assert settings[2][1] == ("algorithm.name", "fedprox") and settings[4][0][1] == "0.03"
    assert split_values("a, [b, {c: d, e: f}], 'g,h'") == ["a", "[b, {c: d, e: f}]", "'g,h'"]
    assert parse_grid(["seed=4"]).seeds == (4,) and not parse_grid(["seed=4"]).axes


def test_slugs_are_file_names_and_distinct():
    assert slug((("train.lr", "0.01"), ("algorithm.name", "fedavg"))) == "lr=0.01,name=fedavg"
    assert slug(()) == "base"
    a, b = slug((("scenario.concepts", "[a,b]"),)), slug((("scenario.concepts", "[a b]"),))
    assert a != b and all(c.isalnum() or c in "=._+-" for c in a + b)
    # two axes ending alike keep their whole keys
    both = (("train.lr", "0.1"), ("algorithm.params.lr", "0.2"))
    assert slug(both) == "train.lr=0.1,algorithm.params.lr=0.2"


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["train.lr=0.1,"], "empty value"),
        (["seed=0,a"], "seed=a"),
        (["train.lr=[0.1,0.2"], "unbalanced"),
        (["train.lr=0.1,0.10"], "given twice"),
        (["train.lr=0.1", "train.lr=0.2,0.3"], "given twice"),
        (["output.dir=a,b"], "cannot be an axis"),
        (["train.lr"], "key=value"),
    ],
)
def test_bad_axes_are_one_line_errors(overrides, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        parse_grid(overrides)
    assert "\n" not in str(err.value)


def test_every_run_is_validated_before_anything_trains(config_file, tmp_path):
    grid = parse_grid(["train.lr=0.1,-1", f"output.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"setting train.lr=-1: config: train.lr"):
        plan_sweep(config_file, grid)
    assert not list(tmp_path.rglob("*"))  # not even the sweep's folder
    jobs = plan_sweep(config_file, parse_grid(["train.lr=0.1,0.2", "seed=3,4"])).jobs
    assert [(j.cfg.train.lr, j.cfg.seed, j.cfg.name) for j in jobs] == [
        (0.1, 3, "lr=0.1/seed3"),
        (0.1, 4, "lr=0.1/seed4"),
        (0.2, 3, "lr=0.2/seed3"),
        (0.2, 4, "lr=0.2/seed4"),
    ]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train.lr=0.1,-1"], "train.lr"),
        (["seed=0,a"], "seed=a"),
        (["--protocol", "worst"], "worst"),
    ],
)
def test_cli_bad_override_exits_2_with_one_line(config_file, args, needle):
    res = sweep(str(config_file), *args, "name=never")
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.output
    runs = config_file.parent / "runs" / "never-sweep"
    assert not list(runs.rglob("metrics.jsonl"))  # nothing trained


# ---------------------------------------------------------------------- a 2 x 2 sweep


def expected(out: Path) -> dict[str, tuple[float, float]]:
    """Mean and population std over seeds of each setting's last global_acc, from the runs'
    own metrics.jsonl."""
    values = {lr: [last_metric(out / f"lr={lr}" / f"seed{s}") for s in SEEDS] for lr in LRS}
    return {lr: (float(np.mean(v)), float(np.std(v))) for lr, v in values.items()}


def test_sweep_reports_mean_std_per_setting_and_the_best(local):
    out, stdout = local
    want = expected(out)
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["protocol"] == "last" and doc["metric"] == "global_acc"
    assert doc["axes"] == {"train.lr": list(LRS)} and doc["seeds"] == list(SEEDS)
    got = {s["setting"]["train.lr"]: s for s in doc["settings"]}
    for lr, (mean, std) in want.items():
        assert got[lr]["mean"] == pytest.approx(mean) and got[lr]["std"] == pytest.approx(std)
        assert got[lr]["seeds"] == 2 and got[lr]["diverged"] == 0
        row = next(x for x in stdout.splitlines() if f" {lr} " in x and "±" in x)
        assert f"{mean:.2f} ±{std:.2f}" in row
    best = max(LRS, key=lambda lr: (want[lr][0], -LRS.index(lr)))
    line = (
        f"best under protocol last on metric global_acc: train.lr={best} "
        f"({want[best][0]:.2f} ±{want[best][1]:.2f}, 2 seeds)"
    )
    assert line in " ".join(stdout.split())  # the console may wrap a long line
    assert doc["best"]["setting"] == {"train.lr": best}
    md = (out / "sweep.md").read_text()
    assert line in md and "| train.lr | global_acc (mean ±std) |" in md
    assert "highest mean over finished seeds of global_acc at the last evaluated round" in md


def test_the_same_sweep_again_reuses_the_finished_runs(local, config_file):
    out, stdout = local
    ckpts = sorted(out.rglob("checkpoint.pt"))
    assert len(ckpts) == 4
    before = {p: p.stat().st_mtime_ns for p in ckpts}
    res = sweep(str(config_file), *GRID)
    assert res.exit_code == 0, res.output
    assert {p: p.stat().st_mtime_ns for p in ckpts} == before  # nothing trained again
    best = next(x for x in stdout.splitlines() if x.startswith("best under"))
    assert best in res.stdout
    # another protocol ranks the same runs without training them either (the Python API)
    import fedshift

    rep = fedshift.sweep_grid(config_file, GRID, protocol="best_train", metric="local_acc")
    assert {p: p.stat().st_mtime_ns for p in ckpts} == before
    for summary, lr in zip(rep.settings, LRS, strict=True):
        picked = []
        for s in SEEDS:
            rows = (out / f"lr={lr}" / f"seed{s}" / "metrics.jsonl").read_text().splitlines()
            rows = [json.loads(x) for x in rows]
            picked.append(max(rows, key=lambda r: (r["train_acc"], r["round"]))["local_acc"])
        assert summary.value == pytest.approx((np.mean(picked), np.std(picked), 2))
    assert rep.best_line.startswith("best under protocol best_train on metric local_acc: train.lr=")


def test_diverged_seeds_are_counted_not_averaged_and_ties_go_to_the_earlier_setting(tiny):
    from fedshift.studies.jobs import Outcome
    from fedshift.studies.sweep import SweepRun, best_setting, summarise_sweep

    cfg = tiny()

    def out(lr, seed, acc):
        job = SweepRun((("train.lr", lr),), f"lr={lr}", seed, cfg)
        if acc is None:
            return Outcome(job, "diverged", [{"round": 1, "global_acc": 10.0}], diverged_round=2)
        hist = [{"round": 1, "global_acc": 0.0, "elapsed_s": 30}, {"round": 2, "global_acc": acc}]
        hist[-1]["elapsed_s"] = 60
        return Outcome(job, "finished", hist)

    outs = [out("0.1", 0, 50.0), out("0.1", 1, 70.0), out("1", 0, 60.0), out("1", 1, None)]
    a, b = summarise_sweep(outs, "last", "global_acc")
    assert a.value == (60.0, 10.0, 2) and a.diverged == 0 and a.minutes == 1.0
    assert b.value == (60.0, 0.0, 1) and b.diverged == 1 and b.runs[1]["diverged_round"] == 2
    assert best_setting([a, b]) is a and best_setting([b, a]) is b  # a tie: the earlier one
    assert summarise_sweep(outs, "best", "global_acc")[0].rounds == [2]


# ---------------------------------------------------------------------- on Ray


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray = require_extra("ray", "ray")
    # Ray's workers inherit this process's environment when Ray starts: the tests' cache
    os.environ.setdefault("FEDSHIFT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # as ray_session sets it
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def test_the_sweep_as_ray_tasks_gives_the_same_numbers(local, local_ray, config_file, tmp_path):
    out, _ = local
    res = sweep(str(config_file), *GRID, f"output.dir={tmp_path}", "--ray", "--cpus-per-run", "1")
    assert res.exit_code == 0, res.output
    on_ray = tmp_path / "tiny-sweep"
    for lr in LRS:
        for s in SEEDS:
            for key in ("global_acc", "local_acc", "train_loss"):
                here, there = (last_metric(d / f"lr={lr}" / f"seed{s}", key) for d in (out, on_ray))
                assert there == pytest.approx(here, rel=1e-9), (lr, s, key)
    assert "lr=0.3 seed=1: done" in res.stdout  # per-run lines came back from the tasks
    doc = json.loads((on_ray / "sweep.json").read_text())
    for setting, (lr, (mean, std)) in zip(doc["settings"], expected(out).items(), strict=True):
        assert setting["setting"] == {"train.lr": lr}
        assert (setting["mean"], setting["std"]) == pytest.approx((mean, std))
    assert doc["best"]["setting"] == json.loads((out / "sweep.json").read_text())["best"]["setting"]


def test_ray_options_are_checked(config_file, local_ray):
    res = sweep(str(config_file), *GRID, "--gpus-per-run", "0.5")
    assert res.exit_code == 2 and "add --ray" in res.stderr
    res = sweep(str(config_file), *GRID, "--ray", "--jobs", "2")
    assert res.exit_code == 2 and "--jobs" in res.stderr
    res = sweep(str(config_file), *GRID, "--ray", "--gpus-per-run", "1", "name=nogpu")
    assert res.exit_code == 2 and "--gpus-per-run 1: the Ray cluster has 0 GPUs" in res.stderr


def test_a_user_error_inside_a_ray_task_is_one_line(config_file, local_ray, tmp_path):
    # augmentation needs images: the run itself (not the config) refuses synthetic vectors
    res = sweep(str(config_file), "train.augment=crop_flip", f"output.dir={tmp_path}", "--ray")
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "train.augment=crop_flip needs images" in lines[0]


@pytest.mark.parametrize(
    "err",
    [
        DatasetNotFoundError("fmnist: looked in /a"),
        UnknownNameError("dataset", "x", ["b", "a"]),
        DivergedError(3, "a NaN loss", 0.1),
    ],
)
def test_user_errors_survive_the_trip_back_from_a_worker(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)


def test_reproduce_runs_on_ray_too(local_ray, tmp_path, monkeypatch):
    from tests.studies.conftest import make_table, reproduce

    _, out = make_table(tmp_path, monkeypatch)
    kw = dict(ray=True, ray_address=None, gpus_per_run=None, cpus_per_run=None)
    assert reproduce(only="FedAvg", **kw) in (None, 0)
    metrics = list(out.glob("fedavg/*/metrics.jsonl"))
    assert len(metrics) == 1 and len(metrics[0].read_text().splitlines()) == 2  # both rounds
    run = out / "fedavg" / "lr0.05-seed0"
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    row = next(x for x in (run.parents[1] / "table.md").read_text().splitlines() if "FedAvg" in x)
    assert "diverged" not in row and "| 0.05 |" in row
