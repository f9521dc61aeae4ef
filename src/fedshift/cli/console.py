"""The command line's terminal side: the consoles, one-line user errors with exit codes, config
loading with ``--data-dir``, progress bars for simulator callbacks, and the ``--ray`` options
of the commands that run many jobs as a placement of Ray tasks."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from fedshift.core.errors import FedshiftError

console = Console(width=None if sys.stdout.isatty() else 160)  # full tables in logs and pipes
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 400)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Command decorator: a user error exits 2 (a diverged run 3) with one line, an interrupt
    exits 130; SIGTERM counts as an interrupt."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            return fn(*args, **kwargs)
        except FedshiftError as err:
            text = escape(str(err))  # as written: `pip install "fedshift[tracking]"` too
            err_console.print(f"[red]error:[/red] {text}", highlight=False, soft_wrap=True)
            raise typer.Exit(getattr(err, "exit_code", 2)) from None
        except KeyboardInterrupt as err:
            hint = interrupt_hint(fn.__name__, getattr(err, "run_dir", None), kwargs)
            err_console.print(hint, highlight=False, soft_wrap=True)
            if fn.__name__ == "flower":
                _exit_now(130)
            raise typer.Exit(130) from None

    return wrapper


#: the commands that run many runs through fedshift.studies (each run resumable on its own)
MANY_RUNS = ("compare", "sweep", "reproduce")


def interrupt_hint(command: str, run_dir: str | None, options: dict[str, Any]) -> str:
    """What an interrupted command kept and how to go on, as that command really can: ``run``
    resumes its folder (``run_dir``, set by the runner), the commands of many runs resume
    every unfinished run when run again, ``flower`` has no ``--resume`` of its own."""
    if command in MANY_RUNS:
        again = "the same command" + (" without --fresh" if options.get("fresh") else "")
        return (
            f"interrupted: every run keeps its last completed round; run {again} again: "
            "finished runs are reused and unfinished ones resume from their last checkpoint"
        )
    if command not in ("run", "flower"):
        return "interrupted"
    if run_dir is None or not (Path(run_dir) / "checkpoint.pt").is_file():
        return "interrupted before a round was saved; start the run again with the same command"
    saved = f"interrupted: completed rounds are saved in {run_dir}"
    if command == "run":
        return f"{saved}; continue with `fedshift run --resume {run_dir}`"
    return (
        f"{saved}; `fedshift flower` cannot resume a run: continue it on fedshift's own "
        f"simulator with `fedshift run --resume {run_dir}`, or start it over with `fedshift "
        "flower ... --overwrite`"
    )


def _interrupt(signum, frame) -> None:  # noqa: ARG001
    raise KeyboardInterrupt


def _exit_now(code: int) -> None:
    """End the process at once, Ray stopped first: an interrupted Flower simulation can leave
    worker threads waiting forever on actors that are gone, which a normal exit would join."""
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


#: plugins named on the command line (``fedshift --plugin FILE ...``), resolved
_plugins: list[str] = []


def use_plugins(entries: list[str]) -> None:
    """Import the command line's ``--plugin`` entries now (``fedshift list`` shows their
    names) and add them to every config this process loads (so workers import them too)."""
    from fedshift.core.plugins import load_plugins, resolve

    _plugins.clear()  # a failed entry must not stay behind for the next command in-process
    resolved = [resolve(e) for e in entries]
    load_plugins(resolved)
    _plugins.extend(resolved)


def load(config: str | None, overrides: list[str] | None, data_dir: str | None):
    """A validated config from a YAML file (or the defaults) with overrides, --data-dir and the
    command line's plugins."""
    from fedshift.config import load_config

    cfg = load_config(config, [*(overrides or []), *([f"data_dir={data_dir}"] if data_dir else [])])
    extra = [e for e in _plugins if e not in cfg.plugins]
    return cfg.model_copy(update={"plugins": [*cfg.plugins, *extra]}) if extra else cfg


def load_run(config: str | None, overrides: list[str] | None, resume: str | None, data_dir):
    """The config of ``fedshift run``: CONFIG with its overrides, or with ``--resume DIR`` the
    run's own config.yaml (a ``key=value`` in CONFIG's place is then an override too)."""
    if not resume:
        if config is None:
            raise FedshiftError("give a CONFIG file (e.g. configs/quickstart.yaml) or --resume DIR")
        return load(config, overrides, data_dir)
    if not (Path(resume) / "config.yaml").is_file():
        raise FedshiftError(f"--resume {resume}: no config.yaml there; is it a run directory?")
    if config is not None and "=" not in config:
        raise FedshiftError(
            f"give CONFIG ({config}) or --resume {resume}, not both: a resumed run keeps the "
            "config.yaml of its folder (key=value overrides still apply)"
        )
    extra = [config] if config is not None else []
    return load(str(Path(resume) / "config.yaml"), [*extra, *(overrides or [])], data_dir)


def find_config(path: str) -> Path:
    """A config path as given, else one of the configs fedshift ships (``configs/...``, in
    the installed package as in the source tree)."""
    package = Path(__file__).resolve().parents[1]  # src/fedshift
    for p in (Path(path), package / path, package.parents[1] / path):
        if p.is_file():
            return p
    raise FedshiftError(
        f"config {path!r} not found: give a YAML file's path, or one of the configs fedshift "
        "ships (configs/quickstart.yaml, configs/examples/..., configs/papers/...)"
    )


def round_bars(label: str) -> list:
    """Simulator callbacks drawing a progress bar for run ``label``."""
    from fedshift.cli.progress import RoundBar

    return [RoundBar(label, console)]


def ray_placement(ray: bool, address: str | None, gpus: float | None, cpus: float | None):
    """The ``--ray`` options as a :class:`~fedshift.studies.jobs.RayPlacement` (None: local processes);
    ``--ray-address`` implies ``--ray``, the per-run resources need it."""
    if not (ray or address):
        if gpus is not None or cpus is not None:
            raise FedshiftError("--gpus-per-run / --cpus-per-run size Ray tasks: add --ray")
        return None
    from fedshift.engine.ray_session import RaySettings
    from fedshift.studies.jobs import RayPlacement

    return RayPlacement(RaySettings(address=address), 1.0 if cpus is None else cpus, gpus or 0.0)
