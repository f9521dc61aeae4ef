"""What a study summarises its runs into: a mean and spread over runs (:class:`MeanStd`, written
``12.34 ±0.56``) and tables of text cells (:class:`Table`), each rendered to markdown and to the
console by one renderer.

Spreads are population standard deviations (ddof=0) over the finite values; a per-client spread
within one run (mean, std and worst 10% over clients) is :func:`fedshift.engine.metrics.spread`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple


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
