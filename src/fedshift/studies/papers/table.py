"""The shape of a paper table: its rows (:class:`Variant`) and :class:`PaperTable`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Variant:
    """One row of a table: a label, an algorithm name, its hyper-parameters and config
    overrides of this row only (``key=value``, e.g. ``eval.personal=all``)."""

    label: str
    algorithm: str
    params: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if "," in self.label:  # ``reproduce --only`` takes comma-separated labels
            raise ValueError(f"row label {self.label!r}: a label may not contain a comma")


@dataclass(frozen=True)
class PaperTable:
    key: str
    title: str
    protocol: str  # round protocol the paper reports (see fedshift.reporting.protocols.PROTOCOLS)
    configs: dict[str, str]  # column (dataset) -> config path
    variants: tuple[Variant, ...]
    metrics: tuple[tuple[str, str], ...]  # (history key, column title) printed beside the paper's
    # column -> row label -> the paper's value of each metric as printed (None: no number)
    paper: dict[str, dict[str, tuple[str | None, ...]]]
    extras: tuple[tuple[str, str], ...] = ()  # (history key, column title): ours only
    # hyper-parameters given to every row whose algorithm has them
    common_params: dict[str, Any] = field(default_factory=dict)
    # column -> row label -> extra hyper-parameters in that column only
    column_params: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # column -> config overrides that make the column from its config file (label noise, a
    # client mix), applied before the command line's, which may change them
    column_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # the authors' code's behaviour (see the module doc): hyper-parameters for every row whose
    # algorithm has them, and column ("*": all) -> row label -> config overrides
    code_params: dict[str, Any] = field(default_factory=dict)
    code_overrides: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    # the learning rates the paper searched per method (reproduce --lr-grid paper)
    lr_grid: tuple[float, ...] = ()
    # the history key the best lr of a row is chosen on (mean over seeds, table's protocol)
    select_on: str = ""
    # the key of a table whose run directories these rows share (the same runs, other metrics;
    # a row with the same settings is then trained once for both)
    runs: str = ""
    # the profile reproduce follows unless told (``code``: the authors' code; ``paper``: the
    # method as the paper defines it, e.g. FedDAA's tables, whose code is told the truth)
    default_follow: str = "code"
    # under the code profile, a row's label says what the profile changes: ``code_suffix`` is
    # added to every label, ``code_labels`` renames given rows (e.g. "FedDAA (true count)")
    code_suffix: str = ""
    code_labels: dict[str, str] = field(default_factory=dict)
    # per-step values a "steps" table lists for each row (history key, title)
    per_step: tuple[tuple[str, str], ...] = ()
    # what a reader must know to read the table (printed under it): e.g. which rows are
    # readings of an ambiguous paper, or that rows differ in local work or scoring
    notes: tuple[str, ...] = ()
    # whether the report adds the drift measures of every row (drift.md, drift.png)
    drift: bool = False
    # the paper's own method (a row label): over 2 seeds or more the report compares it with
    # every other row (difference of means against the spread, and seed by seed)
    method: str = ""

    def __post_init__(self) -> None:
        if self.method and self.method not in {v.label for v in self.variants}:
            raise ValueError(f"{self.key}: method {self.method!r} is not a row of the table")
        if unknown := set(self.column_overrides) - set(self.configs):
            raise ValueError(f"{self.key}: column_overrides of columns it lacks: {sorted(unknown)}")

    def row_label(self, label: str, follow: str) -> str:
        """What a row is called in the report under profile ``follow``."""
        if follow != "code":
            return label
        return self.code_labels.get(label, label + self.code_suffix)

    def overrides_for(self, column: str, label: str, follow: str) -> tuple[str, ...]:
        """Config overrides of a row: its own, then the code profile's when following it."""
        extra: tuple[str, ...] = ()
        if follow == "code":
            for col in ("*", column):
                extra += self.code_overrides.get(col, {}).get(label, ())
        row = next((v for v in self.variants if v.label == label), None)
        return (row.overrides if row else ()) + extra
