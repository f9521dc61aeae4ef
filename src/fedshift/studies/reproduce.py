"""Re-running a paper table under the paper's protocol: every row over several seeds and a grid of
learning rates, as independent, resumable runs (in parallel processes or on Ray when asked),
reported as mean ± std beside the paper's mean ± std.

The pieces, each callable from Python:

- :func:`plan_table` turns a table column into :class:`TableRun` s (one per row x learning rate x seed),
  each a validated config with its own run directory ``<out>/<row>/lr<lr>-seed<seed>``;
- :func:`fedshift.studies.jobs.execute` runs the jobs (in this process, ``jobs`` worker processes or
  Ray tasks), resuming a run whose directory holds the same settings and reusing a finished
  one; a diverged run is an outcome, not an error;
- :func:`summarise_table` picks each row's learning rate and aggregates its seeds;
- :func:`markdown` / :func:`write_outputs` write the report.

The learning-rate rule, stated in every report: for each row, the lr whose **mean over the
finished seeds** of ``select_on`` (default: the table's choice, FedRC's global accuracy) at the
table's round protocol is highest (ties: the smaller lr); a row without that metric's model
(FedProto has no global model) is ranked on the first table metric it reports. The papers
pick "each method's best" without saying on what; selecting on a test metric flatters every
row alike, and ``select_on`` can name another metric (e.g. ``train_acc``). Spreads are
population standard deviations (numpy's default, ddof=0) over seeds.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedshift.algorithms import get_algorithm
from fedshift.algorithms.registry import resolved_train
from fedshift.config import RunConfig, apply_overrides, validate_config
from fedshift.config.grid import parse_numbers
from fedshift.core.errors import ConfigError, FedshiftError, did_you_mean
from fedshift.core.files import atomic_write_text, ensure_writable_dir
from fedshift.reporting.protocols import PROTOCOLS, select_round
from fedshift.reporting.summary import MeanStd, Table, mean_std
from fedshift.run.experiment import run_dir_for
from fedshift.run.folder import SUMMARY
from fedshift.run.lock import removed_if_failed
from fedshift.studies import papers
from fedshift.studies.jobs import Listener, Outcome, RayPlacement, execute, read_outcome
from fedshift.studies.papers import PaperTable, Variant
from fedshift.studies.table_files import BenchDrift, bench_drift, table_plots
from fedshift.studies.table_text import markdown, method_table, table_rows


@dataclass
class TableRun:
    """One independent run of a table: a row at one learning rate and seed."""

    label: str
    lr: float
    seed: int
    cfg: RunConfig
    options: str  # the row's non-default behaviour, as printed in the report
    row: str = ""  # the table's row (the paper's label) when ``label`` names a profile of it

    @property
    def key(self) -> str:
        return f"{self.label} lr={self.lr:g} seed={self.seed}"


@dataclass
class RowSummary:
    label: str
    row: str  # the paper's row it reproduces
    options: str
    lr: float | None  # the chosen learning rate (None: every run diverged)
    values: dict[str, MeanStd]  # key -> (mean, std, n) over finished seeds
    seeds: int  # finished seeds at the chosen lr
    diverged: int  # diverged seeds at the chosen lr
    rounds: list[int]
    minutes: float
    per_lr: dict[float, tuple[float, float, int, int]] = field(default_factory=dict)
    first: Outcome | None = None  # the chosen lr's first finished seed (for plots)
    # seed -> the table's values at its protocol's round, for the chosen lr's finished seeds
    by_seed: dict[int, dict[str, float]] = field(default_factory=dict)


# ----------------------------------------------------------------------------- planning


def table_spec(table: str, column: str) -> PaperTable:
    """The paper table ``table`` (e.g. ``fedrc-table1``), checked to have ``column``."""

    tables = papers.TABLES  # looked up now: a plugin or a test may add a table
    if table not in tables:
        raise FedshiftError(
            f"unknown table {table!r}{did_you_mean(table, tables)}; allowed: {', '.join(tables)}"
        )
    spec = tables[table]
    if column not in spec.configs:
        hint = did_you_mean(column, spec.configs)
        raise FedshiftError(f"--dataset {column!r}{hint}: {table} has {', '.join(spec.configs)}")
    return spec


def parse_lr_grid(spec: PaperTable, text: str | None) -> list[float]:
    """Learning rates from ``"0.01,0.03"``, the table's own grid for ``"paper"``, none for None."""
    if not text:
        return []
    if text == "paper":
        if not spec.lr_grid:
            raise FedshiftError(f"--lr-grid paper: {spec.key} has no learning-rate grid; give one")
        return list(spec.lr_grid)
    try:
        return parse_numbers(text)
    except ConfigError:
        raise FedshiftError(
            f"--lr-grid {text!r}: give comma-separated numbers, e.g. 0.01,0.03, or 'paper'"
        ) from None


