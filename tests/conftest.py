"""Shared fixtures: tiny configs on data that is always available (synthetic, digits)."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
import yaml
from torch import nn
from typer.testing import CliRunner

from fedshift.algorithms.base import (
    ClientData,
    ModelOps,
    TrainDefaults,
)
from fedshift.algorithms.fedrc import FedRC
from fedshift.cli import app
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.metrics import TIMING_KEYS
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from fedshift.testing import as_float64, float64, float64_difference

ROOT = Path(__file__).resolve().parents[1]

#: the run settings an algorithm built by hand (outside the runner) is given
RUN = {"seed": 0, "train": TrainDefaults()}

# ------------------------------------------------------------------ parallel workers

#: tests that start Ray or Flower (Flower's simulation runs on Ray): they run one at a time, on
#: one worker (pytest-xdist's ``--dist loadgroup``), so that two local Ray instances never
#: share the machine's cores and memory at once
SERIAL = ("ray", "flower")


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker trains with ``cores / workers`` torch threads, so the
    workers share the cores instead of each taking them all."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if any(word in item.nodeid.lower() for word in SERIAL):
            item.add_marker(pytest.mark.xdist_group("ray-flower"))


def require_extra(module: str, extra: str) -> ModuleType:
    """Import ``module`` of the optional extra ``extra`` (at a test module's top, in a fixture
    or in a test). Missing, it fails the test (or the module's collection) with a message that
    names what to install: the test command installs every extra (scripts/setup.sh), so a test
    never silently stops running."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        message = f"{module} is missing ({err}): pip install -e '.[{extra}]'"
        pytest.fail(f"{message} (every test must run)", pytrace=False)


@pytest.fixture(autouse=True)
def _as_a_background_job(request):
    """A test marked ``signals`` runs as a shell's background job would (``nohup cmd &``):
    SIGINT and SIGHUP ignored in this process while it runs, so every process it starts
    inherits them ignored (the harder case for fedshift, which must then stop what it started
    with SIGTERM). A test marked ``foreground`` keeps the terminal's default."""
    if request.node.get_closest_marker("signals") is None or request.node.get_closest_marker(
        "foreground"
    ):
        yield
        return
    before = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep scenario caches of the tests out of the user's cache."""
    if "FEDSHIFT_CACHE" not in os.environ:
        monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _registries() -> list:
    """Every process-global registry a plugin (or a test) can add to."""
    from fedshift.algorithms.registry import ALGORITHMS
    from fedshift.data.concepts import LABEL_MAP_KINDS
    from fedshift.data.features import CORRUPTION_FUNCS  # the modules that fill them
    from fedshift.data.partition import PARTITIONERS
    from fedshift.data.sources import DATASETS
    from fedshift.models import MODELS

    return [ALGORITHMS, DATASETS, MODELS, PARTITIONERS, LABEL_MAP_KINDS, CORRUPTION_FUNCS]


@contextmanager
def registries_restored() -> Iterator[None]:
    """Undo what the block registers (plugin files, ``@fedshift.register`` classes, entry
    points, ``--plugin`` entries). The plugin files imported in the block are forgotten too, so
    a later block that names one imports (and registers) it again."""
    from fedshift.cli import console
    from fedshift.core import plugins

    regs = _registries()
    for reg in regs:
        reg.names()  # the built-in (and installed) entries load first: they are kept
    saved = [(reg, dict(reg._entries), dict(reg._aliases)) for reg in regs]
    loaded, installed = dict(plugins._loaded), plugins._installed_done
    cli_plugins = list(console._plugins)
    try:
        yield
    finally:
        for reg, entries, aliases in saved:
            reg._entries.clear()
            reg._entries.update(entries)
            reg._aliases.clear()
            reg._aliases.update(aliases)
        for entry, module in list(plugins._loaded.items()):
            if entry not in loaded:
                sys.modules.pop(module.__name__, None)
        plugins._loaded.clear()
        plugins._loaded.update(loaded)
        plugins._installed_done = installed
        console._plugins[:] = cli_plugins


@pytest.fixture(autouse=True)
def _restore_registries():
    """Every test starts from the built-in names, whatever ran before it in this process."""
    with registries_restored():
        yield


def tiny_config(tmp_path: Path, **over) -> dict:
    """A raw config: synthetic data, MLP, a few clients and rounds (seconds on a CPU)."""
    cfg = {
        "name": "tiny",
        "seed": 0,
        "device": "cpu",
        "scenario": {
            "dataset": "synthetic",
            "dataset_options": {"n_train": 1200, "n_test": 400, "dim": 16, "num_classes": 4},
            "num_clients": 6,
            "label_shift": {"kind": "iid"},
            "concepts": ["identity"],
        },
        "model": {"name": "mlp", "width": 32},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 3, "batch_size": 32, "lr": 0.05},
        "eval": {"every": 1},
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }
    for key, value in over.items():
        node = cfg
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


