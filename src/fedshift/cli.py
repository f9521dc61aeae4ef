"""The ``fedshift`` command: run, compare, scenario, report, list.

User mistakes (a bad config, a missing dataset, an unknown name) print one line and exit with
code 2; an interrupted run says how to resume it and exits with 130.
"""

from __future__ import annotations

import functools
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedshift.errors import FedshiftError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="fedshift: federated learning under label, feature and concept shift.",
)
console = Console(width=None if sys.stdout.isatty() else 160)  # full tables in logs and pipes
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 400)

Overrides = Annotated[
    list[str] | None, typer.Argument(help="key=value overrides, e.g. train.rounds=5")
]
DataDir = Annotated[
    str | None,
    typer.Option(
        "--data-dir", help="folder with the datasets (default: $FEDSHIFT_DATA, system locations)"
    ),
]


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Command decorator: a user error exits 2 with one line, an interrupt exits 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FedshiftError as err:
            err_console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print(
                "interrupted: completed rounds are saved in the run directory; "
                "continue with `fedshift run --resume RUN_DIR`"
            )
            raise typer.Exit(130) from None

    return wrapper


class ProgressBar:
    """Callback: a rich progress bar over rounds with the latest metrics."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=False,
        )

    def on_start(self, sim, state) -> None:
        self.progress.start()
        self.task = self.progress.add_task(
            self.label, total=sim.cfg.rounds, completed=state.round, info=""
        )

    def on_round_end(self, sim, state, metrics) -> None:
        info = None
        if metrics:
            names = {"gm_acc": "GM", "pm_v": "PM(V)", "pm_l": "PM(L)"}
            keys = (
                ("gm_acc", "pm_v", "pm_l")
                if "pm_v" in metrics
                else ("global_acc", "local_acc", "train_acc")
            )
            parts = [
                f"{names.get(k, k.replace('_acc', ''))} {metrics[k]:.1f}%"
                for k in keys
                if k in metrics and not math.isnan(metrics[k])
            ]
            info = "  ".join(parts)
        self.progress.update(self.task, completed=state.round, **({"info": info} if info else {}))

    def on_end(self, sim, state) -> None:
        self.progress.stop()


def _load(config: str | None, overrides: list[str] | None, data_dir: str | None):
    from fedshift.config import load_config

    ov = list(overrides or [])
    if data_dir:
        ov.append(f"data_dir={data_dir}")
    return load_config(config, ov)


def _sigterm_as_interrupt() -> None:
    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@app.command()
@user_errors
def run(
    config: Annotated[str | None, typer.Argument(help="YAML config")] = None,
    overrides: Overrides = None,
    resume: Annotated[str | None, typer.Option(help="continue the run in this directory")] = None,
    data_dir: DataDir = None,
    overwrite: Annotated[bool, typer.Option(help="replace an existing run directory")] = False,
) -> None:
    """Run one experiment; writes runs/<name>/ (config, metrics.jsonl, summary.json, plots)."""
    from fedshift.report import rich_table, table_rows
    from fedshift.runner import run_experiment

    if resume:
        rd = Path(resume)
        if not (rd / "config.yaml").is_file():
            raise FedshiftError(f"--resume {resume}: no config.yaml there; is it a run directory?")
        cfg = _load(str(rd / "config.yaml"), overrides, data_dir)
    else:
        if config is None:
            raise FedshiftError("give a CONFIG file (e.g. configs/quickstart.yaml) or --resume DIR")
        cfg = _load(config, overrides, data_dir)
    _sigterm_as_interrupt()
    res = run_experiment(
        cfg,
        run_dir=resume,
        resume=bool(resume),
        overwrite=overwrite,
        callbacks=[ProgressBar(f"{cfg.algorithm.name}")],
    )
    for protocol in ("last", "best_train"):
        console.print(rich_table(table_rows({cfg.algorithm.name: res.history}, protocol), protocol))
    console.print(f"run directory: {res.run_dir}")


@app.command()
@user_errors
def compare(
    config: Annotated[str, typer.Argument(help="YAML config (its algorithm is replaced)")],
    overrides: Overrides = None,
    algorithms: Annotated[str, typer.Option(help="comma-separated algorithm names")] = "fedavg",
    protocol: Annotated[str, typer.Option(help="last | best | best_train")] = "last",
    data_dir: DataDir = None,
) -> None:
    """Run several algorithms on the same scenario and seed; print one table, write one plot."""
    from fedshift.config import validate_config
    from fedshift.data.scenario import build_scenario
    from fedshift.metrics import PROTOCOLS
    from fedshift.plots import plot_history
    from fedshift.report import rich_table, table_rows, to_markdown
    from fedshift.results import atomic_write_text
    from fedshift.runner import run_experiment

    if protocol not in PROTOCOLS:
        raise FedshiftError(f"--protocol {protocol!r}: allowed: {', '.join(PROTOCOLS)}")
    base = _load(config, overrides, data_dir)
    names = [a.strip() for a in algorithms.split(",") if a.strip()]
    cfgs = {}
    for a in names:  # validate every algorithm before any training
        raw = base.model_dump(mode="json")
        raw["algorithm"] = {
            "name": a,
            "params": base.algorithm.params if a == base.algorithm.name else {},
        }
        raw["name"] = f"{base.name}/{a}"
        raw["output"]["plots"] = False
        cfg = validate_config(raw)
        from fedshift.algorithms import get_algorithm

        get_algorithm(a).parse_params(cfg.algorithm.params)
        cfgs[a] = cfg
    data = build_scenario(base.scenario, base.seed, base.data_dir)
    _sigterm_as_interrupt()
    histories: dict[str, Any] = {}
    for a, cfg in cfgs.items():
        res = run_experiment(cfg, data=data, overwrite=True, callbacks=[ProgressBar(a)])
        histories[a] = res.history
    out = Path(base.output.dir) / base.name
    rows = table_rows(histories, protocol)
    console.print(
        rich_table(
            rows,
            protocol,
            title=f"{base.name}: {data.name}, "
            f"{len(data.clients)} clients, {base.train.rounds} rounds — "
            f"metrics at the {PROTOCOLS[protocol]}",
        )
    )
    atomic_write_text(
        out / "comparison.md", to_markdown(rows, protocol, note=f"Data: {data.source}.")
    )
    png = plot_history(histories, out / "comparison.png", title=f"{base.name}: {data.name}")
    console.print(f"table: {out / 'comparison.md'}\nplot: {png}")


@app.command()
@user_errors
def scenario(
    config: Annotated[str, typer.Argument(help="YAML config")],
    overrides: Overrides = None,
    out: Annotated[
        str | None, typer.Option(help="PNG path (default runs/<name>/scenario.png)")
    ] = None,
    data_dir: DataDir = None,
    limit: Annotated[int, typer.Option(help="clients listed in the table")] = 40,
) -> None:
    """Build a scenario, print a per-client summary table and write a PNG of the clients."""
    from rich.table import Table

    from fedshift.data.scenario import build_scenario
    from fedshift.plots import plot_scenario

    cfg = _load(config, overrides, data_dir)
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    t = Table(
        title=f"{data.name} ({data.source}): {len(data.clients)} clients + "
        f"{len(data.test_clients)} test-only clients"
    )
    for col in (
        "client",
        "concept",
        "label map",
        "feature style",
        "train",
        "test",
        "top labels (count)",
    ):
        t.add_column(col, justify="right" if col in ("train", "test") else "left")
    for c in [*data.clients[:limit], *data.test_clients]:
        top = c.label_hist.argsort()[::-1][:3]
        t.add_row(
            f"{c.cid}{' (test-only)' if c.test_only else ''}",
            str(c.concept),
            c.label_map.name,
            c.style.label(),
            str(c.num_train),
            str(c.num_test),
            ", ".join(f"{y}({c.label_hist[y]})" for y in top if c.label_hist[y]),
        )
    console.print(t)
    if len(data.clients) > limit:
        console.print(f"... {len(data.clients) - limit} more clients (--limit)")
    png = plot_scenario(data, out or Path(cfg.output.dir) / cfg.name / "scenario.png")
    console.print(f"plot: {png}")


@app.command()
@user_errors
def report(
    run_dirs: Annotated[list[str], typer.Argument(help="run directories")],
    protocol: Annotated[str, typer.Option(help="last | best | best_train")] = "best_train",
    markdown: Annotated[str | None, typer.Option(help="also write the table here")] = None,
    plot: Annotated[str | None, typer.Option(help="also write a PNG of the curves here")] = None,
) -> None:
    """Print a table of finished (or running) runs under a round protocol."""
    from fedshift.metrics import PROTOCOLS
    from fedshift.plots import plot_history
    from fedshift.report import load_runs, rich_table, table_rows, to_markdown
    from fedshift.results import atomic_write_text

    if protocol not in PROTOCOLS:
        raise FedshiftError(f"--protocol {protocol!r}: allowed: {', '.join(PROTOCOLS)}")
    runs = load_runs(run_dirs)
    rows = table_rows(runs, protocol)
    console.print(rich_table(rows, protocol))
    if markdown:
        atomic_write_text(Path(markdown), to_markdown(rows, protocol))
    if plot:
        plot_history(runs, plot)


@app.command()
@user_errors
def bench(
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    models: Annotated[str, typer.Option(help="comma-separated: fmnist_cnn,resnet18")] = (
        "fmnist_cnn,resnet18"
    ),
    clients: Annotated[int, typer.Option(help="clients per round")] = 64,
    per_client: Annotated[int, typer.Option(help="training samples per client")] = 512,
    batch_size: Annotated[int, typer.Option(help="local batch size")] = 128,
    chunk_size: Annotated[int, typer.Option(help="clients per batched chunk")] = 64,
    repeats: Annotated[int, typer.Option(help="timed repetitions after one warm-up")] = 2,
    out: Annotated[str, typer.Option(help="JSON results")] = "runs/bench/throughput.json",
    memory: Annotated[
        str | None,
        typer.Option(
            help="also peak GPU memory of a batched round for these client counts, e.g. 100,1000"
        ),
    ] = None,
) -> None:
    """Samples/s of central training (the limit), the sequential and the batched executor."""
    from rich.table import Table

    from fedshift.bench import MODELS, memory_scaling, run_throughput

    names = [m.strip() for m in models.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad:
        raise FedshiftError(f"--models: unknown {bad[0]!r}; allowed: {', '.join(MODELS)}")
    rows = run_throughput(
        device,
        names,
        clients,
        per_client,
        batch_size,
        chunk_size,
        repeats,
        out,
        progress=lambda m: console.print(f"[dim]measuring {m}[/dim]"),
    )
    t = Table(
        title=f"training throughput (samples/s, a sample counted once per model), "
        f"{rows[0].device}, {clients} clients x {per_client} samples, batch {batch_size}"
    )
    for col in (
        "model",
        "loss",
        "central (a)",
        "sequential (b)",
        "batched (c)",
        "b/a",
        "c/a",
        "c/b",
        "peak MB",
    ):
        t.add_column(col, justify="left" if col in ("model", "loss") else "right")
    for r in rows:
        t.add_row(
            r.model,
            r.loss,
            f"{r.central_sps:,}",
            f"{r.sequential_sps:,}",
            f"{r.batched_sps:,}",
            f"{r.seq_over_central:.2f}",
            f"{r.batched_over_central:.2f}",
            f"{r.batched_over_seq:.2f}",
            "n/a" if r.peak_mem_mb is None else f"{r.peak_mem_mb:,.0f}",
        )
    console.print(t)
    console.print(f"results: {out}")
    if memory:
        import json

        from fedshift.results import atomic_write_text

        counts = [int(x) for x in memory.split(",")]
        mem = memory_scaling(rows[0].device, counts, chunk_size=chunk_size)
        for m in mem:
            console.print(
                f"memory, {m['clients']} clients: peak {m['peak_mb']} MB "
                f"(data+jobs {m['data_and_jobs_mb']} MB, training above that "
                f"{m['peak_above_base_mb']} MB)"
            )
        atomic_write_text(Path(out).with_name("memory.json"), json.dumps(mem, indent=2))


def _find_config(path: str) -> Path:
    """A config path as given, or relative to the fedshift source tree (editable installs)."""
    p = Path(path)
    if p.is_file():
        return p
    alt = Path(__file__).resolve().parents[2] / path
    if alt.is_file():
        return alt
    raise FedshiftError(f"config {path!r} not found (run from the fedshift folder)")


@app.command()
@user_errors
def reproduce(
    table: Annotated[str, typer.Argument(help="e.g. fedrc-table1")],
    overrides: Overrides = None,
    dataset: Annotated[str, typer.Option(help="the table's column")] = "fmnist",
    rounds: Annotated[int | None, typer.Option(help="fewer rounds than the paper")] = None,
    clients: Annotated[int | None, typer.Option(help="fewer clients than the paper")] = None,
    only: Annotated[str | None, typer.Option(help="comma-separated row labels to run")] = None,
    fresh: Annotated[
        bool, typer.Option(help="re-run rows whose run directory already holds this config")
    ] = False,
    data_dir: DataDir = None,
) -> None:
    """Re-run a paper table: our numbers beside the paper's, as a table, markdown and PNGs.

    A row whose run directory already holds the same config is resumed from its checkpoint
    (or reused when finished), so an interrupted reproduction loses at most one round.
    """
    from fedshift.data.scenario import build_scenario
    from fedshift.metrics import PROTOCOLS, select_round
    from fedshift.papers import TABLES
    from fedshift.plots import plot_cluster_heatmaps, plot_history
    from fedshift.report import fmt_value
    from fedshift.results import atomic_write_text
    from fedshift.runner import run_dir_for, run_experiment

    if table not in TABLES:
        raise FedshiftError(f"unknown table {table!r}; allowed: {', '.join(TABLES)}")
    spec = TABLES[table]
    if dataset not in spec.configs:
        raise FedshiftError(f"--dataset {dataset!r}: {table} has {', '.join(spec.configs)}")
    ov = list(overrides or [])
    if rounds:
        ov.append(f"train.rounds={rounds}")
    if clients:
        ov.append(f"scenario.num_clients={clients}")
    base = _load(str(_find_config(spec.configs[dataset])), ov, data_dir)
    variants = list(spec.variants)
    if only:
        wanted = [x.strip() for x in only.split(",")]
        unknown = [w for w in wanted if w not in [v.label for v in variants]]
        if unknown:
            raise FedshiftError(
                f"--only {unknown[0]!r}: rows are {', '.join(v.label for v in variants)}"
            )
        variants = [v for v in variants if v.label in wanted]
    out_dir = Path(base.output.dir) / f"{table}-{dataset}"
    cfgs = {v.label: _variant_config(base, spec, dataset, v, table) for v in variants}
    data = build_scenario(base.scenario, base.seed, base.data_dir)
    _sigterm_as_interrupt()
    histories, rows, heat = {}, [], {}
    paper = spec.paper.get(dataset, {})
    for label, cfg in cfgs.items():
        resume = not fresh and _same_run_exists(cfg)
        if resume:
            console.print(f"{label}: resuming {run_dir_for(cfg)}")
        res = run_experiment(
            cfg, data=data, resume=resume, overwrite=True, callbacks=[ProgressBar(label)]
        )
        histories[label] = res.history
        e = select_round(res.history, spec.protocol)
        theirs = paper.get(label, (None,) * len(spec.metrics))
        row = [label]
        for (key, _), p in zip(spec.metrics, theirs, strict=True):
            row += [fmt_value(e.get(key)), p or "—"]
        row += [fmt_value(e.get(key)) for key, _ in spec.extras]
        row += [str(e["round"]), f"{res.history[-1].get('elapsed_s', float('nan')) / 60:.1f}"]
        rows.append(row)
        last = res.history[-1]
        if "clusters" in last:
            heat[label] = (last["clusters"], [c.concept for c in data.clients])
    cols = ["algorithm"]
    for _, title in spec.metrics:
        cols += [f"{title} (ours)", f"{title} (paper)"]
    cols += [title for _, title in spec.extras] + ["round", "minutes"]
    from rich.table import Table

    any_cfg = next(iter(cfgs.values()))
    t = Table(
        title=f"{spec.title} — {dataset} ({data.source}); ours: {len(data.clients)} "
        f"clients, {base.train.rounds} rounds, at the {PROTOCOLS[spec.protocol]}"
    )
    for c in cols:
        t.add_column(c, justify="left" if c == "algorithm" else "right")
    for r in rows:
        t.add_row(*r)
    console.print(t)
    md = [
        f"{spec.title}, column {dataset}. Ours: data {data.source}, {len(data.clients)} "
        f"clients, {base.train.rounds} rounds, participation {base.train.participation}, seed "
        f"{base.seed}, model {any_cfg.model.name} "
        f"({'pretrained' if any_cfg.model.pretrained else 'trained from scratch'}), metrics at "
        f"the {PROTOCOLS[spec.protocol]}; minutes = training + evaluation wall time. Paper: as "
        "printed (mean ± std over its seeds); n/a = the method has no such model.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    atomic_write_text(out_dir / "table.md", "\n".join(md) + "\n")
    plot_history(histories, out_dir / "curves.png", title=f"{table} {dataset}")
    if heat:
        plot_cluster_heatmaps(
            heat, out_dir / "clusters.png", title="clients of each concept per cluster (last round)"
        )
    console.print(
        f"table: {out_dir / 'table.md'}\nplots: {out_dir / 'curves.png'}"
        + (f", {out_dir / 'clusters.png'}" if heat else "")
    )


def _variant_config(base, spec, dataset: str, v, table: str):
    """The validated config of one row of a paper table (errors before anything trains)."""
    from fedshift.algorithms import get_algorithm
    from fedshift.config import validate_config

    cls = get_algorithm(v.algorithm)
    fields = cls.Params.model_fields
    raw = base.model_dump(mode="json")
    params = {k: x for k, x in spec.common_params.items() if k in fields}
    if v.algorithm == base.algorithm.name:
        params.update(base.algorithm.params)
    params.update(v.params)
    params.update(spec.column_params.get(dataset, {}).get(v.label, {}))
    raw["algorithm"] = {"name": v.algorithm, "params": params}
    slug = v.label.lower().replace(" ", "").replace("(", "").replace(")", "")
    raw["name"] = f"{table}-{dataset}/{slug}"
    raw["output"]["plots"] = False
    cfg = validate_config(raw)
    cls.parse_params(cfg.algorithm.params)
    return cfg


def _same_run_exists(cfg) -> bool:
    """Whether the run directory of ``cfg`` holds a checkpoint made from the same settings
    (compared after validation, so settings added to fedshift since then take defaults)."""
    import yaml

    from fedshift.config import validate_config
    from fedshift.results import CHECKPOINT, CONFIG
    from fedshift.runner import run_dir_for

    d = run_dir_for(cfg)
    if not ((d / CHECKPOINT).is_file() and (d / CONFIG).is_file()):
        return False
    try:
        saved = validate_config(yaml.safe_load((d / CONFIG).read_text()))
    except Exception:  # an unreadable or outdated config: not the same run
        return False
    return saved.model_dump(mode="json") == cfg.model_dump(mode="json")


@app.command(name="list")
@user_errors
def list_names() -> None:
    """List the algorithms, datasets, models and feature styles fedshift knows."""
    from fedshift.algorithms import algorithm_names
    from fedshift.data.features import corruption_names
    from fedshift.data.sources import dataset_names
    from fedshift.models import model_names

    for title, names in (
        ("algorithms", algorithm_names()),
        ("datasets", dataset_names()),
        ("models", model_names()),
        ("corruptions", corruption_names()),
    ):
        console.print(f"[bold]{title}[/bold]: {', '.join(names)}")


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
