"""What a study summarises its runs into: a mean and spread over runs (:class:`MeanStd`, written
``12.34 ±0.56``) and tables of text cells (:class:`Table`), each rendered to markdown and to the
console by one renderer.

Spreads are population standard deviations (ddof=0) over the finite values; a per-client spread
within one run (mean, std and worst 10% over clients) is :func:`fedshift.engine.metrics.spread`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from rich.markup import escape
from rich.table import Table as RichTable


class MeanStd(NamedTuple):
    """The mean, population std and count of the finite values of several runs (a tuple, so it
    is written to JSON as ``[mean, std, n]``)."""

    mean: float
    std: float
    n: int

    def text(self) -> str:
        """``"12.34 ±0.56"`` over two values or more, ``"12.34"`` for one, ``"n/a"`` for none."""
        if self.n == 0 or not math.isfinite(self.mean):
            return "n/a"
        return f"{self.mean:.2f} ±{self.std:.2f}" if self.n >= 2 else f"{self.mean:.2f}"


def mean_std(values: Sequence[float]) -> MeanStd:
    """(mean, population std, n) over the finite values; (nan, nan, 0) when there are none."""
    v = [x for x in values if isinstance(x, float | int) and math.isfinite(x)]
    if not v:
        return MeanStd(float("nan"), float("nan"), 0)
    mean = sum(v) / len(v)
    return MeanStd(mean, math.sqrt(sum((x - mean) ** 2 for x in v) / len(v)), len(v))


@dataclass
class Table:
    """Text cells under column titles: what a study's summary is printed and written as. The
    console (:meth:`to_rich`) and the markdown files (:meth:`to_markdown`, placed in a document
    by :func:`markdown`) render the same cells."""

    columns: list[str]
    rows: list[list[str]]
    title: str = ""  # the console's title (a file says more around the table, or other)
    left: tuple[str, ...] = ("algorithm",)  # columns aligned left; the others right
    bold_title: bool = False

    def to_markdown(self) -> str:
        """The pipe table, without a title or a final newline."""
        head = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        return "\n".join([*head, *("| " + " | ".join(map(str, r)) + " |" for r in self.rows)])

    def to_rich(self) -> RichTable:
        """A rich table, every text shown as written (a cell's brackets, e.g. an override
        ``concepts=[identity, reverse]``, are no markup)."""
        style: dict[str, Any] = {"title_style": "bold"} if self.bold_title else {}
        t = RichTable(title=escape(self.title), **style)
        for c in self.columns:
            t.add_column(escape(c), justify="left" if c in self.left else "right")
        for row in self.rows:
            t.add_row(*(escape(str(c)) for c in row))
        return t


def markdown(*blocks: str | Table, end: str = "\n") -> str:
    """A markdown document: paragraphs and tables a blank line apart (an empty block is no
    line: two blank lines where it stands), ending with ``end``."""
    lines: list[str] = []
    for i, block in enumerate(blocks):
        text = block.to_markdown() if isinstance(block, Table) else block
        lines += [""] * (i > 0) + (text.split("\n") if text else [])
    return "\n".join(lines) + end
