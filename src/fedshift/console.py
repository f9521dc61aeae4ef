"""The command line's terminal side: the consoles, one-line user errors with exit codes, config
loading with ``--data-dir``, progress bars for simulator callbacks, and the ``--ray`` options
of the commands that run many jobs as a placement of Ray tasks."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from fedshift.errors import FedshiftError

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
            err_console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(getattr(err, "exit_code", 2)) from None
        except KeyboardInterrupt:
            err_console.print(
                "interrupted: completed rounds are saved in the run directory; "
                "continue with `fedshift run --resume RUN_DIR`"
            )
            raise typer.Exit(130) from None

    return wrapper


def _interrupt(signum, frame) -> None:  # noqa: ARG001
    raise KeyboardInterrupt


#: plugins named on the command line (``fedshift --plugin FILE ...``), resolved
_plugins: list[str] = []


def use_plugins(entries: list[str]) -> None:
    """Import the command line's ``--plugin`` entries now (``fedshift list`` shows their
    names) and add them to every config this process loads (so workers import them too)."""
    from fedshift.plugins import load_plugins, resolve

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


def find_config(path: str) -> Path:
    """A config path as given, or relative to the fedshift source tree (editable installs)."""
    for p in (Path(path), Path(__file__).resolve().parents[2] / path):
        if p.is_file():
            return p
    raise FedshiftError(f"config {path!r} not found (run from the fedshift folder)")


def round_bars(label: str) -> list:
    """Simulator callbacks drawing a progress bar for run ``label``."""
    from fedshift.progress import RoundBar

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
