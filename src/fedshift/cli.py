"""The ``fedshift`` command: parses arguments, calls the library, prints (see ``fedshift --help``).

User mistakes (a bad config, a missing dataset, an unknown name, an output folder that cannot
be written) print one line and exit with code 2; a run whose training diverges prints one line
(the round and a hint) and exits with code 3; an interrupted run says how to resume it and
exits with 130.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from fedshift import console as con
from fedshift.console import console, err_console, find_config, load, round_bars, user_errors
from fedshift.errors import FedshiftError
from fedshift.flower.deploy_cli import deploy_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="fedshift: federated learning under label, feature and concept shift.",
)
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


@app.callback()
def options(plugin: Plugins = None) -> None:
    """fedshift: federated learning under label, feature and concept shift."""
    user_errors(con.use_plugins)(plugin or [])


@app.command()
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
    from fedshift.report import rich_table, table_rows
    from fedshift.runner import run_experiment
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


@app.command()
@user_errors
def compare(
    config: Annotated[str, typer.Argument(help="YAML config (its algorithm is replaced)")],
    overrides: Overrides = None,
    algorithms: str = Opt("fedavg", help="comma-separated algorithm names"),
    protocol: Annotated[
        str | None, typer.Option(help="as for report; default: steps with a timeline, else last")
    ] = None,
    data_dir: DataDir = None,
    fresh: bool = Opt(False, help="train every algorithm again (default: resume or reuse runs)"),
    log: Log = None,
    tune: list[str] | None = Opt(None, help="choose per method on validation: lr=0.01,0.05"),
    seeds: int | None = Opt(None, help="with --tune: seeds per grid point (default 2)"),
) -> None:
    """Run several algorithms on one scenario and seed; --tune: each at its validated value."""
    from fedshift.report import comparison_tables, tuned_tables
    from fedshift.studies.compare import compare as run_compare
    from fedshift.studies.tune import parse_tune, tune_compare
    from fedshift.tracking import log_override

    base = load(config, [*(overrides or []), *log_override(log)], data_dir)

    def diverged(name, err) -> None:
        err_console.print(f"[red]{name}:[/red] {err}", highlight=False, soft_wrap=True)

    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    args = {"callbacks": round_bars, "fresh": fresh}
    if seeds is not None and not tune:
        raise FedshiftError("--seeds goes with --tune; a plain compare runs the config's seed")
    if tune:
        grid, n = parse_tune(tune), seeds or 2
        t = tune_compare(base, names, grid, seeds=n, protocol=protocol or "last", **args)
        tables, files = tuned_tables(t), t.files
    else:
        res = run_compare(base, names, protocol=protocol, on_diverged=diverged, **args)
        tables, files = comparison_tables(res, base), res.files
    for item in tables:
        console.print(item, highlight=False, markup=False)
    console.print("files: " + ", ".join(str(f) for f in files))


@app.command()
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
    """Build a scenario, print a per-client summary table and the leakage audit of the local
    test splits (per time step), and write a PNG of the clients (and, with a timeline,
    timeline.png beside it: the true concept of every client per round)."""
    from fedshift.data.scenario import build_scenario
    from fedshift.plots import plot_scenario, plot_timeline
    from fedshift.report import audit_table, scenario_table

    cfg = load(config, overrides, data_dir)
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    console.print(scenario_table(data, limit))
    if len(data.clients) > limit:
        console.print(f"... {len(data.clients) - limit} more clients (--limit)")
    audit = audit_table(data)
    if audit is not None:
        console.print(audit)
    png = Path(out or Path(cfg.output.dir) / cfg.name / "scenario.png")
    console.print(f"plot: {plot_scenario(data, png)}")
    if data.steps:  # drift: the true concept of every client per round
        tl = plot_timeline(data, cfg.train.rounds, png.with_name("timeline.png"))
        console.print(f"timeline: {tl}")


@app.command()
@user_errors
def report(
    run_dirs: Annotated[list[str], typer.Argument(help="run directories")],
    protocol: Protocol = "best_train",
    markdown: str | None = Opt(None, help="also write the table here"),
    plot: str | None = Opt(None, help="also write a PNG of the curves here"),
) -> None:
    """Print a table of finished (or running) runs under a round protocol."""
    from fedshift.report import write_report

    for table in write_report(run_dirs, protocol, markdown, plot):
        console.print(table)


@app.command()
@user_errors
def bench(
    device: str = Opt("auto", help="auto | cpu | cuda"),
    models: str = Opt("fmnist_cnn,resnet18", help="comma-separated: fmnist_cnn,resnet18"),
    clients: int = Opt(64, help="clients per round"),
    per_client: int = Opt(512, help="training samples per client"),
    batch_size: int = Opt(128, help="local batch size"),
    chunk_size: int = Opt(64, help="clients per batched chunk"),
    repeats: int = Opt(2, help="timed repetitions after one warm-up"),
    out: str = Opt("runs/bench/throughput.json", help="JSON results"),
    memory: str | None = Opt(None, help="also peak GPU memory for these client counts: 100,1000"),
    from_json: str | None = Opt(None, help="measure nothing: a markdown table of this JSON"),
) -> None:
    """Samples/s of plain PyTorch at a large batch (the limit), fedshift's central path, the
    sequential and the batched executor."""
    from fedshift.bench import run_bench
    from fedshift.report import bench_markdown_file

    if from_json:  # plain text, not rich: results folders re-render it to committed files
        print(bench_markdown_file(from_json))
        return
    args = (device, models, clients, per_client, batch_size, chunk_size, repeats, out, memory)
    for item in run_bench(*args, console):
        console.print(item)


@app.command()
@user_errors
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
    jobs: Jobs = 1,
    fresh: Fresh = False,
    ray: Ray = False,
    ray_address: RayAddress = None,
    gpus_per_run: GpusPerRun = None,
    cpus_per_run: CpusPerRun = None,
    data_dir: DataDir = None,
    report_only: bool = Opt(
        False, help="train nothing: the table from the runs' files (e.g. committed artifacts)"
    ),
    log: Log = None,
) -> None:
    """Re-run a paper table: our mean ± std beside the paper's, as a table, markdown and PNGs.

    Every row x lr x seed is an independent, resumable run; a diverged run is marked in the
    table and the others go on (see docs/reproducing.md).
    """
    from fedshift.console import ray_placement
    from fedshift.progress import JobBars
    from fedshift.report import table_of
    from fedshift.studies.reproduce import parse_lr_grid, plan_table, reproduce_table, table_spec
    from fedshift.tracking import log_override

    spec = table_spec(table, dataset)
    place = ray_placement(ray, ray_address, gpus_per_run, cpus_per_run)
    ov = [*(overrides or []), *log_override(log), *([f"train.rounds={rounds}"] if rounds else [])]
    ov += [f"scenario.num_clients={clients}"] if clients else []
    ov += [f"scenario.timeline.rounds_per_step={rounds_per_step}"] if rounds_per_step else []
    base = load(str(find_config(spec.configs[dataset])), ov, data_dir)
    labels = [x.strip() for x in only.split(",")] if only else None
    args = {"labels": labels, "seeds": seeds, "lr_grid": parse_lr_grid(spec, lr_grid)}
    args.update(follow=follow)
    run_args = {"workers": jobs, "fresh": fresh, "ray": place, "select_on": select_on}
    run_args["report_only"] = report_only
    bars = JobBars(len(plan_table(spec, dataset, base, **args)), console)
    with bars.progress:
        rep = reproduce_table(spec, dataset, base, **args, **run_args, listener=bars)
    console.print(table_of(rep.columns, rep.cells, rep.title, left=("algorithm", "variant")))
    if rep.drift:
        console.print(table_of(rep.drift.columns, rep.drift.cells, rep.drift.title, left=("row",)))
    console.print("files: " + ", ".join(str(f) for f in rep.files))


@app.command()
@user_errors
def sweep(
    config: Annotated[str, typer.Argument(help="YAML config")],
    overrides: Overrides = None,
    protocol: str | None = Opt(None, help="default: steps with a timeline, else last"),
    metric: str | None = Opt(None, help="default: global_acc if recorded, else local_acc"),
    jobs: Jobs = 1,
    fresh: Fresh = False,
    ray: Ray = False,
    ray_address: RayAddress = None,
    gpus_per_run: GpusPerRun = None,
    cpus_per_run: CpusPerRun = None,
    data_dir: DataDir = None,
    log: Log = None,
) -> None:
    """Run a grid as resumable runs; print mean ± std per setting and the best setting.

    An override with a comma is an axis (train.lr=0.01,0.03; seed=0,1,2 are the seeds), e.g.
    `fedshift sweep configs/quickstart.yaml train.lr=0.01,0.03 seed=0,1,2`.
    """
    from fedshift.console import ray_placement
    from fedshift.progress import JobBars
    from fedshift.report import table_of
    from fedshift.studies.sweep import parse_grid, plan_sweep, run_sweep
    from fedshift.tracking import log_override

    place = ray_placement(ray, ray_address, gpus_per_run, cpus_per_run)
    grid = parse_grid([*(overrides or []), *log_override(log)])
    todo = plan_sweep(config, grid, data_dir=data_dir)
    bars = JobBars(len(todo.jobs), console)
    run_args = {"workers": jobs, "fresh": fresh, "ray": place, "listener": bars}
    with bars.progress:
        rep = run_sweep(todo, protocol=protocol, metric=metric, **run_args)
    console.print(table_of(rep.columns, rep.cells, rep.title, left=tuple(grid.keys)))
    console.print(rep.best_line)
    console.print("files: " + ", ".join(str(f) for f in rep.files))


@app.command()
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


@app.command()
@user_errors
def export(
    config: Annotated[str, typer.Argument(help="YAML config")],
    out: Annotated[str, typer.Argument(help="folder for the clients' folders")],
    overrides: Overrides = None,
    data_dir: DataDir = None,
) -> None:
    """Write every training client of a scenario to a folder of its own (a deployment's node
    data: client.json, train.npz, test.npz)."""
    from fedshift.data.client_folders import export_clients
    from fedshift.data.scenario import build_scenario

    cfg = load(config, overrides, data_dir)
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    folders = export_clients(data, Path(out), made_by=f"fedshift export {config} (seed {cfg.seed})")
    sizes = ", ".join(f"{c.cid}: {c.num_train}+{c.num_test}" for c in data.clients)
    console.print(f"{len(folders)} client folders in {out} (train+test samples: {sizes})")
    if data.test_clients:
        console.print(f"not exported: {len(data.test_clients)} test-only clients (simulation only)")


app.add_typer(deploy_app, name="deploy")
results_app = typer.Typer(help="Published results: check their numbers, re-render their tables.")
app.add_typer(results_app, name="results")


@results_app.command("check")
@user_errors
def results_check(
    root: str = Opt(".", help="the repository (benchmarks/results/, README.md and docs/)"),
) -> None:
    """Every results folder has its provenance, its tables re-render from its artifacts to the
    committed text, and every number of the README, the docs pages and the folders' notes is in an artifact."""
    from fedshift.provenance import check_all

    problems = check_all(Path(root), render_check=True)
    for p in problems:
        console.print(p, highlight=False, soft_wrap=True)
    if problems:
        raise FedshiftError(f"{len(problems)} published number(s) or table(s) not backed")
    console.print("every published number is backed by an artifact")


