"""Shared fixtures: tiny configs on data that is always available (synthetic, digits)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from fedshift.algorithms.base import TrainDefaults
from fedshift.config import validate_config

ROOT = Path(__file__).resolve().parents[1]

#: the run settings an algorithm built by hand (outside the runner) is given
RUN = {"seed": 0, "train": TrainDefaults()}


def on_ci() -> bool:
    """Whether the tests run on CI (``.ci/run`` and most CI services set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_extra(module: str, extra: str) -> ModuleType:
    """Import ``module`` of the optional extra ``extra`` (at a test module's top, in a fixture
    or in a test). Missing, it fails the test (or the module's collection) on CI, where every
    extra is installed and a test must not silently stop running; elsewhere it skips. Either
    way the message names what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        message = f"{module} is missing ({err}): pip install -e '.[{extra}]'"
        if not on_ci():
            pytest.skip(message, allow_module_level=True)
        pytest.fail(f"{message} (on CI every test must run)", pytrace=False)


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