@pytest.fixture
def tiny(tmp_path):
    def make(**over):
        return validate_config(tiny_config(tmp_path, **over))

    return make


@dataclass
class CliResult:
    """What a ``fedshift`` command did: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path) -> CliResult:
    """``fedshift ARGS`` in this process, from ``cwd`` (seconds faster than a new Python that
    imports torch; the tests that need a real process, to signal or kill it, start one). An
    unexpected exception is raised, as a traceback would be printed; the signal handlers a
    command installs are put back."""
    import signal

    from typer.testing import CliRunner

    from fedshift.cli import app

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    here = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(here)
        for s, h in handlers.items():
            signal.signal(s, h)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return CliResult(res.exit_code, res.stdout, res.stderr)


# ------------------------------------------------------------------ comparing executors
# Executors and runs are compared in float64: why F64_ATOL holds on any CPU and thread count is
# written beside it in fedshift/testing.py.


def build_float64(cfg):
    """The scenario of ``cfg`` in float64, to build and run algorithms on inside ``float64()``."""
    return as_float64(build_scenario(cfg.scenario, cfg.seed))


def assert_close64(actual, expected, what: str = "") -> None:
    """``actual`` equals ``expected`` to the float64 executor tolerance (see F64_ATOL); the
    message gives the largest difference and where."""
    why = float64_difference(actual, expected)
    assert why is None, f"{what}: {why}"


def assert_tree_close64(a, b, where: str = "value") -> None:
    """Two nested dicts / lists of tensors and numbers agree: the same keys, tensors and floats
    to the float64 executor tolerance, everything else equal."""
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_tree_close64(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_close64(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor) and a.is_floating_point():
        assert_close64(b, a, where)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, float):
        assert_close64(b, a, where)
    else:
        assert a == b, (where, a, b)


def assert_history_same(seq, bat, keys=("global_acc", "local_acc", "train_acc")) -> None:
    """Two float64 runs evaluated alike: the accuracies ``keys`` equal (a prediction flips only
    where two logits agree to about 1e-13), ``train_loss`` to the tolerance."""
    for hs, hb in zip(seq.history, bat.history, strict=True):
        for key in keys:
            assert hb.get(key) == hs.get(key), (hs["round"], key, hb.get(key), hs.get(key))
        if "train_loss" in hs:
            assert_close64(hb["train_loss"], hs["train_loss"], f"round {hs['round']} train_loss")


def run_executors(cfg, executors, data=None, callbacks=()):
    """The run of ``cfg`` on each executor of ``executors``, in float64 (see F64_ATOL), on one
    scenario; a fresh algorithm each."""
    with float64():
        data = build_float64(cfg) if data is None else as_float64(data)
        out = []
        for executor in executors:
            algo = make_algorithm(cfg, data, torch.device("cpu"))
            out.append(Simulator(algo, data, sim_config(cfg), executor, list(callbacks)).run())
    return out


def run_both(cfg, chunk_size=64, vectorize="vmap"):
    """The run of ``cfg`` on the sequential and on the batched executor, in float64."""
    return run_executors(cfg, (SequentialExecutor(), BatchedExecutor(chunk_size, vectorize)))


def assert_same(seq, bat):
    """Two float64 runs agree: server parameters and buffers to F64_ATOL, accuracies exactly,
    losses to the tolerance."""
    for key in seq.server["params"]:
        assert_close64(bat.server["params"][key], seq.server["params"][key], key)
    for key in seq.server["buffers"]:
        assert_close64(bat.server["buffers"][key], seq.server["buffers"][key], key)
    assert_history_same(seq, bat)


def gated_config(tmp_path: Path, name: str = "tiny", **over) -> Path:
    (tmp_path / "gate.py").write_text(GATE_PLUGIN)
    over = {"algorithm__name": "gatedavg", "plugins": [str(tmp_path / "gate.py")], **over}
    return write_config(tmp_path, name, **over)


def gate_env(tmp_path: Path) -> tuple[dict, Path]:
    gate = tmp_path / "gate"
    return {**os.environ, "FEDSHIFT_TEST_GATE": str(gate)}, gate


def start(args: list, cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CLI_WITH_SIGINT, *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_blocked(proc: subprocess.Popen, gate: Path, timeout: float = 600) -> None:
    """Until the run of ``proc`` waits at the gate (round 1 saved), or fail if it ended."""
    flag = Path(f"{gate}.waiting")
    deadline = time.monotonic() + timeout
    while not flag.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (code {proc.returncode}) before its gate: {err}{out}")
        assert time.monotonic() < deadline, "the run never reached round 2"
        time.sleep(0.02)


def linear_algo(cls=FedRC, **hp):
    """A FedRC with 1-d inputs, 3 classes and K=2 linear models with hand-set weights."""
    ops = ModelOps(lambda: nn.Linear(1, 3), torch.device("cpu"))
    algo = cls(cls.Params(num_clusters=2, **hp), ops, 3, **RUN)
    w = [torch.tensor([[1.0], [0.0], [-1.0]]), torch.tensor([[-1.0], [0.5], [1.0]])]
    init = [({"weight": wk, "bias": torch.zeros(3)}, {}) for wk in w]
    x = torch.tensor([[2.0], [-1.0], [0.5], [1.5]])
    y = torch.tensor([0, 2, 1, 0])
    data = ClientData(cid=0, train_idx=torch.arange(4), y_train=y, inputs=lambda i: x[i])
    return algo, algo.init_server_state(init), data, x


def timeline_config(tmp_path, algorithm="feddaa", params=None, **over):
    """Digits (8x8), 8 clients, 3 steps x 2 rounds: concepts 2 -> 3 -> 3, rotations."""
    return validate_config(
        tiny_config(
            tmp_path,
            scenario={
                "dataset": "digits",
                "num_clients": 8,
                "concepts": ["identity", "reverse", "shift:1"],
                "test_fraction": 0.2,
                "test_clients": {"enabled": True, "adapt_fraction": 0.5},
                "timeline": {
                    "rounds_per_step": 2,
                    "pieces": 9,
                    "steps": [
                        {"concepts": [0, 1]},
                        {"concepts": [0, 1, 2], "style": "rotate:90"},
                        {"concepts": [0, 1, 2], "style": "rotate:180"},
                    ],
                },
            },
            model={"name": "lenet_small"},
            algorithm={"name": algorithm, "params": params or {}},
            train={"batch_size": 16, "lr": 0.05, "participation": 0.5, "keep_momentum": True},
            **over,
        )
    )


def assert_resume_equals_uninterrupted(cfg, stop_at: int):
    """Run ``cfg`` whole, then again killed after round ``stop_at`` and resumed: the same
    metrics but timings. The uninterrupted run's result."""
    full = run_experiment(cfg)
    raw = cfg.model_dump(mode="json")
    raw["name"] = "part"
    with pytest.raises(_Killed):
        run_experiment(validate_config(raw), callbacks=[_StopAfter(stop_at)], overwrite=True)
    resumed = run_experiment(validate_config(raw), resume=True)
    strip = lambda h: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in h]  # noqa: E731
    assert strip(resumed.history) == strip(full.history)
    return full


