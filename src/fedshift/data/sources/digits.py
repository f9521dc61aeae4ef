"""scikit-learn's 8x8 handwritten digits (always available, no files needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset


@DATASETS.register("digits")
def load_digits(
    data_dir: str | Path | None, download: bool, *, seed: int = 0, test_size: float = 0.2
) -> RawDataset:
    """The 1797 digits as uint8 images [N, 8, 8, 1] (0..16 scaled to 0..255), split into train
    and test stratified by label (``test_size`` of them, shuffled with ``seed``).

    ``data_dir`` and ``download`` are not used.
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < float(test_size) < 1.0:
        raise FedshiftError(f"digits: test_size must be in (0, 1), got {test_size!r}")
    bunch = sklearn_digits()
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)[..., None]
    labels = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        images, labels, test_size=float(test_size), random_state=int(seed), stratify=labels
    )
    scaled = x_tr.astype(np.float64) / 255.0
    return RawDataset(
        name="digits",
        x_train=np.ascontiguousarray(x_tr),
        y_train=y_tr,
        x_test=np.ascontiguousarray(x_te),
        y_test=y_te,
        num_classes=10,
        classes=tuple(str(i) for i in range(10)),
        mean=(float(scaled.mean()),),
        std=(float(scaled.std()),),
        source="scikit-learn",
    )
