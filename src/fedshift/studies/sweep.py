"""A grid of settings over seeds as independent, resumable runs, reported as mean ± std per
setting and the best setting under a named round protocol (``fedshift sweep``).

An override whose value has a comma outside brackets, braces and quotes is an **axis**
(``train.lr=0.01,0.03``, ``algorithm.name=fedavg,fedprox``,
``scenario.concepts=[identity],[identity,reverse]``); any other ``key=value`` (YAML lists
included: ``scenario.concepts=[identity,reverse]``) is a fixed override. ``seed`` is the seeds
axis: spreads are over seeds, every combination of the other axes is a **setting**.

The pieces, each callable from Python:

- :func:`fedshift.config.grid.parse_grid` splits the overrides into axes, seeds and fixed
  overrides (the grammar ``compare --tune`` and ``reproduce --lr-grid`` share);
- :func:`plan_sweep` validates every run before anything trains and gives each its own directory
  ``<output.dir>/<name>-sweep/<setting>/seed<s>/`` (``<setting>`` from the axis values, e.g.
  ``lr=0.01,name=fedavg``), so the same command again resumes or reuses its runs;
- :func:`run_sweep` runs them through :func:`fedshift.studies.jobs.execute` (this process, local
  processes or Ray tasks, as ``fedshift reproduce`` does), summarises each setting and writes
  ``sweep.md`` and ``sweep.json`` into the sweep folder;
- :func:`sweep_grid` does all three in one call (``fedshift.sweep_grid``).

The rule, stated in every report: the best setting has the highest **mean over its finished
seeds** of the metric at the protocol's round (ties: the earlier setting in grid order). The
protocol defaults to ``steps`` for a scenario with a timeline, else ``last`` (as ``fedshift
compare``); the metric to ``global_acc`` (test-only clients) where the runs record it, else
``local_acc``. Spreads are population standard deviations (ddof=0) over seeds; diverged seeds
are counted, not averaged.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshift.config import (
    RunConfig,
    apply_overrides,
    load_config,
    read_config_file,
    validate_config,
)
from fedshift.config.grid import Grid, Setting, parse_grid
from fedshift.core.errors import ConfigError, FedshiftError, did_you_mean
from fedshift.core.files import atomic_write_text, ensure_writable_dir
from fedshift.engine.metrics import TIMING_KEYS
from fedshift.reporting.protocols import PROTOCOLS, check_protocol, select_round
from fedshift.reporting.summary import MeanStd, Table, markdown, mean_std
from fedshift.run.experiment import check_names
from fedshift.run.lock import missing_folders, remove_if_empty
from fedshift.studies.jobs import Listener, Outcome, RayPlacement, execute
from fedshift.tracking import with_group


@dataclass
class SweepRun:
    """One run of a sweep: a setting at one seed, its validated config and run directory."""

    setting: Setting
    slug: str
    seed: int
    cfg: RunConfig

    @property
    def key(self) -> str:
        return f"{self.slug} seed={self.seed}"


@dataclass
class SweepPlan:
    """Every run of a sweep, validated, and the folder its report goes to."""

    grid: Grid
    jobs: list[SweepRun]
    out_dir: Path
    base: RunConfig  # the config with the fixed overrides (the report's header)
    config: str | None = None  # the YAML file
    created: list[Path] = field(default_factory=list)  # folders planning made (removed if empty)


@dataclass
class SettingSummary:
    """A setting's metric over its finished seeds, its diverged seeds and its run time."""

    setting: Setting
    slug: str
    value: MeanStd  # the metric over the finished seeds
    diverged: int
    rounds: list[int]  # the rounds the protocol picked
    minutes: float  # mean wall time of a finished run
    runs: list[dict[str, Any]] = field(default_factory=list)  # per seed, for sweep.json


