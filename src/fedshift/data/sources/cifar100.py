"""CIFAR-100: the python pickles (``train``, ``test`` and ``meta``), fine labels."""

from __future__ import annotations

from pathlib import Path

from fedshift.data.sources import DATASETS, RawDataset, formats
from fedshift.data.sources.lookup import (
    candidates,
    find_or_download,
    search_dirs,
    torchvision_fetch,
)

_PICKLE_DIRS = ("cifar-100-python", "cifar100/cifar-100-python", "CIFAR100/cifar-100-python")
_HINT = (
    "set FEDSHIFT_DATA or --data-dir to a folder containing cifar-100-python/ "
    "(https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz, extracted); "
    "with internet, torchvision downloads it (download=True)"
)


def _has_pickles(folder: Path) -> bool:
    return folder.is_dir() and (folder / "train").is_file() and (folder / "test").is_file()


def _from_pickles(folder: Path) -> RawDataset:
    x_tr, y_tr = formats.cifar_batches([folder / "train"], "fine_labels")
    x_te, y_te = formats.cifar_batches([folder / "test"], "fine_labels")
    default = tuple(f"class_{i}" for i in range(100))
    classes = formats.meta_names(folder / "meta", "fine_label_names", default)
    return RawDataset.of_images(
        "cifar100",
        folder,
        (x_tr, y_tr, x_te, y_te),
        classes,
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        f"{folder} (CIFAR-100 python pickles)",
    )


@DATASETS.register("cifar100", "cifar-100", "cifar_100")
def load_cifar100(data_dir: str | Path | None, download: bool) -> RawDataset:
    """CIFAR-100: 50000 + 10000 RGB 32x32 images, 100 (fine) classes."""
    bases = search_dirs(data_dir)

    def find() -> RawDataset | None:
        for folder in candidates(bases, _PICKLE_DIRS):
            if _has_pickles(folder):
                return _from_pickles(folder)
        return None

    return find_or_download(
        "cifar100",
        bases,
        download,
        find,
        subdirs=_PICKLE_DIRS,
        hint=_HINT,
        fetch=torchvision_fetch("CIFAR100"),
    )
