"""Tables across run folders (``fedshift report``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshift.core.errors import FedshiftError
from fedshift.core.files import atomic_write_text
from fedshift.data.truth import truth_arrays
from fedshift.reporting.drift_report import drift_markdown, drift_table, run_drift
from fedshift.reporting.plots import plot_history
from fedshift.reporting.protocols import check_protocol
from fedshift.reporting.tables import rich_table, run_names, table_rows, to_markdown
from fedshift.run.folder import RunDir


def load_runs(paths: list[str | Path]) -> dict[str, list[dict[str, Any]]]:
    """Histories of run directories, named by their folder, with as many parent folders as
    it takes to tell them apart (a sweep's ``server_lr=0.001/seed1``)."""
    out = {}
    for p in paths:
        hist = RunDir(p).read_metrics()
        if not hist:
            raise FedshiftError(f"{p}: no metrics.jsonl with evaluations; is it a run directory?")
        out[Path(p)] = hist
    names = run_names(list(out))
    return {names[p]: h for p, h in out.items()}


def drift_rows_of(run_dirs: list[str]) -> list[dict[str, Any]]:
    """The drift measures (:mod:`fedshift.reporting.drift_report`) of every run whose summary
    records its scenario's truth (drift scenarios), against that truth."""
    names = run_names([Path(p) for p in run_dirs])
    rows = []
    for p in run_dirs:
        has_summary = (Path(p) / "summary.json").is_file()  # a running run has none yet
        truth = RunDir(p).read_summary().get("truth") if has_summary else None
        if truth:
            concepts, onsets = truth_arrays(truth)
            hist = RunDir(p).read_metrics()
            rows.append({"run": names[Path(p)], **run_drift(hist, concepts, onsets=onsets)})
    return rows


def write_report(run_dirs: list[str], protocol: str, markdown=None, plot=None) -> list:
    """The table of run directories under ``protocol`` and, for runs of drift scenarios, the
    table of their drift measures (rich); optionally also as markdown and a PNG of the
    curves."""
    check_protocol(protocol)
    runs = load_runs(run_dirs)
    rows = table_rows(runs, protocol)
    drift = drift_rows_of(run_dirs)
    if markdown:
        extra = "\n" + drift_markdown(drift) if drift else ""
        atomic_write_text(Path(markdown), to_markdown(rows, protocol) + extra)
    if plot:
        plot_history(runs, plot)
    out = [rich_table(rows, protocol)]
    if drift:
        title = "drift measures against the scenario's truth"
        out.append(drift_table(drift, title, first="run").to_rich())
    return out