@dataclass
class SweepReport:
    settings: list[SettingSummary]
    best: SettingSummary | None
    protocol: str
    metric: str
    table: Table  # one row a setting (:func:`table`), titled
    best_line: str
    out_dir: Path
    files: list[Path]

    @property
    def columns(self) -> list[str]:
        return self.table.columns

    @property
    def cells(self) -> list[list[str]]:
        return self.table.rows

    @property
    def title(self) -> str:
        return self.table.title


# ----------------------------------------------------------------------------- folders


def slug(setting: Setting) -> str:
    """A file-system-safe folder name for a setting: ``lr=0.01,name=fedavg`` (the last part of
    each key, the whole key where two axes end alike; odd values get a short hash)."""
    if not setting:
        return "base"
    leaves = [k.rsplit(".", 1)[-1] for k, _ in setting]
    parts = []
    for (key, text), leaf in zip(setting, leaves, strict=True):
        name = leaf if leaves.count(leaf) == 1 else key
        safe = re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("_")[:40]
        if safe != text or not safe:
            safe = f"{safe}-{hashlib.sha1(text.encode()).hexdigest()[:6]}".lstrip("-")
        parts.append(f"{name}={safe}")
    return ",".join(parts)


def setting_text(setting: Setting) -> str:
    """``train.lr=0.01, algorithm.name=fedavg``; ``the config as given`` without axes."""
    return ", ".join(f"{k}={v}" for k, v in setting) or "the config as given"


# ----------------------------------------------------------------------------- planning


def plan_sweep(config: str | Path | None, grid: Grid, *, data_dir: str | None = None) -> SweepPlan:
    """Every run of the sweep (settings x seeds), validated before anything trains: a bad key
    or value is a one-line :class:`ConfigError` naming the setting. Runs go under
    ``<output.dir>/<name>-sweep/`` of the config with the fixed overrides."""

    fixed = [*grid.fixed, *([f"data_dir={data_dir}"] if data_dir else [])]
    base = load_config(config, fixed)  # the file and the fixed overrides, checked first
    raw = read_config_file(config) if config else {}
    out_dir = Path(base.output.dir) / f"{base.name}-sweep"
    jobs = []
    for setting in grid.settings():
        name = slug(setting)
        for seed in grid.seeds or (base.seed,):
            ov = [*fixed, *(f"{k}={v}" for k, v in setting), f"seed={seed}"]
            run = apply_overrides(raw, ov)
            run["name"] = f"{name}/seed{seed}"
            run.setdefault("output", {})
            if isinstance(run["output"], dict):
                run["output"].update(dir=str(out_dir), plots=False)
            with_group(run, out_dir.name)  # the tracked runs of the sweep, together
            try:
                cfg = validate_config(run)
                check_names(cfg)  # algorithm and params, dataset, model, feature styles
            except FedshiftError as err:
                raise ConfigError(f"setting {setting_text(setting)}: {err}") from None
            jobs.append(SweepRun(setting, name, seed, cfg))
    created = missing_folders(out_dir)
    ensure_writable_dir(out_dir)
    return SweepPlan(grid, jobs, out_dir, base, None if config is None else str(config), created)


# ----------------------------------------------------------------------------- summarising


def default_protocol(jobs: Sequence[SweepRun]) -> str:
    """``steps`` when the runs have a timeline (FedDAA's protocol), else ``last``."""
    return "steps" if any(j.cfg.scenario.timeline for j in jobs) else "last"


def _finite(v: Any) -> bool:
    return isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v)


def recorded(outcomes: Sequence[Outcome], protocol: str) -> list[str]:
    """The numeric metrics the finished runs record at the protocol's round."""
    keys: dict[str, None] = {}
    for o in outcomes:
        if o.status == "finished" and o.history:
            keys.update(
                (k, None) for k, v in select_round(o.history, protocol).items() if _finite(v)
            )
    skip = ("round", *TIMING_KEYS, "step", "clients_sampled", "evaluations_averaged")
    return [k for k in keys if k not in skip]


