"""Commands over many runs: ``compare``, ``report``, ``reproduce`` (a paper's table) and
``sweep`` (a grid of settings)."""

from __future__ import annotations

from typing import Annotated

import typer

from fedshift.cli.console import console, err_console, find_config, load, user_errors
from fedshift.cli.options import DataDir, Log, Opt, Overrides, Protocol, many_runs
from fedshift.core.errors import FedshiftError


@user_errors
@many_runs
def compare(
    config: Annotated[str, typer.Argument(help="YAML config (its algorithm is replaced)")],
    overrides: Overrides = None,
    algorithms: str = Opt("fedavg", help="comma-separated algorithm names"),
    protocol: Annotated[
        str | None, typer.Option(help="as for report; default: steps with a timeline, else last")
    ] = None,
    data_dir: DataDir = None,
    log: Log = None,
    tune: list[str] | None = Opt(None, help="choose per method on validation: lr=0.01,0.05"),
    seeds: int | None = Opt(None, help="with --tune: seeds per grid point (default 2)"),
    runs: dict | None = None,
) -> None:
    """Run several algorithms on one scenario and seed; --tune: each at its validated value.

    Each run (--tune: algorithm x value x seed) resumes on its own; --jobs, --ray: in parallel.
    """
    from fedshift.cli.progress import RunBars
    from fedshift.reporting.tables import comparison_tables
    from fedshift.studies.compare import compare as run_compare
    from fedshift.studies.tune import parse_tune, tune_compare, tuned_tables
    from fedshift.tracking import log_override

    base = load(config, [*(overrides or []), *log_override(log)], data_dir)

    def diverged(name, err) -> None:
        err_console.print(f"[red]{name}:[/red] {err}", highlight=False, soft_wrap=True)

    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    args = {**(runs or {}), "listener": RunBars(console)}
    if seeds is not None and not tune:
        raise FedshiftError("--seeds goes with --tune; a plain compare runs the config's seed")
    if tune:
        grid, n = parse_tune(tune), 2 if seeds is None else seeds
        t = tune_compare(base, names, grid, seeds=n, protocol=protocol or "last", **args)
        tables, files = tuned_tables(t), t.files
    else:
        res = run_compare(base, names, protocol=protocol, on_diverged=diverged, **args)
        tables, files = comparison_tables(res, base), res.files
    for item in tables:
        console.print(item, highlight=False, markup=False)
    console.print("files: " + ", ".join(str(f) for f in files))


@user_errors
def report(
    run_dirs: Annotated[list[str], typer.Argument(help="run directories")],
    protocol: Protocol = "best_train",
    markdown: str | None = Opt(None, help="also write the table here"),
    plot: str | None = Opt(None, help="also write a PNG of the curves here"),
) -> None:
    """Print a table of finished (or running) runs under a round protocol."""
    from fedshift.studies.report import write_report

    for table in write_report(run_dirs, protocol, markdown, plot):
        console.print(table)


@user_errors
@many_runs
def reproduce(
    table: Annotated[str, typer.Argument(help="e.g. fedrc-table1")],
    overrides: Overrides = None,
    dataset: str = Opt("fmnist", help="the table's column"),
    rounds: int | None = Opt(None, help="fewer rounds than the paper"),
    rounds_per_step: int | None = Opt(None, help="drift tables: fewer rounds per time step"),
    clients: int | None = Opt(None, help="fewer clients than the paper"),
    only: str | None = Opt(None, help="comma-separated row labels to run"),
    seeds: int = Opt(1, help="independent runs per row (seeds s, s+1, ...)"),
    lr_grid: str | None = Opt(None, help="learning rates per row, e.g. 0.01,0.03 or 'paper'"),
    select_on: str | None = Opt(None, help="metric the best lr is chosen on (default: table's)"),
    follow: str | None = Opt(
        None,
        help="where paper and authors' code differ: code | paper | both (a row each); "
        "default: the table's (paper for FedDAA's tables, else code)",
    ),
    data_dir: DataDir = None,
    report_only: bool = Opt(
        False, help="train nothing: the table from the runs' files (e.g. committed artifacts)"
    ),
    log: Log = None,
    runs: dict | None = None,
) -> None:
    """Re-run a paper table: our mean ± std beside the paper's, as a table, markdown and PNGs.

    Every row x lr x seed is an independent, resumable run; a diverged run is marked in the
    table and the others go on (see docs/reproducing.md).
    """
    from fedshift.cli.progress import JobBars
    from fedshift.studies.reproduce import parse_lr_grid, plan_table, reproduce_table, table_spec
    from fedshift.tracking import log_override

    spec = table_spec(table, dataset)
    ov = [*spec.column_overrides.get(dataset, ()), *(overrides or []), *log_override(log)]
    ov += [f"train.rounds={rounds}"] if rounds else []
    ov += [f"scenario.num_clients={clients}"] if clients else []
    ov += [f"scenario.timeline.rounds_per_step={rounds_per_step}"] if rounds_per_step else []
    base = load(str(find_config(spec.configs[dataset])), ov, data_dir)
    labels = [x.strip() for x in only.split(",")] if only else None
    args = {"labels": labels, "seeds": seeds, "lr_grid": parse_lr_grid(spec, lr_grid)}
    args.update(follow=follow)
    run_args = {**(runs or {}), "select_on": select_on, "report_only": report_only}
    bars = JobBars(len(plan_table(spec, dataset, base, **args)), console)
    with bars.progress:
        rep = reproduce_table(spec, dataset, base, **args, **run_args, listener=bars)
    console.print(rep.table.to_rich())
    if rep.versus:
        console.print(rep.versus.to_rich())
    if rep.drift:
        console.print(rep.drift.table.to_rich())
    console.print("files: " + ", ".join(str(f) for f in rep.files))


@user_errors
@many_runs
def sweep(
    config: Annotated[str, typer.Argument(help="YAML config")],
    overrides: Overrides = None,
    protocol: str | None = Opt(None, help="default: steps with a timeline, else last"),
    metric: str | None = Opt(None, help="default: global_acc if recorded, else local_acc"),
    data_dir: DataDir = None,
    log: Log = None,
    runs: dict | None = None,
) -> None:
    """Run a grid as resumable runs; print mean ± std per setting and the best setting.

    An override with a comma is an axis (train.lr=0.01,0.03; seed=0,1,2 are the seeds), e.g.
    `fedshift sweep configs/quickstart.yaml train.lr=0.01,0.03 seed=0,1,2`.
    """
    from fedshift.cli.progress import JobBars
    from fedshift.config.grid import parse_grid
    from fedshift.studies.sweep import plan_sweep, run_sweep
    from fedshift.tracking import log_override

    grid = parse_grid([*(overrides or []), *log_override(log)])
    todo = plan_sweep(config, grid, data_dir=data_dir)
    bars = JobBars(len(todo.jobs), console)
    run_args = {**(runs or {}), "listener": bars}
    with bars.progress:
        rep = run_sweep(todo, protocol=protocol, metric=metric, **run_args)
    console.print(rep.table.to_rich())
    console.print(rep.best_line)
    console.print("files: " + ", ".join(str(f) for f in rep.files))
