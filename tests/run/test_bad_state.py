"""Bad states and user mistakes, as a user meets them on the command line: each ends in one
line naming the problem and what to do, with exit code 2 (no traceback), and leaves what was
there intact: damaged checkpoints, negative indices, a run folder that another run holds, a Ray
address where no cluster answers, mistyped names, starts that fail before training, interrupts,
and plots whose colours follow the algorithm.

Processes that must really run at once (a run holding its folder, an interrupted run) wait on
a plugin algorithm that blocks in round 2 until a gate file exists: the tests synchronise on
files, never on sleeps."""

from __future__ import annotations

import http.server
import os
import pickle
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import (
    Ran,
    gate_env,
    gated_config,
    require_extra,
    start,
    tiny_config,
    wait_blocked,
    write_config,
)

# ----------------------------------------------------------------------------- helpers


def fedshift(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> Ran:
    """The real command in its own process."""
    res = subprocess.run(
        [sys.executable, "-m", "fedshift.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Ran(res.returncode, res.stdout, res.stderr)


def interrupted(proc: subprocess.Popen, sig: int) -> Ran:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return Ran(proc.returncode, out, err)


def rounds(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [yaml.safe_load(x)["round"] for x in lines]


# ----------------------------------------------------------------------------- 1. checkpoints


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real run folder of 2 rounds (config.yaml, metrics, summary, checkpoint.pt)."""
    from fedshift.config import validate_config
    from fedshift.run.experiment import run_experiment

    root = tmp_path_factory.mktemp("finished")
    return run_experiment(validate_config(tiny_config(root, train__rounds=2))).run_dir


class Touch:
    """Pickles to a call of Path.touch: loading it must never run it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _truncate(p: Path, tmp: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _empty(p: Path, tmp: Path) -> None:
    p.write_bytes(b"")


def _foreign_class(p: Path, tmp: Path) -> None:
    torch.save({"format": 2, "state": {"round": Fraction(1, 3)}, "meta": {}}, p)


def _code(p: Path, tmp: Path) -> None:
    torch.save({"format": 2, "state": {"x": Touch(tmp / "ran")}, "meta": {}}, p)


def _no_state(p: Path, tmp: Path) -> None:
    torch.save({"weights": torch.zeros(2)}, p)


def _plain_pickle(p: Path, tmp: Path) -> None:
    p.write_bytes(pickle.dumps({"state": [1, 2, 3]}, protocol=4))


@pytest.mark.parametrize(
    "damage, why",
    [
        (_truncate, "truncated: the end of the archive is missing"),
        (_empty, "the file is empty"),
        (_foreign_class, "fractions.Fraction"),
        (_code, "fedshift loads only plain data and tensors"),
        (_plain_pickle, "not a checkpoint fedshift wrote"),
        (_no_state, "not a fedshift checkpoint: it has no 'state' entry"),
    ],
    ids=["truncated", "empty", "foreign-class", "code", "plain-pickle", "no-state"],
)
def test_resuming_a_damaged_checkpoint_is_one_line_naming_the_file(
    tmp_path, finished_run, cli, damage, why
):
    """In this process (a traceback would be the exception ``cli`` raises)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    damage(run_dir / "checkpoint.pt", tmp_path)
    line = cli("run", "--resume", run_dir).error()
    assert f"checkpoint {run_dir / 'checkpoint.pt'} cannot be read (" in line and why in line
    assert "delete it to start this run over" in line and "without --resume" in line, line
    assert not (tmp_path / "ran").exists(), "loading the checkpoint ran code from it"


def test_resuming_a_run_that_diverged_before_its_first_checkpoint_says_so(tmp_path, cli):
    cfg = write_config(tmp_path, train__lr=1e30)
    assert "diverged in round 1" in cli("run", cfg).error(code=3)
    run_dir = tmp_path / "runs" / "tiny"
    line = cli("run", "--resume", run_dir).error()
    assert "diverged in round 1, before its first checkpoint" in line, line
    assert "is it a fedshift run directory" not in line and "lower train.lr" in line, line


def test_resume_with_a_config_too_is_one_line(tmp_path, cli, finished_run):
    cfg = write_config(tmp_path)
    line = cli("run", "--resume", finished_run, cfg).error()
    assert "not both" in line and str(finished_run) in line, line


# ----------------------------------------------------------------------------- 2. indices

_TWO_CONCEPTS = "scenario.concepts=[identity, reverse]"
_SIX = ", ".join(["{concept: 0}"] * 5)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["scenario.mix={types: [{fraction: 1.0, concepts: [0, -1]}]}"], "mix.types.0.concepts.1"),
        ([f"scenario.mix={{clients: [{{concept: -1}}, {_SIX}]}}"], "mix.clients.0.concept"),
        (
            [
                "scenario.timeline={rounds_per_step: 1, steps: [{concepts: [0]}, "
                "{concepts: [-1]}]}",
                "train.rounds=2",
            ],
            "scenario.timeline.steps.1.concepts.0",
        ),
        (["seed=-1"], "config: seed:"),
        (["scenario.seed=-1"], "config: scenario.seed:"),
        (["scenario.concepts=[identity, {kind: permutation, perm: [0, 1, 2, -1]}]"], "concepts.1"),
        (["scenario.feature_shift.styles=[fog/-1]"], "scenario.feature_shift.styles"),
        (["algorithm.name=ifca", "algorithm.params={num_clusters: -1}"], "params.num_clusters"),
        (["scenario.label_shift={kind: pathological, classes_per_client: -1}"], "classes_per"),
        (["eval.every=-1"], "eval.every"),
    ],
    ids=[
        "type-concepts",
        "client-concept",
        "step-concepts",
        "seed",
        "scenario-seed",
        "permutation",
        "severity",
        "num-clusters",
        "classes-per-client",
        "eval-every",
    ],
)
def test_a_negative_index_is_a_config_error_naming_the_key(tmp_path, cli, overrides, key):
    cfg = write_config(tmp_path)
    line = cli("run", cfg, _TWO_CONCEPTS, *overrides).error()
    assert line.startswith("error: ") and key in line, line
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- 3. one writer


def test_a_second_run_of_a_busy_folder_is_refused_and_a_killed_run_is_taken_over(tmp_path, cli):
    """The second runs in this process (the lock names another process either way)."""
    cfg = gated_config(tmp_path)
    run_dir = tmp_path / "runs" / "tiny"
    env, gate = gate_env(tmp_path)
    first = start(["run", cfg], tmp_path, env)
    try:
        wait_blocked(first, gate)
        files = {f: (run_dir / f).read_bytes() for f in ("config.yaml", "checkpoint.pt")}
        for args in (["run", cfg], ["run", cfg, "--overwrite"], ["run", "--resume", run_dir]):
            line = cli(*args).error()
            assert f"run folder {run_dir} is in use by process {first.pid}" in line, line
        assert first.poll() is None, "the first run did not survive the second"
        assert {f: (run_dir / f).read_bytes() for f in files} == files
        assert rounds(run_dir) == [1]
    finally:
        first.kill()  # SIGKILL: no clean-up, the lock file stays behind
        first.communicate()
    assert (run_dir / ".lock").is_file()
    res = cli("run", "--resume", run_dir)  # no gate: it runs through
    assert res.code == 0, res.err
    assert rounds(run_dir) == [1, 2, 3]
    assert not (run_dir / ".lock").exists()


# ----------------------------------------------------------------------------- 4. Ray address


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers (no Ray)."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            while self.request.recv(4096):
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_something_else_listens_fails_within_the_timeout(silent_server):
    from fedshift.core.errors import FedshiftError
    from fedshift.engine.ray_session import check_reachable

    t0 = time.monotonic()
    with pytest.raises(FedshiftError) as err:
        check_reachable(silent_server, timeout=2.0)
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    assert msg.startswith(f"ray.address={silent_server}: no Ray cluster answers there"), msg
    assert "within 2 s" in msg and "ray.connect_timeout_s" in msg and "\n" not in msg


def test_an_http_server_or_nothing_at_the_address_fails_at_once(http_server):
    from fedshift.core.errors import FedshiftError
    from fedshift.engine.ray_session import check_reachable

    for address, why in (
        (http_server, "does not speak gRPC"),
        (f"127.0.0.1:{_free_port()}", "nothing listens"),
    ):
        t0 = time.monotonic()
        with pytest.raises(FedshiftError, match=why):
            check_reachable(address, timeout=30.0, label="--ray-address")
        assert time.monotonic() - t0 < 10, address


def test_a_server_that_answers_as_a_ray_gcs_passes_the_check():
    grpc = require_extra("grpc", "ray")
    from concurrent.futures import ThreadPoolExecutor

    from fedshift.engine.ray_session import check_reachable

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"")
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "ray.rpc.NodeInfoGcsService", {"GetClusterId": handler}
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        check_reachable(f"127.0.0.1:{port}", timeout=5.0)
    finally:
        server.stop(None)


def test_run_with_a_ray_address_of_another_service_is_one_line_in_bounded_time(
    tmp_path, silent_server
):
    require_extra("ray", "ray")
    cfg = write_config(tmp_path)
    t0 = time.monotonic()
    ran = fedshift(
        "run", cfg, "executor=ray", f"ray.address={silent_server}", "ray.connect_timeout_s=2",
        cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    line = ran.error()
    assert time.monotonic() - t0 < 120
    assert f"ray.address={silent_server}: no Ray cluster answers there" in line, line
    assert "within 2 s" in line and "check the host and port" in line, line
    assert not (tmp_path / "runs").exists(), sorted((tmp_path / "runs").rglob("*"))


def test_sweep_with_a_ray_address_of_another_service_names_the_option(tmp_path, silent_server):
    require_extra("ray", "ray")
    cfg = write_config(tmp_path)
    args = ["sweep", cfg, "train.lr=0.05,0.1", "ray.connect_timeout_s=2"]
    line = fedshift(*args, "--ray-address", silent_server, cwd=tmp_path, timeout=120).error()
    assert f"--ray-address {silent_server}: no Ray cluster answers there" in line, line
    assert "leave out --ray-address" in line, line
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- 5. names

_FEATURE = ["scenario.mix={types: [{fraction: 1.0, feature: true}]}"]


@pytest.mark.parametrize(
    "args, meant",
    [
        (["run", "{cfg}", "algorithm.name=fedrcc"], "fedrc"),
        (["run", "{cfg}", "scenario.dataset=fmnst"], "fmnist"),
        (["run", "{cfg}", "model.name=resnet81"], "resnet18"),
        (["run", "{cfg}", "scenario.feature_shift.styles=[fgo]", *_FEATURE], "fog"),
        (["run", "{cfg}", "scenario.feature_shift.styles=[fmnist-cc]", *_FEATURE], "fmnist-c"),
        (["run", "{cfg}", "scenario.label_shift.kind=dirichet"], "dirichlet"),
        (["run", "{cfg}", "scenario.concepts=[identity, revers]"], "reverse"),
        (["run", "{cfg}", "trian.rounds=3"], "train"),
        (["run", "{cfg}", "train.lrr=0.1"], "lr"),
        (["run", "{cfg}", "scenario.label_shift.alpah=1"], "alpha"),
        (
            ["run", "{cfg}", "algorithm.name=ifca", "algorithm.params={num_cluster: 2}"],
            "num_clusters",
        ),
        (["run", "{cfg}", "device=cpuu"], "cpu"),
        (["compare", "{cfg}", "--algorithms", "fedavg,fedproxx"], "fedprox"),
        (["compare", "{cfg}", "--protocol", "lst"], "last"),
        (["report", "{cfg}", "--protocol", "best_trian"], "best_train"),
        (["sweep", "{cfg}", "train.lr=0.05,0.1", "--protocol", "stepz"], "steps"),
        (["reproduce", "fedrc-tabel1"], "fedrc-table1"),
        (["reproduce", "fedrc-table1", "--dataset", "fmnst"], "fmnist"),
        (["reproduce", "fedrc-table1", "--only", "FedAvgg"], "FedAvg"),
        (["reproduce", "fedrc-table1", "--follow", "cod"], "code"),
        (["bench", "--models", "fmnist_cn"], "fmnist_cnn"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else v,
)
def test_a_mistyped_name_gets_the_closest_one(tmp_path, cli, args, meant):
    cfg = write_config(tmp_path)
    line = cli(*[str(cfg) if a == "{cfg}" else a for a in args]).error()
    assert f"(did you mean {meant!r}?)" in line, line


# ----------------------------------------------------------------------------- 6. no folder


@pytest.fixture
def no_data(tmp_path, monkeypatch) -> Path:
    """An empty datasets folder ($FEDSHIFT_DATA too): office-caltech10 is never downloaded."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("FEDSHIFT_DATA", str(empty))
    return empty


_MISSING = ["scenario.dataset=office-caltech10", "scenario.dataset_options={}"]


@pytest.mark.parametrize("command", ["run", "compare", "sweep", "reproduce"])
@pytest.mark.parametrize(
    "mistake, needle",
    [
        (["algorithm.name=fedmagic"], "unknown algorithm"),
        (["scenario.dataset=imagenet-1k"], "unknown dataset"),
        (["trian.rounds=3"], "unknown key"),
        (["scenario.feature_shift.styles=[fgo]"], "unknown feature style"),
        (_MISSING, "not found"),
    ],
    ids=["algorithm", "dataset", "key", "style", "missing-dataset"],
)
def test_a_start_that_fails_leaves_no_run_folder(tmp_path, cli, no_data, command, mistake, needle):
    if command in ("compare", "reproduce") and mistake == ["algorithm.name=fedmagic"]:
        mistake = ["--algorithms", "fedavg,fedmagic"] if command == "compare" else ["--only", "X"]
        needle = "unknown algorithm" if command == "compare" else "row 'X'"
    if command == "reproduce":
        args = ["reproduce", "fedrc-table1", "--rounds", "1", "--clients", "3", "--only", "FedAvg"]
        args += ["output.dir=runs", *mistake, "--data-dir", no_data]
    else:
        cfg = write_config(tmp_path)
        args = [command, cfg, *mistake, "--data-dir", no_data]
        args += ["train.lr=0.05,0.1"] if command == "sweep" else []
    assert needle in cli(*args).error()
    assert not (tmp_path / "runs").exists(), sorted((tmp_path / "runs").rglob("*"))


def test_a_failed_start_removes_only_folders_it_created_holding_only_its_config(tmp_path):
    from fedshift.run.lock import removed_if_failed

    def fail_in(target: Path, *files: str) -> None:
        with pytest.raises(RuntimeError), removed_if_failed(target):
            target.mkdir(parents=True, exist_ok=True)
            for f in files:
                (target / f).write_text("x")
            raise RuntimeError("the start failed")

    fail_in(tmp_path / "a" / "b", "config.yaml")
    assert not (tmp_path / "a").exists()  # config only: nothing of value, both folders gone
    fail_in(tmp_path / "c", "config.yaml", "metrics.jsonl")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["config.yaml", "metrics.jsonl"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text("theirs")
    fail_in(tmp_path / "old")  # existed before: never touched
    assert (tmp_path / "old" / "config.yaml").read_text() == "theirs"


# ----------------------------------------------------------------------------- 7. interrupts


@pytest.mark.signals
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_names_its_folder_to_resume(tmp_path, sig):
    cfg = gated_config(tmp_path, name="xyz")
    env, gate = gate_env(tmp_path)
    proc = start(["run", cfg], tmp_path, env)
    wait_blocked(proc, gate)
    run_dir = tmp_path / "runs" / "xyz"
    line = interrupted(proc, sig).error(code=130)
    assert f"continue with `fedshift run --resume {run_dir}`" in line, line
    assert "RUN_DIR" not in line


@pytest.mark.signals
def test_an_interrupted_compare_says_that_the_same_command_goes_on_and_it_does(tmp_path):
    cfg = gated_config(tmp_path)
    env, gate = gate_env(tmp_path)
    args = ["compare", cfg, "--algorithms", "fedavg,gatedavg"]
    proc = start(args, tmp_path, env)
    wait_blocked(proc, gate)
    line = interrupted(proc, signal.SIGTERM).error(code=130)
    assert "run the same command again: finished runs are reused" in line, line
    assert "unfinished ones resume from their last checkpoint" in line and "--resume" not in line
    fedavg, gated = (tmp_path / "runs" / "tiny" / a for a in ("fedavg", "gatedavg"))
    done = (fedavg / "checkpoint.pt").stat().st_mtime_ns, rounds(fedavg)
    first = (gated / "metrics.jsonl").read_text().splitlines()
    gate.touch()  # the same command, now without a wait
    again = fedshift(*args, cwd=tmp_path, env=env)
    assert again.code == 0, again.err
    assert ((fedavg / "checkpoint.pt").stat().st_mtime_ns, rounds(fedavg)) == done  # reused
    assert rounds(gated) == [1, 2, 3]
    assert (gated / "metrics.jsonl").read_text().splitlines()[:1] == first  # resumed


@pytest.mark.signals
def test_an_interrupted_sweep_says_how_to_go_on(tmp_path):
    cfg = gated_config(tmp_path)
    env, gate = gate_env(tmp_path)
    proc = start(["sweep", cfg, "train.lr=0.05,0.1", "--fresh"], tmp_path, env)
    wait_blocked(proc, gate)
    line = interrupted(proc, signal.SIGINT).error(code=130)
    assert "run the same command without --fresh again" in line, line
    assert "unfinished ones resume from their last checkpoint" in line and "RUN_DIR" not in line


def test_the_flower_hint_offers_what_flower_and_run_really_have(tmp_path, cli, finished_run):
    from fedshift.cli.console import interrupt_hint

    hint = interrupt_hint("flower", str(finished_run), {})
    assert f"`fedshift run --resume {finished_run}`" in hint and "--overwrite" in hint
    assert "fedshift flower --resume" not in hint and "RUN_DIR" not in hint
    flower_help = cli("flower", "--help").out
    assert "--overwrite" in flower_help and "--resume" not in flower_help
    assert "--resume" in cli("run", "--help").out
    assert "before a round was saved" in interrupt_hint("run", str(tmp_path), {})


@pytest.mark.signals
@pytest.mark.slow
def test_an_interrupted_flower_run_names_its_folder(tmp_path):
    require_extra("flwr", "flower")
    cfg = write_config(tmp_path, name="fl", train__rounds=500)
    run_dir = tmp_path / "runs" / "fl"
    proc = start(["flower", cfg], tmp_path, dict(os.environ))
    deadline = time.monotonic() + 600
    while not ((run_dir / "checkpoint.pt").is_file() and proc.poll() is None):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    res = interrupted(proc, signal.SIGTERM)  # Ray's own handler would abort the process
    assert res.code == 130, res.err[-3000:]
    hints = [x for x in res.err.splitlines() if x.startswith("interrupted")]  # Flower logs too
    assert len(hints) == 1 and "Traceback" not in res.err, res.err[-3000:]
    assert f"`fedshift run --resume {run_dir}`" in hints[0], hints[0]


# ----------------------------------------------------------------------------- 8. colours


def _captured(monkeypatch) -> list:
    """The figures fedshift.reporting.plots saves, kept for inspection."""
    import matplotlib.pyplot as plt

    from fedshift.reporting import plots

    figs: list = []

    def save(fig, path):
        figs.append((Path(path).name, fig))
        plt.close(fig)
        return Path(path)

    monkeypatch.setattr(plots, "_save", save)
    return figs


def _colours(fig) -> list[dict[str, str]]:
    """Per axes: each line's label and its colour."""
    from matplotlib.colors import to_hex

    return [{ln.get_label(): to_hex(ln.get_color()) for ln in ax.lines} for ax in fig.axes]


def _one_colour_each(panels: list[dict[str, str]]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for panel in panels:
        for label, colour in panel.items():
            assert seen.setdefault(label, colour) == colour, (label, panels)
    assert len(set(seen.values())) == len(seen), seen
    return seen


def test_an_algorithm_keeps_its_colour_in_every_panel(monkeypatch, tmp_path):
    from fedshift.reporting.plots import plot_history, run_colors

    figs = _captured(monkeypatch)

    def hist(ari: bool) -> list[dict]:
        return [
            {
                "round": r,
                "global_acc": 50.0 + r,
                "train_loss": 1.0 / r,
                **({"ari_concept": r / 4} if ari else {}),
            }
            for r in (1, 2, 3)
        ]

    runs = {"fedavg": hist(False), "ifca": hist(True), "fedrc": hist(True)}
    plot_history(runs, tmp_path / "c.png")
    ((_, fig),) = figs
    panels = _colours(fig)
    assert [set(p) for p in panels] == [set(runs), set(runs), {"ifca", "fedrc"}]
    from matplotlib.colors import to_hex

    assert _one_colour_each(panels) == {k: to_hex(c) for k, c in run_colors(runs).items()}


def test_the_comparison_figure_colours_follow_the_algorithm(monkeypatch, tmp_path):
    from fedshift.config import validate_config
    from fedshift.studies.compare import compare

    figs = _captured(monkeypatch)
    raw = tiny_config(tmp_path, train__rounds=2)
    raw["scenario"].update(concepts=["identity", "reverse"])
    raw["scenario"]["mix"] = {"types": [{"fraction": 1.0, "concepts": [0, 1]}]}
    compare(validate_config(raw), ["fedavg", "ifca", "fedrc"])
    fig = dict(figs)["comparison.png"]
    panels = _colours(fig)
    titles = [ax.get_title() for ax in fig.axes]
    ari = panels[next(i for i, t in enumerate(titles) if t.startswith("ARI"))]
    assert set(ari) == {"ifca", "fedrc"}  # FedAvg has no clusters
    colours = _one_colour_each(panels)
    assert set(colours) == {"fedavg", "ifca", "fedrc"}
