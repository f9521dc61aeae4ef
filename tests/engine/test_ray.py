"""executor=ray: the same models and metrics as the batched executor; kill and resume; errors.

One local Ray instance (2 CPUs, as CI has) serves the module; every run starts and removes its
own actors in it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedshift.config import validate_config
from fedshift.core.errors import FedshiftError
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.ray_executor import RayExecutor, portable, shards
from fedshift.engine.metrics import TIMING_KEYS
from fedshift.engine.ray_session import RaySettings, check_reachable, ray_session, require_ray
from fedshift.engine.simulator import Simulator
from fedshift.engine.trees import float_tensors, move
from fedshift.run.experiment import make_algorithm, make_executor, sim_config
from tests.conftest import (
    as_float64,
    assert_close64,
    float64,
    require_extra,
    run_cli,
    tiny_config,
)

ray = require_extra("ray", "ray")  # scripts/setup.sh installs it; on CI its absence fails


@pytest.fixture(scope="module")
def local_ray():
    with ray_session(RaySettings(num_cpus=2)):  # the session fedshift would start
        yield ray


def three_concepts(tmp_path, algorithm, **over):
    """A tiny scenario with 3 contradicting concepts and half the clients sampled per round."""
    raw = tiny_config(
        tmp_path,
        algorithm=algorithm,
        scenario__num_clients=8,
        scenario__label_shift={"kind": "dirichlet", "alpha": 1.0},
        scenario__concepts=["identity", "reverse", "shift:1"],
        scenario__mix={
            "types": [{"fraction": 0.5, "concepts": [0]}, {"fraction": 0.5, "concepts": [1, 2]}]
        },
        train__participation=0.5,
        ray={"actors": 2},
        **over,
    )
    return validate_config(raw)


def run_with(cfg, executor_name, cast=None):
    data = build_scenario(cfg.scenario, cfg.seed)
    data = data if cast is None else cast(data)
    cfg = cfg.model_copy(update={"executor": executor_name})
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    executor = make_executor(cfg, algo, data)
    sim = Simulator(algo, data, sim_config(cfg), executor)
    if isinstance(executor, RayExecutor):
        with executor:
            return sim.run(), executor
    return sim.run(), executor


FEDNH = {
    "algorithm": {"name": "fednh"},
    "scenario__test_clients": {"enabled": True, "adapt_fraction": 0.0},
    "model": {"name": "mlp", "width": 32, "head_bias": False},
    "eval": {"every": 1, "personal": "active"},
}


@pytest.mark.parametrize(
    "over",
    [
        {"algorithm": {"name": "fedavg"}},
        {"algorithm": {"name": "fedrc", "params": {"num_clusters": 3}}},
        FEDNH,
    ],
    ids=["fedavg", "fedrc-k3", "fednh"],
)
def test_ray_gives_the_batched_executors_models_and_metrics(tmp_path, local_ray, over):
    over = dict(over)
    cfg = three_concepts(tmp_path, over.pop("algorithm"), **over)
    with float64():  # the actors take the driver's dtype; see F64_ATOL in fedshift/testing.py
        bat, _ = run_with(cfg, "batched", as_float64)
        ray_state, executor = run_with(cfg, "ray", as_float64)
    assert len(executor.timings) >= cfg.train.rounds  # every round went through the actors
    a, b = list(float_tensors(bat.server)), list(float_tensors(ray_state.server))
    assert len(a) == len(b) > 0 and a[0].dtype == torch.float64
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert_close64(y, x, f"server tensor {i}")
    for ha, hb in zip(bat.history, ray_state.history, strict=True):
        assert set(ha) == set(hb)
        for key, value in ha.items():
            if key in TIMING_KEYS:
                continue
            if isinstance(value, float):
                assert hb[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
            else:
                assert hb[key] == value, key


def test_shards_are_contiguous_and_cover_the_jobs():
    assert [list(r) for r in shards(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(r) for r in shards(2, 4)] == [[0], [1]]
    assert sum(len(r) for r in shards(37, 3)) == 37


def test_portable_jobs_drop_the_data_and_move_keeps_shared_tensors_shared(tiny):
    cfg = tiny()
    data = build_scenario(cfg.scenario, cfg.seed)
    shared = torch.zeros(3)
    view = client_data(data, data.clients[0])
    jobs = portable([({"w": shared}, view), ({"w": shared}, view)])
    assert all(v.inputs is None for _, v in jobs)
    moved = move(jobs, torch.device("meta"))
    assert moved[0][0]["w"] is moved[1][0]["w"]  # one tensor, as the batched executor needs
    assert moved[0][0]["w"].device.type == "meta" and moved[0][1].train_idx.device.type == "meta"


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                kids = [int(x) for x in fh.read().split()]
        except OSError:
            continue
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_ray_run_resumes_to_the_same_metrics(tmp_path):
    """SIGKILL of a Ray run's training process (the driver, as the out-of-memory killer would
    send it) is reported in one line with the folder to resume; --resume under Ray ends with
    an uninterrupted batched run's metrics (kept momentum, one client's in memory: the
    checkpoint's client states come back from its store files)."""

    def write(name: str, executor: str) -> Path:
        cfg = tiny_config(
            tmp_path,
            name=name,
            executor=executor,
            clients_in_memory=1,
            train__rounds=6,
            train__participation=0.5,
            train__keep_momentum=True,
            ray={"actors": 2, "num_cpus": 2},
            scenario__dataset_options={"n_train": 4000, "n_test": 400, "dim": 64, "num_classes": 4},
        )
        cfg["model"]["width"] = 256
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    cmd = [sys.executable, "-m", "fedshift.cli", "run"]
    proc = subprocess.Popen(
        [*cmd, str(write("killed", "ray"))],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        stdout=subprocess.DEVNULL,
    )
    metrics = tmp_path / "runs" / "killed" / "metrics.jsonl"
    deadline = time.time() + 900  # a busy machine starts Ray slowly
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
        driver = [int(x) for x in fh.read().split()]
    assert len(driver) == 1, "fedshift run should train in one watched child"
    helpers = _descendants(driver[0])  # the local Ray instance the driver started
    assert helpers, "the driver should have started Ray's processes"
    os.kill(driver[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "Traceback" not in err
    assert "killed by the system (SIGKILL)" in err and "fedshift run --resume" in err
    alive = [p for p in helpers if _alive(p)]
    assert not alive, f"Ray's processes outlived the killed run: {alive}"
    done = len(metrics.read_text().splitlines())
    assert 2 <= done < 6, "the run was not interrupted mid-way"

    res = subprocess.run(
        [*cmd, "--resume", str(tmp_path / "runs" / "killed")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    clean = run_cli("run", write("clean", "batched"), cwd=tmp_path)  # in process: no Ray
    assert clean.returncode == 0, clean.stderr
    rows = [
        [json.loads(x) for x in (tmp_path / "runs" / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("killed", "clean")
    ]
    assert [r["round"] for r in rows[0]] == list(range(1, 7))
    for a, b in zip(*rows, strict=True):
        for key in ("global_acc", "local_acc", "train_acc", "train_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-6), (a["round"], key)


def test_missing_ray_is_a_one_line_error_naming_the_extra(monkeypatch, tiny):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(FedshiftError, match=r"fedshift\[ray\]"):
        require_ray()
    cfg = tiny(executor="ray")
    data = build_scenario(cfg.scenario, cfg.seed)
    executor = make_executor(cfg, make_algorithm(cfg, data, torch.device("cpu")), data)
    with pytest.raises(FedshiftError, match=r"needs Ray, which is not installed"), executor:
        pass


def test_an_address_where_no_cluster_listens_is_a_one_line_error():
    with pytest.raises(FedshiftError, match=r"ray\.address=127\.0\.0\.1:9: no Ray cluster"):
        check_reachable("127.0.0.1:9", timeout=1.0)
    check_reachable("auto")  # left to Ray


def test_a_session_reuses_an_existing_connection(local_ray):
    with ray_session(RaySettings(num_cpus=1)) as r:
        assert r.is_initialized()
    assert local_ray.is_initialized()  # not shut down: it was not this session's


def test_config_errors_are_one_line():
    from fedshift.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"ray\.actors"):
        validate_config({"executor": "ray", "ray": {"actors": 0}})
    with pytest.raises(ConfigError, match=r"ray\.inner"):
        validate_config({"executor": "ray", "ray": {"inner": "vmap"}})


def test_actors_that_do_not_fit_the_cluster_are_a_one_line_error(tiny, local_ray):
    cfg = tiny(executor="ray", ray={"actors": 3})  # 3 CPUs asked of a 2-CPU instance
    data = build_scenario(cfg.scenario, cfg.seed)
    executor = make_executor(cfg, make_algorithm(cfg, data, torch.device("cpu")), data)
    with pytest.raises(FedshiftError, match=r"3 actors x \(1 CPUs, 0 GPUs\) do not fit"), executor:
        pass


def test_a_run_with_actors_of_another_shape_gets_their_resources(tmp_path, local_ray):
    """Idle actors wait for the next run, holding their CPUs: a run that needs another shape
    (one actor of 2 CPUs, then two of 1 CPU on a 2-CPU instance) must not wait for them."""
    for shape in ({"actors": 1, "cpus_per_actor": 2}, {"actors": 2, "cpus_per_actor": 1}):
        cfg = validate_config(tiny_config(tmp_path, train__rounds=1, ray=shape))
        state, executor = run_with(cfg, "ray")
        assert state.round == 1 and len(executor.timings) == 1


def test_a_run_on_ray_is_tracked_by_the_driver(tmp_path, local_ray):
    """The tracking sinks are driver-side callbacks: a run on Ray actors logs every
    evaluation of metrics.jsonl to TensorBoard, as a local run does."""
    require_extra("tensorboard", "tracking")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedshift.run.experiment import run_experiment

    cfg = validate_config(
        tiny_config(tmp_path, executor="ray", ray={"actors": 2}, log=["tensorboard"])
    )
    res = run_experiment(cfg)
    acc = EventAccumulator(str(res.run_dir / "tensorboard"))
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("global_acc")]
    expected = [(h["round"], h["global_acc"]) for h in res.history]
    assert [s for s, _ in logged] == [r for r, _ in expected] == [1, 2, 3]
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected], abs=1e-4)
