"""The options the commands share (typer annotations)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from fedshift.cli.console import ray_placement

Opt, Arg = typer.Option, typer.Argument
Overrides = Annotated[list[str] | None, Arg(help="key=value overrides, e.g. train.rounds=5")]
DataDir = Annotated[str | None, Opt(help="datasets folder (default: $FEDSHIFT_DATA, system's)")]
Protocol = Annotated[
    str, typer.Option(help="last | best | best_train | best_gm | best_val | steps | top5")
]
# the options of the commands that run many jobs (compare, reproduce, sweep; fedshift.studies.jobs)
Jobs = Annotated[int, typer.Option(help="runs in parallel local processes")]
Fresh = Annotated[bool, typer.Option(help="re-run runs whose directory already holds this config")]
Ray = Annotated[bool, typer.Option("--ray", help="each run a Ray task (local Ray by default)")]
RayAddress = Annotated[str | None, typer.Option(help="Ray cluster, e.g. HEAD:6379 (implies --ray)")]
GpusPerRun = Annotated[float | None, typer.Option(help="GPUs per Ray task, e.g. 0.25 (default 0)")]
CpusPerRun = Annotated[float | None, typer.Option(help="CPUs per Ray task (default 1)")]
Lockstep = Annotated[
    bool | None,
    typer.Option(
        help="train runs that differ only in lr, momentum, weight decay or seed as one job "
        "(in this process; each run's numbers as alone); default: on a GPU only"
    ),
]
Log = Annotated[str | None, Opt(help="tracking sinks, e.g. tensorboard,wandb,mlflow (config: log)")]

#: each of those options: its annotation and default
RUN_OPTIONS = {
    "jobs": (Jobs, 1),
    "fresh": (Fresh, False),
    "ray": (Ray, False),
    "ray_address": (RayAddress, None),
    "gpus_per_run": (GpusPerRun, None),
    "cpus_per_run": (CpusPerRun, None),
    "lockstep": (Lockstep, None),
}


def many_runs(command: Callable[..., Any]) -> Callable[..., Any]:
    """Command decorator: the options of :data:`RUN_OPTIONS` (--jobs, --fresh, --ray,
    --ray-address, --gpus-per-run, --cpus-per-run, --lockstep/--no-lockstep) added after the
    command's own, and handed to it as ``runs``: the keyword arguments of
    :func:`fedshift.studies.jobs.execute` (``workers``, ``fresh``, ``ray``: a placement of Ray
    tasks or None, ``lockstep``)."""
    sig = inspect.signature(command, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "runs"]
    kind = inspect.Parameter.KEYWORD_ONLY
    added = [
        inspect.Parameter(k, kind, annotation=a, default=d) for k, (a, d) in RUN_OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        o = {k: kwargs.pop(k, default) for k, (_, default) in RUN_OPTIONS.items()}
        place = ray_placement(o["ray"], o["ray_address"], o["gpus_per_run"], o["cpus_per_run"])
        runs = {"workers": o["jobs"], "fresh": o["fresh"], "ray": place, "lockstep": o["lockstep"]}
        return command(*args, **kwargs, runs=runs)

    params = [*(p.replace(kind=kind) for p in own), *added]
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


Plugins = Annotated[list[str] | None, Opt(help="a .py file or module of your own (repeatable)")]
