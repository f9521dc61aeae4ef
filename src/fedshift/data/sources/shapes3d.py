"""3Dshapes (Burgess & Kim, 2018): 480,000 RGB 64 x 64 renders of six generative factors.

Not available offline: put ``3dshapes.h5`` (the official file, https://github.com/deepmind/
3d-shapes; read with h5py, ``pip install h5py``) or a ``3dshapes.npz`` with the same arrays
``images`` [N, 64, 64, 3] uint8 and ``labels`` [N, 6] float under ``<data>/3dshapes/`` or
``<data>/``. The six label columns are floor_hue (10 values), wall_hue (10), object_hue (10),
scale (8), shape (4: cube, cylinder, sphere, capsule) and orientation (15); each becomes an
integer factor (the index of its value among the sorted distinct values), plus
``floor_wall_hue`` = floor_hue * 10 + wall_hue (100 values: DFL's background-colour skew deals
them to 50 clients, two each). The label is ``shape`` by default.

Options: ``label`` (a factor), ``fraction`` (a seeded random subset, so only part of the file is
decoded), ``size`` (a divisor of 64: block means) and ``seed``. Every sample is in the training
arrays (the test set is empty); attribute-skew scenarios pool them. Arrays are cached under
``<cache>/decoded``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset, channel_stats
from fedshift.data.sources.cache import cached_decode, file_key
from fedshift.data.sources.lookup import candidates, not_found, search_dirs

COLUMNS = ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation")
FACTORS = (*COLUMNS, "floor_wall_hue")
COUNTS = (10, 10, 10, 8, 4, 15, 100)
SHAPES = ("cube", "cylinder", "sphere", "capsule")
_SUBDIRS = ("3dshapes", "3d-shapes", "shapes3d", ".")
_FILES = ("3dshapes.h5", "3dshapes.npz")
_HINT = (
    "download 3dshapes.h5 (https://storage.googleapis.com/3d-shapes/3dshapes.h5, 5.9 GB) into "
    "<data>/3dshapes/ and pip install h5py, or save its images and labels arrays as "
    "3dshapes.npz there"
)


def _find(data_dir: str | Path | None) -> Path:
    bases = search_dirs(data_dir)
    for folder in candidates(bases, _SUBDIRS):
        for fname in _FILES:
            if (folder / fname).is_file():
                return folder / fname
    subs = [f"{s}/{f}" if s != "." else f for s in _SUBDIRS for f in _FILES]
    not_found("3dshapes", bases, subs, _HINT, "it is not downloaded automatically")


def _open(path: Path):
    """(images, labels) array-likes of the file; h5py datasets are read lazily."""
    if path.suffix == ".h5":
        try:
            import h5py
        except ImportError:
            raise FedshiftError(
                f"3dshapes: reading {path} needs h5py: pip install h5py (or convert it to "
                "3dshapes.npz with arrays images and labels)"
            ) from None
        f = h5py.File(path, "r")
        return f["images"], f["labels"], f
    z = np.load(path, allow_pickle=False)
    return z["images"], z["labels"], z


def factor_classes(labels: np.ndarray) -> np.ndarray:
    """Integer factors [N, 7] of the label values [N, 6]: the rank of each value in its
    column's sorted distinct values, then floor_wall_hue."""
    cols = [np.unique(np.round(labels[:, j], 6), return_inverse=True)[1] for j in range(6)]
    cols.append(cols[0] * 10 + cols[1])
    return np.stack(cols, axis=1).astype(np.int64)


def downscale_rgb(images: np.ndarray, size: int) -> np.ndarray:
    """[N, 64, 64, 3] uint8 to [N, size, size, 3] by block means (``size`` divides 64)."""
    if images.shape[1] == size:
        return images
    f = images.shape[1] // size
    blocks = images.reshape(len(images), size, f, size, f, 3).mean(axis=(2, 4))
    return np.rint(blocks).astype(np.uint8)


def _decode(path: Path, fraction: float, seed: int, size: int) -> dict[str, np.ndarray]:
    images, labels, handle = _open(path)
    try:
        labels = np.asarray(labels[:], dtype=np.float64)
        if labels.ndim != 2 or labels.shape[1] != 6 or images.shape[1:] != (64, 64, 3):
            raise FedshiftError(
                f"{path}: expected images [N, 64, 64, 3] and labels [N, 6], got "
                f"{tuple(images.shape)} and {labels.shape}"
            )
        n = len(labels)
        keep = np.arange(n)
        if fraction < 1.0:
            rng = np.random.default_rng([seed, 0x3D])
            keep = np.sort(rng.permutation(n)[: max(1, int(round(fraction * n)))])
        x = downscale_rgb(np.asarray(images[keep], dtype=np.uint8), size)
        classes = factor_classes(labels)[keep]
    finally:
        handle.close()
    return {
        "x_train": x,
        "y_train": classes,  # the factors [N, 7]; the label is one column
        "x_test": np.zeros((0, *x.shape[1:]), dtype=np.uint8),
        "y_test": np.zeros((0, len(FACTORS)), dtype=np.int64),
        "classes": np.asarray(FACTORS),
    }


@DATASETS.register("3dshapes", "shapes3d", "3d-shapes")
def load_3dshapes(
    data_dir: str | Path | None,
    download: bool,
    *,
    label: str = "shape",
    fraction: float = 1.0,
    size: int = 64,
    seed: int = 0,
) -> RawDataset:
    """3Dshapes from ``3dshapes.h5`` or ``3dshapes.npz`` (see the module docs); ``download``
    is not used (the file is 5.9 GB: get it yourself)."""
    if label not in FACTORS:
        raise FedshiftError(f"3dshapes: label {label!r} is not a factor; use one of {FACTORS}")
    if not 0.0 < float(fraction) <= 1.0:
        raise FedshiftError(f"3dshapes: fraction must be in (0, 1], got {fraction!r}")
    if int(size) < 1 or 64 % int(size):
        raise FedshiftError(f"3dshapes: size must divide 64 (64, 32, 16, ...), got {size!r}")
    path = _find(data_dir)
    key = (file_key(path), float(fraction), int(seed), int(size))
    a = cached_decode("3dshapes", key, lambda: _decode(path, float(fraction), int(seed), int(size)))
    x, factors = a["x_train"], a["y_train"]
    col = FACTORS.index(label)
    num = max(COUNTS[col], int(factors[:, col].max()) + 1 if len(factors) else 1)
    names = SHAPES if label == "shape" and num == 4 else tuple(str(i) for i in range(num))
    mean, std = channel_stats(x)
    return RawDataset(
        name="3dshapes",
        x_train=x,
        y_train=np.ascontiguousarray(factors[:, col]),
        x_test=a["x_test"],
        y_test=np.zeros(0, dtype=np.int64),
        num_classes=num,
        classes=names,
        mean=mean,
        std=std,
        source=f"3Dshapes, {path}",
        factors_train={f: np.ascontiguousarray(factors[:, i]) for i, f in enumerate(FACTORS)},
        factors_test={f: np.zeros(0, dtype=np.int64) for f in FACTORS},
        factor_values={"shape": SHAPES},
    )