#: every corruption, in registration order (the order "all" expands to): CIFAR-10-C's 19 as
#: defined in cifar10c.py, then the FMNIST-C / MNIST-C ones of fmnistc.py
ALL_CORRUPTIONS = [
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "speckle_noise",
    "defocus_blur",
    "gaussian_blur",
    "motion_blur",
    "zoom_blur",
    "glass_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "saturate",
    "pixelate",
    "jpeg_compression",
    "elastic_transform",
    "spatter",
    "identity",
    "shear",
    "scale",
    "rotate",
    "translate",
    "stripe",
    "dotted_line",
    "zigzag",
    "canny_edges",
]


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """The command in this process (fast; what the user types, its exit code and stderr), run
    from ``tmp_path``; the SIGTERM handler the CLI installs is put back afterwards."""
    monkeypatch.chdir(tmp_path)
    handler = signal.getsignal(signal.SIGTERM)

    def call(*args: str) -> Ran:
        res = CliRunner().invoke(app, list(map(str, args)))
        if res.exception and not isinstance(res.exception, SystemExit):
            raise res.exception
        return Ran(res.exit_code, res.stdout, res.stderr)

    yield call
    signal.signal(signal.SIGTERM, handler)


class Ran:
    """What a command did: exit code, standard output, standard error."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def line(self) -> str:
        """The one line the command wrote to stderr (asserting it is one, without traceback)."""
        lines = [x for x in self.err.splitlines() if x.strip()]
        assert "Traceback" not in self.err, self.err
        assert len(lines) == 1, self.err
        return lines[0]

    def error(self, code: int = 2) -> str:
        """The one-line error of a command that had to fail with ``code``."""
        assert self.code == code, (self.code, self.err, self.out[-2000:])
        return self.line()


def write_config(tmp_path: Path, name: str = "tiny", **over) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, name=name, **over)))
    return path


#: FedAvg whose rounds after the first wait for the file $FEDSHIFT_TEST_GATE (when set); it
#: touches <gate>.waiting first, so a test knows that round 1 is saved and the run is blocked
GATE_PLUGIN = """
import os
import time
from pathlib import Path

