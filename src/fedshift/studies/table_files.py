"""The files of a reproduced table beside ``table.md``: each row's curves and cluster heatmaps
(:func:`table_plots`) and, for a drift table (``PaperTable.drift``, the drift benchmark), every
row's drift measures against its scenario's truth, mean ± std over seeds (:func:`bench_drift`:
``drift.md`` and ``drift.png``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshift.core.files import atomic_write_text
from fedshift.data.scenario import build_scenario
from fedshift.data.truth import truth_arrays
from fedshift.reporting.drift_report import COLUMNS, run_drift, scenario_truth
from fedshift.reporting.plots import (
    plot_cluster_heatmaps,
    plot_drift_bench,
    plot_history,
    plot_tasks,
)
from fedshift.reporting.summary import Table, markdown, mean_std
from fedshift.studies.jobs import Outcome
from fedshift.studies.papers import PaperTable

#: the drift benchmark's columns: the drift report's, then the last round's local accuracy
BENCH_COLUMNS = (*COLUMNS[:7], ("final_acc", "final local %", 2))


@dataclass
class BenchDrift:
    columns: list[str]
    cells: list[list[str]]
    title: str
    rows: list[dict[str, Any]]  # per row: label, then key -> (mean, std, n)
    files: list[Path]

    @property
    def table(self) -> Table:
        return Table(self.columns, self.cells, self.title, left=("row",))


def _truths(outcomes: list[Outcome]) -> dict[str, tuple]:
    """The truth (concept per client and round, onsets) of every distinct scenario and seed:
    as the run's summary recorded it, else from the scenario built again."""

    out: dict[str, tuple] = {}
    for o in outcomes:
        cfg = o.job.cfg
        key = cfg.scenario.hash(cfg.seed)
        if key in out:
            continue
        if o.truth is not None:
            out[key] = truth_arrays(o.truth)
        else:
            data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
            out[key] = scenario_truth(data, cfg.train.rounds)
    return out


def bench_drift(spec: PaperTable, outcomes: list[Outcome], out_dir: Path) -> BenchDrift:
    """Every row's drift measures (mean ± std over its finished seeds), as a table, markdown
    and a plot per measure."""

    done = [o for o in outcomes if o.status == "finished" and o.history]
    truths = _truths(done)
    rows: list[dict[str, Any]] = []
    for label in dict.fromkeys(o.job.label for o in outcomes):
        runs = []
        for o in (o for o in done if o.job.label == label):
            truth, onsets = truths[o.job.cfg.scenario.hash(o.job.cfg.seed)]
            m = run_drift(o.history, truth, onsets=onsets)
            m["final_acc"] = o.history[-1].get("local_acc")
            runs.append(m)
        row: dict[str, Any] = {"run": label}
        for key, _, _ in BENCH_COLUMNS:
            vals = [r[key] for r in runs if r.get(key) is not None]
            row[key] = mean_std(vals) if vals else None
        rows.append(row)
    titles = ["row", *(t for _, t, _ in BENCH_COLUMNS)]
    cells = [
        [r["run"], *(r[k].text() if r[k] else "n/a" for k, _, _ in BENCH_COLUMNS)] for r in rows
    ]
    seeds = sorted({o.job.seed for o in done})
    title = (
        f"{spec.title}: drift measures per row, mean ± std over seeds {seeds} "
        "(fedshift.reporting.drift_report; n/a: the method has no cluster assignments, so no "
        "reaction to score, or nothing to measure)"
    )
    files = [out_dir / "drift.md"]
    atomic_write_text(files[0], markdown(title, Table(titles, cells)))
    means = [
        {"run": r["run"], **{k: (r[k][0] if r[k] else None) for k, _, _ in BENCH_COLUMNS}}
        for r in rows
    ]
    files.append(plot_drift_bench(means, BENCH_COLUMNS, out_dir / "drift.png", spec.key))
    return BenchDrift(titles, cells, title, rows, files)


def table_plots(spec: PaperTable, column: str, rows: list, out_dir: Path) -> list[Path]:
    """Curves of each row's (:class:`~fedshift.studies.reproduce.RowSummary`) first finished
    seed at its chosen lr, and cluster heatmaps."""

    firsts = {r.label: r.first for r in rows if r.first is not None}
    if not firsts:
        return []
    files = [
        plot_history(
            {k: o.history for k, o in firsts.items()},
            out_dir / "curves.png",
            title=f"{spec.key} {column}",
        )
    ]
    if any(k.startswith("global_acc_") for o in firsts.values() for k in o.history[-1]):
        hist = {k: o.history for k, o in firsts.items()}
        files.append(plot_tasks(hist, out_dir / "tasks.png", title=f"{spec.key} {column}"))
    heat = {k: o for k, o in firsts.items() if "clusters" in o.history[-1] and o.concepts}
    if heat:
        files.append(
            plot_cluster_heatmaps(
                {k: (o.history[-1]["clusters"], o.concepts) for k, o in heat.items()},
                out_dir / "clusters.png",
                title="clients of each concept per cluster (last round, first seed)",
            )
        )
    return files
