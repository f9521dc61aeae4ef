"""Commands about one run: ``run``, ``scenario`` (the clients of a config, no training),
``flower`` (a run as a Flower simulation) and ``export`` (clients as folders)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedshift.cli import console as con
from fedshift.cli.console import console, load, round_bars, user_errors
from fedshift.cli.options import (
    DataDir,
    Log,
    Opt,
    Overrides,
)


@user_errors
def run(
    config: Annotated[str | None, typer.Argument(help="YAML config")] = None,
    overrides: Overrides = None,
    resume: str | None = Opt(None, help="continue the run in this directory"),
    data_dir: DataDir = None,
    overwrite: bool = Opt(False, help="replace an existing run directory"),
    log: Log = None,
) -> None:
    """Run one experiment; writes runs/<name>/ (config, metrics.jsonl, summary.json, plots)."""
    from fedshift.reporting.tables import rich_table, table_rows
    from fedshift.run.experiment import run_experiment
    from fedshift.studies.compare import training_notes
    from fedshift.tracking import log_override

    cfg = con.load_run(config, [*(overrides or []), *log_override(log)], resume, data_dir)
    for line in training_notes({cfg.algorithm.name: cfg}):  # settings the algorithm chose
        console.print(line, highlight=False, markup=False)
    bars = round_bars(cfg.algorithm.name)
    res = run_experiment(
        cfg, run_dir=resume, resume=bool(resume), overwrite=overwrite, callbacks=bars
    )
    for protocol in ("last", "best_train") + (("steps",) if "step" in res.history[-1] else ()):
        console.print(rich_table(table_rows({cfg.algorithm.name: res.history}, protocol), protocol))
    console.print(f"run directory: {res.run_dir}")


@user_errors
def scenario(
    config: Annotated[str, typer.Argument(help="YAML config")],
    overrides: Overrides = None,
    out: Annotated[
        str | None, typer.Option(help="PNG path (default runs/<name>/scenario.png)")
    ] = None,
    data_dir: DataDir = None,
    limit: int = Opt(40, help="clients listed in the table"),
) -> None:
    """Build a scenario, print a per-client summary table (with label noise, its summary) and
    the leakage audit of the local test splits (per time step), and write a PNG of the
    clients (and, with a timeline, timeline.png beside it: the true concept of every client per
    round)."""
    from fedshift.data.scenario import build_scenario
    from fedshift.reporting.plots import plot_scenario, plot_timeline
    from fedshift.reporting.tables import audit_table, noise_table, scenario_table

    cfg = load(config, overrides, data_dir)
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    console.print(scenario_table(data, limit))
    if len(data.clients) > limit:
        console.print(f"... {len(data.clients) - limit} more clients (--limit)")
    noise = noise_table(data)
    if noise is not None:
        console.print(noise)
    audit = audit_table(data)
    if audit is not None:
        console.print(audit)
    png = Path(out or Path(cfg.output.dir) / cfg.name / "scenario.png")
    console.print(f"plot: {plot_scenario(data, png)}")
    if data.steps:  # drift: the true concept of every client per round
        tl = plot_timeline(data, cfg.train.rounds, png.with_name("timeline.png"))
        console.print(f"timeline: {tl}")


@user_errors
def flower(
    config: Annotated[str, typer.Argument(help="YAML config")],
    overrides: Overrides = None,
    supernodes: int | None = Opt(None, help="Flower SuperNodes (default: one per client)"),
    cpus: int = Opt(2, help="CPUs for Flower's Ray backend, one ClientApp each"),
    data_dir: DataDir = None,
    overwrite: bool = Opt(False, help="replace an existing run directory"),
) -> None:
    """Run one experiment as a Flower app in Flower's simulation engine (same run directory)."""
    from fedshift.flower.simulation import ServerRun, result_tables, run_flower_simulation

    cfg = load(config, overrides, data_dir)
    run = ServerRun(cfg, overwrite=overwrite, callbacks=round_bars(cfg.algorithm.name))
    (res,) = run_flower_simulation([run], supernodes, cpus)
    console.print(*result_tables(cfg.algorithm.name, res), f"run directory: {res.run_dir}")


@user_errors
def export(
    config: Annotated[str, typer.Argument(help="YAML config")],
    out: Annotated[str, typer.Argument(help="folder for the clients' folders")],
    overrides: Overrides = None,
    data_dir: DataDir = None,
    overwrite: bool = Opt(False, help="replace the export in a folder that is not empty"),
) -> None:
    """Write every training client of a scenario to a folder of its own (a deployment's node
    data: client.json, train.npz, test.npz; readable by you only)."""
    from fedshift.data.client_folders import check_export_target, export_clients
    from fedshift.data.scenario import build_scenario

    cfg = load(config, overrides, data_dir)
    check_export_target(Path(out), overwrite)  # before the scenario is built
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    made_by = f"fedshift export {config} (seed {cfg.seed})"
    folders = export_clients(data, Path(out), made_by=made_by, overwrite=overwrite)
    sizes = ", ".join(f"{c.cid}: {c.num_train}+{c.num_test}" for c in data.clients)
    console.print(f"{len(folders)} client folders in {out} (train+test samples: {sizes})")
    if data.test_clients:
        console.print(f"not exported: {len(data.test_clients)} test-only clients (simulation only)")