import fedshift
from fedshift.algorithms.fedavg import FedAvg


@fedshift.register
class GatedAvg(FedAvg):
    name = "gatedavg"

    def aggregate(self, server, results, ctx):
        gate = os.environ.get("FEDSHIFT_TEST_GATE")
        if gate and ctx.round >= 2:
            Path(gate + ".waiting").touch()
            deadline = time.monotonic() + 600
            while not Path(gate).exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return super().aggregate(server, results, ctx)
"""


#: runs the CLI with SIGINT raising KeyboardInterrupt, as a user's terminal gives it: a shell's
#: background job (`cmd &`, nohup) starts with SIGINT ignored, and Python then never raises it.
#: Set in the child itself, not by a preexec_fn: running Python between fork and exec in a
#: process that holds gRPC threads (an earlier test's server) can abort the child.
_CLI_WITH_SIGINT = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'fedshift'; runpy.run_module('fedshift.cli', run_name='__main__')"
)


class _Killed(Exception):
    """Stands for a kill (a KeyboardInterrupt would also stop pytest)."""


class _StopAfter:
    """A callback that interrupts the run after a round, as a kill would (checkpoint kept)."""

    def __init__(self, rnd: int) -> None:
        self.rnd = rnd

    def on_start(self, sim, state) -> None: ...

    def on_round_end(self, sim, state, metrics) -> None:
        if state.round >= self.rnd:
            raise _Killed

    def on_end(self, sim, state) -> None: ...


# ------------------------------------------------------------------ what the pages show

#: the guide to writing an algorithm, whose example blocks the tests run
GUIDE = ROOT / "docs" / "writing-an-algorithm.md"


def example_blocks(kind: str) -> list[str]:
    """The ``kind`` code blocks between the guide's example markers."""
    text = GUIDE.read_text()
    part = re.search(r"<!-- example:start -->(.*?)<!-- example:end -->", text, re.S)
    assert part, "the guide lost its example markers"
    return re.findall(rf"```{kind}\n(.*?)```", part.group(1), re.S)


def api_example() -> str:
    text = (ROOT / "docs" / "getting-started.md").read_text()
    block = re.search(
        r"<!-- python-api:start -->\s*```python\n(.*?)```\s*<!-- python-api:end -->", text, re.S
    )
    assert block, "docs/getting-started.md lost its Python API example"
    return block.group(1)


#: a FedAvg whose server counts its rounds and reports the count: the plugin's own code ran
PLUGIN = textwrap.dedent(
    """
    from fedshift.algorithms import FedAvg, GlobalModel, register


    class CountingServer(GlobalModel, total=False):
        count: int


    @register
    class CountingAvg(FedAvg):
        name = "{name}"
        ServerState = CountingServer

        def aggregate(self, server, results, ctx):
            out = super().aggregate(server, results, ctx)
            return {{**out, "count": server.get("count", 0) + 1}}

        def round_diagnostics(self, server):
            return {{"plugin_rounds": server.get("count", 0)}}
    """
)


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch) -> Path:
    """A folder of mode 0500 in ``tmp_path``. Mode bits do not stop root, so there (as in CI
    containers) creating a file inside it fails as the kernel fails it for everyone else:
    ``tempfile.mkstemp`` in it raises Permission denied."""
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    if os.geteuid() == 0:
        real = tempfile.mkstemp

        def mkstemp(*args, **kwargs):
            where = Path(kwargs.get("dir") or (args[2] if len(args) > 2 else "."))
            if folder in (where.resolve(), *where.resolve().parents):
                raise PermissionError(13, "Permission denied")
            return real(*args, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return folder
