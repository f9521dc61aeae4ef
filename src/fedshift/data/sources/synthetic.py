"""Synthetic tabular data: Gaussian classes around random means (always available)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset


def _check(
    num_classes: int, dim: int, n_train: int, n_test: int, separation: float, seed: int
) -> None:
    for opt, val, lo in (
        ("num_classes", num_classes, 2),
        ("dim", dim, 1),
        ("n_train", n_train, 1),
        ("n_test", n_test, 1),
    ):
        if isinstance(val, bool) or not isinstance(val, int | np.integer) or val < lo:
            raise FedshiftError(f"synthetic: {opt} must be an integer >= {lo}, got {val!r}")
    if (
        isinstance(separation, bool)
        or not isinstance(separation, int | float)
        or not np.isfinite(separation)
        or separation < 0
    ):
        raise FedshiftError(f"synthetic: separation must be a number >= 0, got {separation!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise FedshiftError(f"synthetic: seed must be an integer, got {seed!r}")


@DATASETS.register("synthetic")
def load_synthetic(
    data_dir: str | Path | None,
    download: bool,
    *,
    num_classes: int = 10,
    dim: int = 32,
    n_train: int = 6000,
    n_test: int = 2000,
    separation: float = 3.0,
    seed: int = 0,
) -> RawDataset:
    """``num_classes`` Gaussian classes in ``dim`` dimensions (unit covariance, balanced labels)
    whose means are on average ``separation`` apart; float32 inputs, generated from ``seed``.

    ``data_dir`` and ``download`` are not used.
    """
    _check(num_classes, dim, n_train, n_test, separation, seed)
    rng = np.random.default_rng(int(seed))
    means = rng.standard_normal((num_classes, dim))
    diffs = means[:, None, :] - means[None, :, :]
    dists = np.sqrt((diffs**2).sum(-1))[np.triu_indices(num_classes, k=1)]
    means *= float(separation) / max(float(dists.mean()), 1e-12)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.arange(n) % num_classes).astype(np.int64)
        x = means[y] + rng.standard_normal((n, dim))
        return x.astype(np.float32), y

    x_tr, y_tr = sample(int(n_train))
    x_te, y_te = sample(int(n_test))
    return RawDataset(
        name="synthetic",
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        num_classes=int(num_classes),
        classes=tuple(f"class_{i}" for i in range(num_classes)),
        mean=(),
        std=(),
        source="generated",
    )