def row_params(base: RunConfig, spec: PaperTable, column: str, v: Variant, follow: str) -> dict:
    """A row's hyper-parameters: the table's common ones (where the algorithm has the field),
    the base config's own (same algorithm), the row's, the column's and the code profile's."""

    fields = get_algorithm(v.algorithm).Params.model_fields
    params = {k: x for k, x in spec.common_params.items() if k in fields}
    if v.algorithm == base.algorithm.name:
        params.update(base.algorithm.params)
    params.update(v.params)
    params.update(spec.column_params.get(column, {}).get(v.label, {}))
    if follow == "code":
        params.update({k: x for k, x in spec.code_params.items() if k in fields})
    return params


def options_text(
    spec: PaperTable, column: str, v: Variant, follow: str, lr_grid: bool = False
) -> str:
    """What a row runs with beyond the algorithm's defaults, for the report's variant column;
    under a learning-rate grid (``lr_grid``) without the row's own ``train.lr``, which the grid
    replaces (the lr column says which was chosen)."""

    fields = get_algorithm(v.algorithm).Params.model_fields
    parts = [f"{k}={x}" for k, x in v.params.items()]
    parts += [f"{k}={x}" for k, x in spec.column_params.get(column, {}).get(v.label, {}).items()]
    if follow == "code":
        parts += [f"{k}={x}" for k, x in spec.code_params.items() if k in fields]
    overrides = spec.overrides_for(column, v.label, follow)
    parts += [o for o in overrides if not (lr_grid and o.startswith("train.lr="))]
    return ", ".join(parts) or "defaults"


def row_slug(label: str) -> str:
    """A row label as a folder name: lower case, spaces and commas as ``-``, a letter outside
    ASCII spelled by its Unicode name ("ξ = 10" -> "xi--10"), other characters dropped
    ("w/o NCD" -> "wo-ncd", "FedDAA (true count, re-split)" -> "feddaa-true-count-re-split")."""

    def spell(ch: str) -> str:
        if ch.isascii() or not ch.isalpha():
            return ch
        name = unicodedata.name(ch, "")
        return f" {name.split()[-1].lower()} " if name else ""

    text = "".join(spell(ch) for ch in label.lower()).strip()
    return re.sub(r"[^a-z0-9-]", "", re.sub(r"[ ,]+", "-", text)).strip("-")


def row_config(
    base: RunConfig,
    spec: PaperTable,
    column: str,
    v: Variant,
    *,
    follow: str = "code",
    lr: float | None = None,
    seed: int | None = None,
    out_dir: str | Path | None = None,
) -> RunConfig:
    """The validated config of one run of a row (errors before anything trains)."""

    raw = base.model_dump(mode="json")
    raw["algorithm"] = {"name": v.algorithm, "params": row_params(base, spec, column, v, follow)}
    raw = apply_overrides(raw, list(spec.overrides_for(column, v.label, follow)))
    raw["seed"] = base.seed if seed is None else seed
    if lr is not None:  # else the config's (or the row's own, e.g. FedDAA's per-method lr)
        raw["train"]["lr"] = lr
    slug = row_slug(spec.row_label(v.label, follow))
    tail = "-paper" if follow == "paper" else ""  # the two readings never share a directory
    raw["name"] = f"{slug}/lr{raw['train']['lr']:g}-seed{raw['seed']}{tail}"
    runs = f"{spec.runs or spec.key}-{column}"  # a table reading another's runs shares them
    raw["output"]["dir"] = str(out_dir or Path(base.output.dir) / runs)
    raw["output"]["plots"] = False
    raw["tracking"]["group"] = raw["tracking"]["group"] or runs  # its tracked runs together
    cfg = validate_config(raw)
    get_algorithm(v.algorithm).parse_params(cfg.algorithm.params)
    return cfg


