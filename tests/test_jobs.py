"""Independent runs in worker processes: an interrupted command stops its workers at once, and
a worker that dies is a one-line error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml

from tests.conftest import tiny_config


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _long_sweep(tmp_path) -> tuple[subprocess.Popen, list[int]]:
    """`fedshift sweep --jobs 2` of two runs whose first round takes minutes, once both runs
    are training; with the worker processes (the manager's and the pool's)."""
    cfg = tiny_config(tmp_path, train__rounds=2, train__local_epochs=500)
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "fedshift.cli", "sweep", str(path), "train.lr=0.01,0.02"]
    proc = subprocess.Popen(
        [*cmd, "--jobs", "2"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = tmp_path / "runs" / "tiny-sweep"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if len(list(runs.glob("*/seed0/config.yaml"))) == 2:
            break
        time.sleep(0.1)
    time.sleep(1.0)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    workers = _children(proc.pid)
    assert len(workers) >= 3  # the message queue's manager and the two runs
    return proc, workers


def test_sigterm_stops_the_worker_processes_at_once(tmp_path):
    """Killed during its runs' first round (minutes long), the command exits 130 at once and
    its workers end with it, instead of training on to the round's end while the command
    waits for them."""
    proc, workers = _long_sweep(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)  # not the minutes the round would take
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "worker processes outlived the command"


def test_a_killed_worker_is_a_one_line_error(tmp_path):
    """A worker that dies (the OOM killer, a stray kill) ends the command with one line that
    says how to resume, not a traceback of the process pool."""
    proc, workers = _long_sweep(tmp_path)
    os.kill(max(workers), signal.SIGKILL)  # a run's process (they start after the manager)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "worker process ended abruptly" in err and "resumes" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_run_continues_under_another_executor_or_inference_batch(tiny):
    """A finished or interrupted run is the same experiment whatever executed it: another
    executor, device, inference batch or output setting reuses it; another lr does not."""
    from fedshift.config import dump_config
    from fedshift.results import CHECKPOINT, CONFIG
    from fedshift.runner import run_dir_for
    from fedshift.studies.jobs import same_run_exists

    cfg = tiny(eval={"every": 1, "batch_size": 1024})
    d = run_dir_for(cfg)
    d.mkdir(parents=True)
    (d / CONFIG).write_text(dump_config(cfg))
    assert not same_run_exists(cfg)  # no checkpoint yet
    (d / CHECKPOINT).write_bytes(b"")
    assert same_run_exists(cfg)
    same = {"executor": "sequential", "chunk_size": 3, "eval": {"every": 1}, "ray": {"actors": 2}}
    assert same_run_exists(tiny(**same))
    assert not same_run_exists(tiny(eval={"every": 1, "batch_size": 1024}, train={"lr": 0.5}))
    assert not same_run_exists(tiny(eval={"every": 2, "batch_size": 1024}))
