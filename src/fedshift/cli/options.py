"""The options the commands share (typer annotations)."""

from __future__ import annotations

from typing import Annotated

import typer

Opt, Arg = typer.Option, typer.Argument
Overrides = Annotated[list[str] | None, Arg(help="key=value overrides, e.g. train.rounds=5")]
DataDir = Annotated[str | None, Opt(help="datasets folder (default: $FEDSHIFT_DATA, system's)")]
Protocol = Annotated[
    str, typer.Option(help="last | best | best_train | best_gm | best_val | steps | top5")
]
# the options of the commands that run many jobs (reproduce, sweep; see fedshift.studies.jobs)
Jobs = Annotated[int, typer.Option(help="runs in parallel local processes")]
Fresh = Annotated[bool, typer.Option(help="re-run runs whose directory already holds this config")]
Ray = Annotated[bool, typer.Option("--ray", help="each run a Ray task (local Ray by default)")]
RayAddress = Annotated[str | None, typer.Option(help="Ray cluster, e.g. HEAD:6379 (implies --ray)")]
GpusPerRun = Annotated[float | None, typer.Option(help="GPUs per Ray task, e.g. 0.25 (default 0)")]
CpusPerRun = Annotated[float | None, typer.Option(help="CPUs per Ray task (default 1)")]
Log = Annotated[str | None, Opt(help="tracking sinks, e.g. tensorboard,wandb,mlflow (config: log)")]


Plugins = Annotated[list[str] | None, Opt(help="a .py file or module of your own (repeatable)")]
