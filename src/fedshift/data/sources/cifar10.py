"""CIFAR-10: the python pickles (preferred) or a ``cifar10-jpeg.npz`` of JPEG-encoded images.

The npz holds, per split, ``<split>_jpeg`` (all JPEG files concatenated, uint8),
``<split>_offsets`` (N+1 byte offsets) and ``<split>_labels``, plus optional ``classes``; its
decoded arrays are cached (see :mod:`.cache`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset, formats
from fedshift.data.sources.cache import cached_decode, file_key
from fedshift.data.sources.lookup import (
    candidates,
    find_or_download,
    search_dirs,
    torchvision_fetch,
)

_PICKLE_DIRS = (
    "cifar-10-batches-py",
    "cifar10/cifar-10-batches-py",
    "CIFAR10/cifar-10-batches-py",
)
_JPEG_FILES = (
    "cifar10-jpeg/cifar10-jpeg.npz",
    "cifar10-jpeg.npz",
    "cifar10/cifar10-jpeg.npz",
)
_HINT = (
    "set FEDSHIFT_DATA or --data-dir to a folder containing cifar-10-batches-py/ "
    "(https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, extracted) or "
    "cifar10-jpeg/cifar10-jpeg.npz; with internet, torchvision downloads it (download=True)"
)

_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
_MEAN, _STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))


def _has_pickles(folder: Path) -> bool:
    names = [*_TRAIN_BATCHES, "test_batch"]
    return folder.is_dir() and all((folder / n).is_file() for n in names)


def _from_pickles(folder: Path) -> RawDataset:
    x_tr, y_tr = formats.cifar_batches([folder / n for n in _TRAIN_BATCHES], "labels")
    x_te, y_te = formats.cifar_batches([folder / "test_batch"], "labels")
    classes = formats.meta_names(folder / "batches.meta", "label_names", _CLASSES)
    return RawDataset.of_images(
        "cifar10",
        folder,
        (x_tr, y_tr, x_te, y_te),
        classes,
        _MEAN,
        _STD,
        f"{folder} (CIFAR-10 python pickles)",
    )


def _from_jpeg_npz(path: Path) -> RawDataset:
    def decode() -> dict[str, np.ndarray]:
        try:
            with np.load(path, allow_pickle=False) as z:
                parts = {k: z[k] for k in z.files}
        except Exception as exc:
            raise FedshiftError(f"cannot read {path}: {exc}") from exc
        out: dict[str, np.ndarray] = {}
        for split in ("train", "test"):
            try:
                buf, offs, labels = (parts[f"{split}_{k}"] for k in ("jpeg", "offsets", "labels"))
            except KeyError as exc:
                raise FedshiftError(f"{path}: missing array {exc}") from exc
            offs = offs.astype(np.int64)
            if (
                len(offs) != len(labels) + 1
                or offs[0] != 0
                or offs[-1] != len(buf)
                or np.any(np.diff(offs) <= 0)
            ):
                raise FedshiftError(f"{path}: inconsistent {split}_offsets / {split}_labels")
            mv = memoryview(np.ascontiguousarray(buf, dtype=np.uint8))
            blobs = [mv[offs[i] : offs[i + 1]] for i in range(len(labels))]
            out[f"x_{split}"] = formats.decode_jpeg_images(blobs, 32)
            out[f"y_{split}"] = labels.astype(np.int64)
        classes = parts.get("classes")
        out["classes"] = (
            np.asarray(classes).astype(str) if classes is not None else np.asarray(_CLASSES)
        )
        return out

    a = cached_decode("cifar10-jpeg", file_key(path), decode)
    classes = tuple(str(c) for c in a["classes"])
    arrays = (a["x_train"], a["y_train"], a["x_test"], a["y_test"])
    return RawDataset.of_images(
        "cifar10",
        path,
        arrays,
        classes,
        _MEAN,
        _STD,
        f"cifar10-jpeg npz (JPEG-derived CIFAR-10): {path}",
    )


@DATASETS.register("cifar10", "cifar-10", "cifar_10")
def load_cifar10(data_dir: str | Path | None, download: bool) -> RawDataset:
    """CIFAR-10: 50000 + 10000 RGB 32x32 images, 10 classes."""
    bases = search_dirs(data_dir)

    def find() -> RawDataset | None:
        for folder in candidates(bases, _PICKLE_DIRS):
            if _has_pickles(folder):
                return _from_pickles(folder)
        for f in candidates(bases, _JPEG_FILES):
            if f.is_file():
                return _from_jpeg_npz(f)
        return None

    return find_or_download(
        "cifar10",
        bases,
        download,
        find,
        subdirs=_PICKLE_DIRS + _JPEG_FILES,
        hint=_HINT,
        fetch=torchvision_fetch("CIFAR10"),
    )
