"""The text of a reproduced table's report (``table.md``): ours beside the paper's
(:func:`table_rows`), the paper's method against every other row (:func:`method_table`), the
values per time step and every learning rate tried, put together by :func:`markdown`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fedshift.reporting.protocols import step_ends
from fedshift.reporting.summary import MeanStd, Table
from fedshift.reporting.summary import markdown as write_markdown
from fedshift.studies.papers import PaperTable

if TYPE_CHECKING:
    from fedshift.studies.reproduce import RowSummary


def table_rows(
    spec: PaperTable, column: str, rows: list[RowSummary]
) -> tuple[list[str], list[list[str]]]:
    """Column titles and cells of the report: ours (mean ± std) beside the paper's."""
    cols = ["algorithm", "variant", "lr"]
    for _, title in spec.metrics:
        cols += [f"{title} (ours)", f"{title} (paper)"]
    cols += [title for _, title in spec.extras] + ["seeds", "round", "minutes"]
    paper = spec.paper.get(column, {})
    cells = []
    for r in rows:
        theirs = paper.get(r.row, (None,) * len(spec.metrics))
        row = [r.label, r.options, "—" if r.lr is None else f"{r.lr:g}"]
        for (key, _), p in zip(spec.metrics, theirs, strict=True):
            ours = "diverged" if r.lr is None else r.values[key].text()
            row += [ours, p or "—"]
        row += [r.values[k].text() for k, _ in spec.extras]
        seeds = str(r.seeds) + (f" ({r.diverged} diverged)" if r.diverged else "")
        rounds = (
            f"{r.rounds[0]}–{r.rounds[-1]}" if len(r.rounds) > 1 else "".join(map(str, r.rounds))
        )
        row += [seeds, rounds or "—", "—" if r.lr is None else f"{r.minutes:.1f}"]
        cells.append(row)
    return cols, cells


def markdown(
    spec: PaperTable,
    column: str,
    rows: list[RowSummary],
    header: str,
    rule: str,
    cost: str = "",
) -> str:
    """The report: a header (data, scale, protocol, rule), the main table, the table's notes,
    the values per time step, the method against each row, every lr tried and what the runs
    cost (``cost``, a sentence; empty: none)."""
    blocks: list[str | Table] = [
        header,
        f"Learning rate: {rule}.",
        Table(*table_rows(spec, column, rows)),
    ]
    blocks += ["\n".join(f"- {n}" for n in spec.notes)] if spec.notes else []
    steps = per_step_table(spec, rows)
    blocks += (
        ["Per time step (t = 1, 2, ...; first seed at the chosen lr):", steps] if steps else []
    )
    versus = method_table(spec, rows)
    if versus is not None:
        blocks += [
            f"{spec.method} against each row, at each row's chosen lr: the difference of the means "
            "over seeds, the spread (the sum of the two rows' population standard deviations), "
            "whether the difference is larger than the spread (a rough rule over few seeds, not a "
            f"significance test), and in how many seeds {spec.method} scores higher than the row "
            "with the same seed (the same scenario, sampling and initialisation):",
            versus,
        ]
    if any(len(r.per_lr) > 1 for r in rows):
        key = rule.split(" of ")[1].split(" at ")[0] if " of " in rule else ""
        blocks += [f"Every learning rate tried ({key}, mean ±std over finished seeds):"]
        blocks += [lr_table(rows)]
    blocks += [cost] if cost else []
    return write_markdown(*blocks)


def gap_verdict(ours: MeanStd, theirs: MeanStd) -> str:
    """Whether ``ours`` is ahead of ``theirs`` by more than the spread (the sum of their
    standard deviations), behind by more, or within it; "n/a" under two values on a side."""
    if ours.n < 2 or theirs.n < 2 or not math.isfinite(ours.mean - theirs.mean):
        return "n/a"
    gap, spread = ours.mean - theirs.mean, ours.std + theirs.std
    if gap > spread:
        return "ahead by more than the spread"
    if -gap > spread:
        return "behind by more than the spread"
    return "within the spread"


def seeds_ahead(
    ours: dict[int, dict[str, float]], theirs: dict[int, dict[str, float]], key: str
) -> tuple[int, int]:
    """(seeds in which ``ours`` scores higher on ``key``, seeds both report): paired by seed."""
    both = [
        (ours[s].get(key, math.nan), theirs[s].get(key, math.nan))
        for s in sorted(set(ours) & set(theirs))
    ]
    both = [(a, b) for a, b in both if math.isfinite(a) and math.isfinite(b)]
    return sum(a > b for a, b in both), len(both)


def method_table(spec: PaperTable, rows: list[RowSummary]) -> Table | None:
    """The paper's method (``spec.method``) against every other row, per metric of the table;
    None unless that row finished over 2 seeds or more."""
    mine = next((r for r in rows if r.row == spec.method and r.lr is not None), None)
    if mine is None or mine.seeds < 2:
        return None
    cols = ["against"]
    for _, title in spec.metrics:
        cols += [f"{title}: difference", "spread", "verdict", "seeds ahead"]
    cells = []
    for r in rows:
        if r is mine or r.lr is None:
            continue
        row = [r.label]
        for key, _ in spec.metrics:
            a, b = mine.values[key], r.values[key]
            ahead, n = seeds_ahead(mine.by_seed, r.by_seed, key)
            finite = a.n > 0 and b.n > 0
            row += [
                f"{a.mean - b.mean:+.2f}" if finite else "n/a",
                f"{a.std + b.std:.2f}" if finite else "n/a",
                gap_verdict(a, b),
                f"{ahead}/{n}",
            ]
        cells.append(row)
    title = f"{spec.method} against each row (difference of the means, spread: sum of the stds)"
    return Table(cols, cells, title, left=("against",)) if cells else None


def lr_table(rows: list[RowSummary]) -> Table:
    """Each row's selection metric at every learning rate tried (mean ±std, diverged seeds)."""
    lrs = sorted({lr for r in rows for lr in r.per_lr})

    def at(r: RowSummary, lr: float) -> str:
        if lr not in r.per_lr:
            return "—"
        mean, std, n, div = r.per_lr[lr]
        return MeanStd(mean, std, n).text() + (f" ({div} diverged)" if div else "")

    cells = [[r.label, *(at(r, lr) for lr in lrs)] for r in rows]
    return Table(["algorithm", *(f"lr {x:g}" for x in lrs)], cells)


def per_step_table(spec: PaperTable, rows: list[RowSummary]) -> Table | None:
    """The table's per-step values (``spec.per_step``) of each row's first finished seed at its
    chosen lr: one column per value, the steps joined by commas ("-": not recorded)."""
    ends = {r.label: step_ends(r.first.history) for r in rows if r.first is not None}
    if not spec.per_step or not any(ends.values()):
        return None

    def fmt(v) -> str:
        if not isinstance(v, int | float) or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"

    cells = [
        [label, *(",".join(fmt(e.get(k)) for e in steps) for k, _ in spec.per_step)]
        for label, steps in ends.items()
    ]
    return Table(["algorithm", *(t for _, t in spec.per_step)], cells)
