"""Independent runs in worker processes: an interrupted command stops its workers at once, and
a worker that dies is a one-line error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedshift.run.lock import LOCK
from tests.conftest import tiny_config


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``: the `fedshift` command watches a child that runs the
    command (fedshift.run.supervise), whose workers are its own children."""
    out, todo = [], _children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _started(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _run_pids(runs: Path) -> list[int]:
    """The processes that hold the runs under ``runs``: each names itself in its run
    directory's lock file before it writes the run's config.yaml."""
    return [int(lock.read_text().split()[0]) for lock in sorted(runs.glob(f"*/seed0/{LOCK}"))]


def _long_sweep(tmp_path) -> tuple[subprocess.Popen, list[int], list[int]]:
    """`fedshift sweep --jobs 2` of two runs whose first round takes minutes, once both runs
    have written their config (the step before training); with the command's child processes
    (the message queue's manager and the pool's workers) and the two that hold the runs."""
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
    deadline = time.monotonic() + 600
    # poll for the event (both configs written), not a fixed wait
    while len(list(runs.glob("*/seed0/config.yaml"))) < 2:
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before it could be interrupted: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the two runs did not start within 10 minutes")
        time.sleep(0.05)
    pids = _run_pids(runs)
    workers = _descendants(proc.pid)
    assert len(pids) == 2 and set(pids) <= set(workers), (pids, workers)
    assert proc.pid not in pids  # the runs are in worker processes, not in the command
    assert len(workers) >= 4  # the watched command, its queue's manager and the two runs
    return proc, workers, pids


@pytest.mark.signals
def test_sigterm_stops_the_worker_processes_at_once(tmp_path):
    """Killed during its runs' first round (minutes long), the command exits 130 at once and
    its workers end with it, instead of training on to the round's end while the command
    waits for them."""
    proc, workers, pids = _long_sweep(tmp_path)
    assert all(_alive(p) for p in pids)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)  # not the minutes the round would take
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "worker processes outlived the command"


def test_a_killed_worker_is_a_one_line_error(tmp_path):
    """A worker that dies (the OOM killer, a stray kill) ends the command with one line that
    says how to resume, not a traceback of the process pool."""
    proc, workers, pids = _long_sweep(tmp_path)
    # the run process started last (the lock files say which processes hold runs; one clock
    # tick apart they tie, and either is killed): the process pool on its own can overlook
    # its death for a minute or more (see fedshift.studies.jobs._a_worker_ended)
    first, last = sorted(pids, key=_started)
    os.kill(last, signal.SIGKILL)
    _, err = proc.communicate(timeout=30)  # noticed within a second or two
    assert proc.returncode == 2, err
    assert "worker process ended abruptly" in err and "resumes" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    deadline = time.monotonic() + 20  # the other run's worker was stopped, not left training
    while time.monotonic() < deadline and _alive(first):
        time.sleep(0.1)
    assert not _alive(first), "the other run's worker outlived the command"


def test_the_sweep_sees_a_dead_worker_itself():
    """The check the sweep's loop makes besides the pool's own (which can miss a worker it
    started last): false while the workers live, true once one has been killed."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from fedshift.studies.jobs import _a_worker_ended

    pool = ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("spawn"))
    procs = []
    try:
        for _ in range(2):
            pool.submit(time.sleep, 120)
        procs = list(pool._processes.values())  # started by the submits
        assert len(procs) == 2 and not _a_worker_ended(pool)
        os.kill(procs[-1].pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not _a_worker_ended(pool):
            assert time.monotonic() < deadline, "the killed worker was not seen"
            time.sleep(0.05)
    finally:
        for proc in procs:
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)


def test_a_run_continues_under_another_executor_or_inference_batch(tiny):
    """A finished or interrupted run is the same experiment whatever executed it: another
    executor, device, inference batch or output setting reuses it; another lr does not."""
    from fedshift.config import dump_config
    from fedshift.run.experiment import run_dir_for
    from fedshift.run.folder import CHECKPOINT, CONFIG
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
