"""Memory bounded by the work: the plan a run makes before round 1 (budget, chunk, store,
refusal), what a client declares it keeps, no reference cycle keeping a round's tensors, tasks
built only for the clients being trained, and a killed run that says so."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedshift.algorithms import Personalised, get_algorithm
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.registry import ALGORITHMS
from fedshift.config import validate_config
from fedshift.core.errors import FedshiftError
from fedshift.data.scenario import build_scenario
from fedshift.engine.memory import (
    ClientFootprint,
    GiB,
    PlanInputs,
    client_footprint,
    plan_memory,
    runtime_bytes,
    training_bytes,
)
from fedshift.engine.metrics import TIMING_KEYS
from fedshift.engine.store import nbytes
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from fedshift.run.supervise import killed_message
from tests.conftest import run_cli, tiny_config

MiB = 2**20


def inputs(**over) -> PlanInputs:
    """A run of 100 clients x 10 MiB of kept state, 300 MiB of fixed memory."""
    base = dict(
        budget=None,
        available=20 * GiB,
        base=200 * MiB,
        server=10 * MiB,
        client=ClientFootprint(
            state=0, momentum=10 * MiB, local_model=0, task_models=10 * MiB, num_models=2
        ),
        clients=100,
        act=1000,
        batch=32,
        eval_batch=256,
        pool=1000,
        num_classes=10,
        vectorized=True,
        chunk_size=64,
        chunk_fixed=False,
        fine_tunes=False,
        disk_free=100 * GiB,
    )
    return PlanInputs(**{**base, **over})


def test_the_plan_splits_an_explicit_budget_between_fixed_part_chunk_and_store():
    x = inputs(budget=1 * GiB)
    plan = plan_memory(x)
    per = training_bytes(x.client, x.act, x.batch, vectorized=True)
    assert per == 6 * 10 * MiB + 10 * MiB + 3 * 1000 * 32 * 2  # models x6, momentum, activations
    assert training_bytes(x.client, x.act, x.batch) == per - 3 * 10 * MiB  # client by client
    evaluation = 256 * 1000 + 2 * 1000 * 10 * 4 * 2
    fixed = 200 * MiB + 3 * 10 * MiB + evaluation
    assert plan.fixed == fixed
    assert plan.chunk == (1 * GiB - fixed - 10 * MiB) // 2 // per  # half of what is left
    work = plan.chunk * per
    assert plan.work == work
    # the rest holds the resident states and the runtime's share of them and of the chunk
    assert plan.store_budget == int((1 * GiB - fixed - work - runtime_bytes(work, 0)) / 1.1)
    assert plan.spill == 100 * 10 * MiB - plan.store_budget > 0  # 1000 MiB of state: spilled
    assert plan.estimate <= 1 * GiB
    assert plan.eval_chunk is None  # evaluation reads no large client state (momentum: none)
    own = ClientFootprint(
        state=8 * MiB, momentum=10 * MiB, local_model=0, task_models=10 * MiB, num_models=2
    )
    personal = plan_memory(inputs(budget=1 * GiB, client=own))  # personal models: spilled
    assert personal.eval_chunk == personal.store_budget // 4 // (8 * MiB) < 100


def test_the_auto_budget_is_a_share_of_the_available_memory_or_what_the_run_needs():
    assert plan_memory(inputs()).budget == int(0.15 * 20 * GiB)
    tight = plan_memory(inputs(available=1 * GiB))  # 15% would not hold the fixed part
    assert tight.budget > 0.15 * GiB and "the least this run needs" in tight.budget_source
    with pytest.raises(FedshiftError, match=r"needs about .* but the cpu has 0\.25 GiB"):
        plan_memory(inputs(available=int(0.25 * GiB)))


def test_a_run_that_cannot_fit_its_budget_is_refused_with_the_fix():
    with pytest.raises(FedshiftError) as err:
        plan_memory(inputs(budget=250 * MiB))
    text = str(err.value)
    assert "needs about 0.44 GiB" in text and "memory budget is 0.24 GiB" in text
    assert "chunk_size=1" in text and "executor=sequential" in text and "\n" not in text
    # a chunk the user set is used as it is, and counted
    with pytest.raises(FedshiftError, match="a chunk of 64"):
        plan_memory(inputs(budget=1 * GiB, chunk_size=64, chunk_fixed=True))
    # spilled states need the disk
    with pytest.raises(FedshiftError, match="free disk space"):
        plan_memory(inputs(budget=1 * GiB, disk_free=100 * MiB))


def test_everything_in_memory_when_it_fits():
    plan = plan_memory(inputs(clients=10))
    assert plan.spill == 0 and plan.eval_chunk is None
    assert plan.store_budget >= 10 * 10 * MiB and plan.chunk == 10  # no more than the clients


def _algo(tmp_path, name, **over):
    cfg = validate_config(tiny_config(tmp_path, algorithm={"name": name}, **over))
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    inits = [algo.ops.init(k) for k in range(algo.num_initial_models())]
    return algo, data, algo.init_server_state(inits), sim_config(cfg)


@pytest.mark.parametrize(
    "name, state_models, momentum_models",
    [("fedavg", 0, 1), ("fedrc", 0, 3), ("ditto", 1, 1), ("scaffold", 1, 1)],
)
def test_a_client_declares_what_it_keeps(tmp_path, name, state_models, momentum_models):
    """Declared by the algorithm's own hooks on one client, before any training: FedRC keeps
    momentum for its 3 models and an ω, Ditto its personal model (trained without momentum:
    momentum of the global model only), SCAFFOLD a control variate."""
    algo, data, server, sc = _algo(tmp_path, name)
    fp = client_footprint(algo, server, data, True, 0.9, False, 256)
    params, buffers = algo.ops.init(0)
    model = nbytes(params)
    assert fp.probed
    assert fp.momentum == momentum_models * model
    assert abs(fp.state - state_models * model) <= 1024  # plus scalars (ω, counters)
    assert fp.local_model == 0
    assert client_footprint(algo, server, data, False, 0.9, True, 256).local_model == (
        0 if issubclass(get_algorithm(name), Personalised) else nbytes([params, buffers])
    )


def test_the_run_prints_its_plan_and_a_run_over_budget_is_refused_in_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    ok = run_cli("run", str(cfg), cwd=tmp_path)
    assert ok.returncode == 0 and "memory: peak about" in ok.stdout
    bad = run_cli("run", str(cfg), "memory.budget=50MB", "--overwrite", cwd=tmp_path)
    lines = [x for x in bad.stderr.splitlines() if x.strip()]
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert "memory budget is 50 MiB" in lines[0] and "raise memory.budget" in lines[0]
    assert (tmp_path / "runs" / "tiny" / "checkpoint.pt").is_file()  # the refused run left the
    # finished one as it was


# ----------------------------------------------------------------------------- the engine


def test_a_round_leaves_no_tensor_in_a_reference_cycle(tmp_path):
    """A chunk's stacked tensors must be freed when the round ends, not by Python's cyclic
    collector rounds later (a stage that referred to itself through its vmapped closure kept
    2 GB per round of a 32-client CNN run alive)."""
    for executor in ("batched", "sequential"):
        cfg = validate_config(
            tiny_config(
                tmp_path,
                executor=executor,
                vectorize="vmap",
                train__rounds=2,
                train__keep_momentum=True,
            )  # fmt: skip
            if executor == "batched"
            else tiny_config(tmp_path, executor=executor, train__rounds=2)
        )
        gc.collect()
        gc.disable()
        try:
            run_experiment(cfg, overwrite=True)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cyclic = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert not cyclic, f"{executor}: {len(cyclic)} tensors freed only by the cyclic collector"


class Logged(FedAvg):
    """FedAvg that logs when a client's task is built and when its update arrives."""

    name = "logged-fedavg"
    log: list[str] = []

    def client_task(self, server, client, data, ctx):
        Logged.log.append(f"t{data.cid}")
        return super().client_task(server, client, data, ctx)

    def client_update(self, server, client, task, result):
        Logged.log.append(f"u{result.cid}")
        return super().client_update(server, client, task, result)