def default_metric(outcomes: Sequence[Outcome], protocol: str) -> str:
    """``global_acc`` where the runs record it, else ``local_acc``."""
    return "global_acc" if "global_acc" in recorded(outcomes, protocol) else "local_acc"


def summarise_sweep(
    outcomes: Sequence[Outcome[SweepRun]], protocol: str, metric: str
) -> list[SettingSummary]:
    """One summary per setting, in grid order: the metric at the protocol's round, its mean,
    population std and count over the finished seeds, diverged seeds and minutes per run."""
    by_setting: dict[Setting, list[Outcome[SweepRun]]] = {}
    for o in outcomes:
        by_setting.setdefault(o.job.setting, []).append(o)
    out = []
    for setting, outs in by_setting.items():
        runs, values, minutes, rounds = [], [], [], set()
        for o in outs:
            run: dict[str, Any] = {"seed": o.job.seed, "status": o.status}
            run["dir"] = str(Path(o.job.cfg.output.dir) / o.job.cfg.name)
            if o.status == "finished" and o.history:
                entry = select_round(o.history, protocol)
                run.update(round=int(entry["round"]), value=entry.get(metric, float("nan")))
                values.append(run["value"])
                minutes.append(o.history[-1].get("elapsed_s", float("nan")) / 60)
                rounds.add(run["round"])
            else:
                run["diverged_round"] = o.diverged_round
            runs.append(run)
        diverged = sum(o.status == "diverged" for o in outs)
        value, per_run = mean_std(values), mean_std(minutes).mean
        slug_ = outs[0].job.slug
        out.append(SettingSummary(setting, slug_, value, diverged, sorted(rounds), per_run, runs))
    return out


def best_setting(summaries: Sequence[SettingSummary]) -> SettingSummary | None:
    """The highest mean over finished seeds (ties: the earlier setting); None if none finished."""
    done = [s for s in summaries if s.value.n > 0 and math.isfinite(s.value[0])]
    return max(done, key=lambda s: s.value[0]) if done else None  # max keeps the first


# ----------------------------------------------------------------------------- the report


def table(
    grid: Grid, summaries: Sequence[SettingSummary], metric: str
) -> tuple[list[str], list[list[str]]]:
    """Column titles and cells: the axis values, the metric's mean ± std, finished and
    diverged seeds, the protocol's round(s) and minutes per run."""
    cols = [*grid.keys, f"{metric} (mean ±std)", "seeds", "diverged", "round", "minutes/run"]
    cells = []
    for s in summaries:
        r = s.rounds
        rounds = f"{r[0]}–{r[-1]}" if len(r) > 1 else "".join(map(str, r)) or "—"
        mins = f"{s.minutes:.1f}" if math.isfinite(s.minutes) else "—"
        cells.append(
            [v for _, v in s.setting]
            + [s.value.text(), str(s.value.n), str(s.diverged), rounds, mins]
        )
    return cols, cells


def rule_text(protocol: str, metric: str) -> str:
    return (
        f"the highest mean over finished seeds of {metric} at the {PROTOCOLS[protocol]} "
        "(ties: the earlier setting in grid order)"
    )


def best_text(best: SettingSummary | None, protocol: str, metric: str) -> str:
    """The report's last line: ``best under protocol P on metric M: <setting> (mean ± std)``."""
    if best is None:
        return f"best under protocol {protocol} on metric {metric}: none (no seed finished)"
    return (
        f"best under protocol {protocol} on metric {metric}: {setting_text(best.setting)} "
        f"({best.value.text()}, {best.value.n} seeds)"
    )