#: the profiles ``follow`` may name: the authors' code, the paper, or both (a row each)
FOLLOWS = ("code", "paper", "both")


def common_setting(jobs: list[TableRun]) -> RunConfig:
    """The config a table's header describes: of the runs' settings that the header names
    (clients, rounds, participation, model), the one most runs share, first in the table on a
    tie; a row that differs (e.g. FedNH's Local: 20 rounds of every client) says so in its
    variant column."""

    def named(cfg: RunConfig) -> tuple:
        return (cfg.scenario.num_clients, cfg.train.rounds, cfg.train.participation, cfg.model.name)

    counts = Counter(named(j.cfg) for j in jobs)
    return max((j.cfg for j in jobs), key=lambda c: counts[named(c)])


def profiles(spec: PaperTable, follow: str | None) -> list[str]:
    """The profiles a reproduction runs (``None``: the table's default)."""
    follow = follow or spec.default_follow
    if follow not in FOLLOWS:
        hint = did_you_mean(follow, FOLLOWS)
        raise FedshiftError(f"--follow {follow!r}{hint}: allowed: {', '.join(FOLLOWS)}")
    return ["paper", "code"] if follow == "both" else [follow]


def plan_table(
    spec: PaperTable,
    column: str,
    base: RunConfig,
    *,
    labels: Sequence[str] | None = None,
    seeds: int = 1,
    lr_grid: Sequence[float] = (),
    follow: str | None = None,
) -> list[TableRun]:
    """Every run of a reproduction, validated: rows x profiles x learning rates x seeds."""
    if column not in spec.configs:
        hint = did_you_mean(column, spec.configs)
        raise FedshiftError(f"column {column!r}{hint}: {spec.key} has {', '.join(spec.configs)}")
    follows = profiles(spec, follow)
    if seeds < 1:
        raise FedshiftError(f"seeds must be at least 1, got {seeds}")
    variants = list(spec.variants)
    if labels:
        unknown = [x for x in labels if x not in [v.label for v in variants]]
        if unknown:
            raise FedshiftError(
                f"row {unknown[0]!r}{did_you_mean(unknown[0], [v.label for v in variants])}: "
                f"rows are {', '.join(v.label for v in variants)}"
            )
        variants = [v for v in variants if v.label in labels]
    lrs: list[float | None] = list(lr_grid) or [None]  # None: the config's or the row's lr
    if any(lr is not None and not (lr > 0 and math.isfinite(lr)) for lr in lrs):
        raise FedshiftError(f"learning rates must be positive numbers, got {lrs}")
    jobs = []
    for v in variants:
        for prof in follows:
            text = options_text(spec, column, v, prof, lr_grid=bool(lr_grid))
            label = spec.row_label(v.label, prof)
            for lr in lrs:
                for i in range(seeds):
                    cfg = row_config(base, spec, column, v, follow=prof, lr=lr, seed=base.seed + i)
                    jobs.append(TableRun(label, cfg.train.lr, base.seed + i, cfg, text, v.label))
    return jobs


# ----------------------------------------------------------------------------- summarising


def reported_key(keys: Sequence[str], outcomes: list[Outcome], protocol: str) -> str:
    """The first of ``keys`` the runs report: a row without the selection metric's model
    (FedProto has no global model) is ranked on the next metric it has, not called diverged."""
    entries = [select_round(o.history, protocol) for o in outcomes]
    has = [k for k in keys if mean_std([e.get(k, math.nan) for e in entries]).n > 0]
    return has[0] if has else keys[0]