class _ClearLog:
    def on_start(self, sim, state) -> None:
        Logged.log.clear()  # what the memory plan's probe logged before round 1

    def on_round_end(self, sim, state, metrics) -> None: ...
    def on_end(self, sim, state) -> None: ...


@pytest.mark.parametrize("executor, chunk", [("sequential", 1), ("batched", 2)])
def test_tasks_are_built_only_for_the_clients_being_trained(tmp_path, executor, chunk):
    over = {"algorithm": {"name": Logged.name}, "executor": executor, "vectorize": "vmap"}
    cfg = validate_config(tiny_config(tmp_path, train__rounds=1, chunk_size=chunk, **over))
    with ALGORITHMS.temporarily(Logged.name, Logged):
        run_experiment(cfg, callbacks=[_ClearLog()])
    first = Logged.log[: 3 * chunk]  # a chunk's tasks, its updates, then the next chunk's
    want = [f"t{c}" for c in range(chunk)] + [f"u{c}" for c in range(chunk)]
    want += [f"t{c}" for c in range(chunk, 2 * chunk)]
    assert first[: len(want)] == want[: 3 * chunk], Logged.log


# ----------------------------------------------------------------------------- a killed run


def test_the_killed_message_names_the_cause_and_the_folder(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    msg = killed_message(signal.SIGKILL, ["run", "c.yaml"], str(tmp_path))
    assert "out-of-memory killer" in msg and f"fedshift run --resume {tmp_path}" in msg
    many = killed_message(signal.SIGKILL, ["compare", "c.yaml"], str(tmp_path))
    assert "the same command" in many and str(tmp_path) in many
    assert "ended by SIGSEGV" in killed_message(signal.SIGSEGV, ["run"], None)


def _children(pid: int) -> list[int]:
    path = f"/proc/{pid}/task/{pid}/children"
    with open(path) as fh:
        return [int(x) for x in fh.read().split()]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")
@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_run_killed_by_the_system_says_so_and_resumes_exactly(tmp_path, executor):
    """The `fedshift` process watches the one that trains: SIGKILL on the training process (as
    the out-of-memory killer sends it) is reported in one line, with the folder to resume;
    the resumed run (kept momentum spilled to the store: one client's state in memory) ends
    with the uninterrupted run's metrics."""
    from tests.conftest import gate_env, gated_config, start, wait_blocked

    over = {
        "executor": executor,
        "vectorize": "vmap",
        "clients_in_memory": 1,
        "train__keep_momentum": True,
        "model__width": 256,
    }
    cfg = gated_config(tmp_path, train__rounds=3, **over)
    env, gate = gate_env(tmp_path)
    proc = start(["run", cfg], tmp_path, env)
    wait_blocked(proc, gate)  # round 1 is saved, round 2 waits
    kids = _children(proc.pid)
    assert len(kids) == 1
    os.kill(kids[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "Traceback" not in err and "killed by the system (SIGKILL)" in lines[-1]
    run_dir = (tmp_path / "runs" / "tiny").resolve()
    assert f"fedshift run --resume {run_dir}" in lines[-1]
    (gate).touch()
    resumed = subprocess.run(
        [sys.executable, "-m", "fedshift.cli", "run", "--resume", str(run_dir)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    env.pop("FEDSHIFT_TEST_GATE")
    full_cfg = gated_config(tmp_path, name="full", train__rounds=3, **over)
    full = subprocess.run(
        [sys.executable, "-m", "fedshift.cli", "run", str(full_cfg)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert full.returncode == 0, full.stderr
    rows = [
        [json.loads(x) for x in (tmp_path / "runs" / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("tiny", "full")
    ]
    keep = lambda r: {k: v for k, v in r.items() if k not in TIMING_KEYS}  # noqa: E731
    assert [keep(r) for r in rows[0]] == [keep(r) for r in rows[1]]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")
def test_the_watcher_stops_every_generation_a_killed_child_leaves(tmp_path):
    """What a killed training process leaves running is adopted by the watcher and stopped,
    including the children of what it adopts (orphaned only when their parent ends)."""
    pids = tmp_path / "pids"
    script = f"""
import os, signal, subprocess, sys, time
from fedshift.run import supervise
assert supervise._prctl(supervise._PR_SET_CHILD_SUBREAPER, 1)
child = os.fork()
if child == 0:  # the training process: starts a helper with a helper of its own, then dies
    inner = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    helper = subprocess.Popen([sys.executable, "-c", inner])
    time.sleep(1.0)
    with open({str(pids)!r}, "w") as fh:
        fh.write(str(helper.pid))
    os.kill(os.getpid(), signal.SIGKILL)
os.waitpid(child, 0)
ended = supervise.end_leftovers(grace_s=1.0)
print(" ".join(map(str, ended)))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    ended = [int(p) for p in res.stdout.split()]
    helper = int(pids.read_text())
    assert helper in ended
    assert len(ended) == 2, "the helper's own child should be stopped too"
    for pid in ended:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_runs_alive_in_one_process_count_each_other_before_returning_memory(monkeypatch):
    """A grid trained as one job holds several runs in a process: one run's plan is not
    'over' because of what the others planned (else it would return memory after every
    client), and it is again once they are gone."""
    import fedshift.engine.memory as memory

    one = plan_memory(inputs(device="cpu"))
    held = one.estimate + memory.OVER_BYTES + 2**20  # just over one plan
    monkeypatch.setattr(memory, "resident_memory", lambda device: held)
    assert one.over()
    other = plan_memory(inputs(device="cpu"))
    assert not one.over(), "a second live run's planned share was not counted"
    del other
    gc.collect()
    assert one.over()