@results_app.command("render")
@user_errors
def results_render(
    folders: Annotated[list[str], typer.Argument(help="results folders")],
    root: str = Opt(".", help="the repository the render commands run in"),
) -> None:
    """Re-write a results folder's tables from its artifacts (its provenance.yaml's render)."""
    from fedshift.provenance import render

    for folder in folders:
        for f in render(Path(folder), Path(root)):
            console.print(f"{folder}/{f}")


@app.command(name="list")
@user_errors
def list_names(
    markdown: bool = Opt(
        False, help="only the algorithms, as the markdown table of docs/algorithms.md"
    ),
) -> None:
    """List the algorithms (with their papers), datasets, models, corruptions and pools."""
    from fedshift.report import algorithm_markdown, catalogue

    if markdown:
        print(algorithm_markdown(), end="")
        return
    for line in catalogue():
        console.print(line)


def main() -> None:
    """Console entry point: the commands that train run in a child process the ``fedshift``
    process watches, so a run the system kills says so (:mod:`fedshift.supervise`)."""
    from fedshift.supervise import supervise, wanted

    argv = sys.argv[1:]
    if wanted(argv):
        code = supervise(argv)
        if code is not None:  # the watching parent
            sys.exit(code)
    app()


if __name__ == "__main__":
    main()