def summarise_table(
    spec: PaperTable, outcomes: list[Outcome], select_on: str | None = None
) -> list[RowSummary]:
    """One summary per row: the learning rate chosen by the stated rule (module doc) and the
    mean, std and count over its finished seeds of every metric of the table."""
    key_sel = select_on or spec.select_on or spec.metrics[0][0]
    keys = [k for k, _ in spec.metrics] + [k for k, _ in spec.extras]
    rows: list[RowSummary] = []
    for label in dict.fromkeys(o.job.label for o in outcomes):
        mine = [o for o in outcomes if o.job.label == label]
        by_lr: dict[float, list[Outcome]] = {}
        for o in mine:
            by_lr.setdefault(o.job.lr, []).append(o)
        finished = [o for o in mine if o.status == "finished" and o.history]
        row_key = reported_key([key_sel, *keys], finished, spec.protocol)
        per_lr = {}
        for lr, outs in by_lr.items():
            ok = [o for o in outs if o.status == "finished" and o.history]
            sel = [select_round(o.history, spec.protocol).get(row_key, float("nan")) for o in ok]
            mean, std, n = mean_std(sel)
            per_lr[lr] = (mean, std, n, len(outs) - len(ok))
        ranked = [lr for lr in sorted(per_lr) if per_lr[lr][2] > 0]
        best = max(ranked, key=lambda lr: (per_lr[lr][0], -lr)) if ranked else None
        chosen = [o for o in by_lr.get(best, []) if o.status == "finished" and o.history]
        entries = [select_round(o.history, spec.protocol) for o in chosen]
        values = {k: mean_std([e.get(k, float("nan")) for e in entries]) for k in keys}
        minutes = [o.history[-1].get("elapsed_s", float("nan")) / 60 for o in chosen]
        rows.append(
            RowSummary(
                label=label,
                row=getattr(mine[0].job, "row", "") or label,
                options=mine[0].job.options,
                lr=best,
                values=values,
                seeds=len(chosen),
                diverged=per_lr[best][3] if best is not None else len(mine),
                rounds=sorted({int(e["round"]) for e in entries}),
                minutes=mean_std(minutes).mean,
                per_lr=per_lr,
                first=chosen[0] if chosen else None,
                by_seed={o.job.seed: e for o, e in zip(chosen, entries, strict=True)},
            )
        )
    return rows


def data_text(jobs: Sequence[TableRun]) -> str:
    """Where the runs' data came from, as the first finished run recorded it (e.g. "
    (dSprites, generated by fedshift (not the original pixels))"); a folder is named by its
    last part only. Empty when no run has a summary yet."""

    for job in jobs:
        path = run_dir_for(job.cfg) / SUMMARY
        if path.is_file():
            src = json.loads(path.read_text()).get("data_source")
            if isinstance(src, str) and src:
                return f" ({Path(src).name if src.startswith('/') else src})"
    return ""


def cost_text(jobs: Sequence[TableRun]) -> str:
    """What the finished runs cost, from their ``summary.json``: how many, their wall minutes
    of training and evaluation added up, and the largest peak RSS of one run. Empty when no
    run has a summary yet."""
    done = []
    for job in jobs:
        path = run_dir_for(job.cfg) / SUMMARY
        if path.is_file():
            s = json.loads(path.read_text())
            done.append((float(s.get("elapsed_s", 0.0)), float(s.get("peak_host_rss_mb", 0.0))))
    if not done:
        return ""
    minutes = sum(e for e, _ in done) / 60
    rss = max(r for _, r in done)
    return (
        f"Cost: {len(done)} of {len(jobs)} runs finished, {minutes:.1f} minutes of training and "
        f"evaluation added up over the runs (each run's wall time), the largest peak RSS of a "
        f"run {rss:.0f} MB."
    )


def rule_text(
    spec: PaperTable, select_on: str | None, lrs: Sequence[float], grid: bool = True
) -> str:
    """How the learning rates were chosen (``grid`` False: each row ran at its own)."""
    key = select_on or spec.select_on or spec.metrics[0][0]
    if not grid and len(set(lrs)) > 1:
        return "each row's own (the paper's for that method, column lr), not tuned here"
    if len(set(lrs)) <= 1:
        return f"one learning rate ({lrs[0]:g})" if lrs else "the config's learning rate"
    where = (
        "chosen on validation"
        if key == "val_acc"
        else "chosen on a test metric, as the papers do (--select-on val_acc with "
        "scenario.validation_fraction chooses on validation)"
        if key in ("global_acc", "local_acc", "gm_acc", "pm_v", "pm_l")
        else "chosen on a training metric"
    )
    return (
        f"lr per row from {{{', '.join(f'{x:g}' for x in lrs)}}}: the highest mean over "
        f"finished seeds of {key} at the {PROTOCOLS[spec.protocol]} (ties: the smaller lr), "
        + where
    )


# ----------------------------------------------------------------------------- one call