def run_sweep(
    sweep: SweepPlan,
    *,
    protocol: str | None = None,
    metric: str | None = None,
    workers: int = 1,
    fresh: bool = False,
    listener: Listener | None = None,
    ray: RayPlacement | None = None,
    lockstep: bool | None = None,
) -> SweepReport:
    """Run (resume, reuse) every run of the plan, summarise each setting and name the best;
    writes ``sweep.md`` and ``sweep.json`` into ``sweep.out_dir``. The runs go to ``workers``
    local processes or, with ``ray``, to Ray tasks (see :func:`fedshift.studies.jobs.execute`)."""

    protocol = protocol or default_protocol(sweep.jobs)
    try:
        check_protocol(protocol)
        outcomes = execute(
            sweep.jobs, workers=workers, fresh=fresh, listener=listener, ray=ray, lockstep=lockstep
        )
    except BaseException:  # e.g. a missing dataset: the folders planning made go again
        remove_if_empty(sweep.created)
        raise
    have = recorded(outcomes, protocol)
    metric = metric or default_metric(outcomes, protocol)
    if have and metric not in have:
        raise FedshiftError(
            f"--metric {metric!r}{did_you_mean(metric, have)}: the runs record "
            f"{', '.join(have)} (the runs are kept; "
            "the same command with another --metric reuses them)"
        )
    summaries = summarise_sweep(outcomes, protocol, metric)
    best = best_setting(summaries)
    cols, cells = table(sweep.grid, summaries, metric)
    b = sweep.base
    seeds = sweep.grid.seeds or (b.seed,)
    algo = "" if "algorithm.name" in sweep.grid.keys else f", {b.algorithm.name}"
    title = (
        f"sweep of {b.name}: {b.scenario.dataset}, {b.scenario.num_clients} clients, "
        f"{b.train.rounds} rounds{algo}; seeds {', '.join(map(str, seeds))}; "
        f"{metric} at the {PROTOCOLS[protocol]}, mean ±std over seeds"
    )
    line = best_text(best, protocol, metric)
    rule = rule_text(protocol, metric)
    rows = Table(cols, cells, title, left=tuple(sweep.grid.keys))
    files = [sweep.out_dir / "sweep.md", sweep.out_dir / "sweep.json"]
    atomic_write_text(files[0], markdown(f"{title}.", f"Best setting: {rule}.", rows, line))
    atomic_write_text(files[1], _json(sweep, summaries, best, protocol, metric, rule))
    return SweepReport(summaries, best, protocol, metric, rows, line, sweep.out_dir, files)


def sweep_grid(
    config: str | Path | None,
    overrides: Sequence[str],
    *,
    data_dir: str | None = None,
    **options: Any,
) -> SweepReport:
    """The whole sweep in one call, as ``fedshift sweep CONFIG OVERRIDES...``: e.g.
    ``sweep_grid("configs/quickstart.yaml", ["train.lr=0.01,0.03", "seed=0,1,2"], workers=2)``;
    ``options`` are :func:`run_sweep`'s (protocol, metric, workers, fresh, listener, ray)."""
    return run_sweep(plan_sweep(config, parse_grid(overrides), data_dir=data_dir), **options)


def _json(
    sweep: SweepPlan,
    summaries: Sequence[SettingSummary],
    best: SettingSummary | None,
    protocol: str,
    metric: str,
    rule: str,
) -> str:
    """sweep.json: the grid, the rule and every setting with its runs (NaN as null)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    def one(s: SettingSummary) -> dict[str, Any]:
        mean, std, n = s.value
        return {
            "setting": dict(s.setting),
            "slug": s.slug,
            **{"mean": mean, "std": std, "seeds": n, "diverged": s.diverged},
            **{"rounds": s.rounds, "minutes": s.minutes, "runs": s.runs},
        }

    doc = {
        "config": sweep.config,
        "name": sweep.base.name,
        "protocol": protocol,
        "protocol_description": PROTOCOLS[protocol],
        "metric": metric,
        "rule": rule,
        "axes": {a.key: list(a.values) for a in sweep.grid.axes},
        "seeds": list(sweep.grid.seeds or (sweep.base.seed,)),
        "fixed": list(sweep.grid.fixed),
        "settings": [one(s) for s in summaries],
        "best": None if best is None else one(best),
    }
    return json.dumps(clean(doc), indent=2) + "\n"