@dataclass
class Report:
    rows: list[RowSummary]
    columns: list[str]
    cells: list[list[str]]
    title: str
    out_dir: Path
    files: list[Path]
    drift: BenchDrift | None = None  # a drift table's measures (PaperTable.drift)
    versus: Table | None = None  # the paper's method against every row (2 seeds or more)

    @property
    def table(self) -> Table:
        """The main table, titled with the header and the lr rule."""
        return Table(self.columns, self.cells, self.title, left=("algorithm", "variant"))


def reproduce_table(
    spec: PaperTable,
    column: str,
    base: RunConfig,
    *,
    labels: Sequence[str] | None = None,
    seeds: int = 1,
    lr_grid: Sequence[float] = (),
    select_on: str | None = None,
    follow: str | None = None,
    workers: int = 1,
    fresh: bool = False,
    listener: Listener | None = None,
    ray: RayPlacement | None = None,
    report_only: bool = False,
    lockstep: bool | None = None,
) -> Report:
    """Plan, run and report a table column; writes ``table.md``, ``curves.png`` and (for
    clustered methods) ``clusters.png`` under ``<output.dir>/<table>-<column>/``. The runs go
    to ``workers`` local processes or, with ``ray``, to Ray tasks (see :func:`execute`).
    ``report_only``: train nothing, read every run's files (``metrics.jsonl``,
    ``summary.json``, ``config.yaml``: the artifacts committed beside a published table)."""

    keys = [k for k, _ in spec.metrics] + [k for k, _ in spec.extras]
    if select_on is not None and select_on not in keys + ["train_acc", "local_acc", "val_acc"]:
        allowed = list(dict.fromkeys([*keys, "train_acc", "val_acc"]))
        hint = did_you_mean(select_on, allowed)
        raise FedshiftError(f"--select-on {select_on!r}{hint}: allowed: {', '.join(allowed)}")
    jobs = plan_table(
        spec, column, base, labels=labels, seeds=seeds, lr_grid=lr_grid, follow=follow
    )
    out_dir = Path(base.output.dir) / f"{spec.key}-{column}"
    with removed_if_failed(out_dir):  # e.g. a missing dataset: no empty folder left behind
        ensure_writable_dir(out_dir)
        if report_only:
            outcomes = [read_outcome(j) for j in jobs]
        else:
            where = {"workers": workers, "listener": listener, "ray": ray, "lockstep": lockstep}
            outcomes = execute(jobs, fresh=fresh, **where)
    rows = summarise_table(spec, outcomes, select_on)
    lrs = list(lr_grid) or sorted({j.cfg.train.lr for j in jobs})
    cfg0 = common_setting(jobs)
    t = cfg0.train
    title = (
        f"{spec.title} — column {column}; ours: {cfg0.scenario.dataset}"
        f"{data_text(jobs)}, "
        f"{cfg0.scenario.num_clients} clients, {t.rounds} rounds, seeds "
        f"{base.seed}..{base.seed + seeds - 1}, metrics at the {PROTOCOLS[spec.protocol]}, "
        f"mean ±std over seeds"
    )
    setting = (
        f"model {cfg0.model.name} "
        f"({'pretrained' if cfg0.model.pretrained else 'trained from scratch'}), "
        f"participation {t.participation}, keep_momentum={resolved_train(cfg0).keep_momentum}, "
        f"augment={t.augment}; behaviour where paper and code differ: "
        f"{' and '.join(f'the {p} profile' for p in profiles(spec, follow))} "
        "(variant column: each row's options)"
    )
    header = (
        f"{title}. Setting: {setting}. Minutes: training + evaluation wall time per run. "
        "Paper: as printed (mean ± std over its seeds); n/a = the method has no such model."
    )
    rule = rule_text(spec, select_on, lrs, grid=bool(lr_grid))
    files = [out_dir / "table.md"]
    atomic_write_text(files[0], markdown(spec, column, rows, header, rule, cost_text(jobs)))
    files += table_plots(spec, column, rows, out_dir)
    drift = bench_drift(spec, outcomes, out_dir) if spec.drift else None
    files += drift.files if drift else []
    cols, cells = table_rows(spec, column, rows)
    versus = method_table(spec, rows)
    return Report(rows, cols, cells, f"{title}; {rule}", out_dir, files, drift, versus)
