"""Fashion-MNIST and MNIST: four IDX files (plain or gzip-compressed) in one folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset
from fedshift.data.sources.formats import read_idx
from fedshift.data.sources.lookup import (
    candidates,
    find_or_download,
    search_dirs,
    torchvision_fetch,
)

_IDX_STEMS: dict[str, tuple[str, ...]] = {
    "train_x": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_y": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_x": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_y": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def _find_idx_files(folder: Path) -> dict[str, Path] | None:
    if not folder.is_dir():
        return None
    found: dict[str, Path] = {}
    for key, stems in _IDX_STEMS.items():
        for stem in stems:
            for fname in (stem, stem + ".gz"):
                if (folder / fname).is_file():
                    found[key] = folder / fname
                    break
            if key in found:
                break
        if key not in found:
            return None
    return found


def _load_idx_dataset(files: dict[str, Path], num_classes: int) -> tuple[np.ndarray, ...]:
    out: list[np.ndarray] = []
    for split in ("train", "test"):
        x = read_idx(files[f"{split}_x"])
        y = read_idx(files[f"{split}_y"])
        if x.ndim != 3 or x.shape[1:] != (28, 28) or x.dtype != np.uint8:
            raise FedshiftError(
                f"{files[f'{split}_x']}: expected uint8 images of shape [N, 28, 28], "
                f"got {x.dtype} {x.shape}"
            )
        if y.ndim != 1 or len(y) != len(x):
            raise FedshiftError(
                f"{files[f'{split}_y']}: expected {len(x)} labels, got shape {y.shape}"
            )
        if len(y) and int(y.max()) >= num_classes:
            raise FedshiftError(f"{files[f'{split}_y']}: label {int(y.max())} out of range")
        out += [np.ascontiguousarray(x[..., None]), y.astype(np.int64)]
    return tuple(out)


@dataclass(frozen=True)
class _IdxDataset:
    """What differs between the MNIST-like datasets."""

    name: str
    subdirs: tuple[str, ...]
    hint: str
    torchvision_class: str
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def load(self, data_dir: str | Path | None, download: bool) -> RawDataset:
        bases = search_dirs(data_dir)

        def find() -> tuple[Path, dict[str, Path]] | None:
            for folder in candidates(bases, self.subdirs):
                files = _find_idx_files(folder)
                if files is not None:
                    return folder, files
            return None

        folder, files = find_or_download(
            self.name,
            bases,
            download,
            find,
            subdirs=self.subdirs,
            hint=self.hint,
            fetch=torchvision_fetch(self.torchvision_class),
        )
        x_tr, y_tr, x_te, y_te = _load_idx_dataset(files, 10)
        return RawDataset(
            name=self.name,
            x_train=x_tr,
            y_train=y_tr,
            x_test=x_te,
            y_test=y_te,
            num_classes=10,
            classes=self.classes,
            mean=self.mean,
            std=self.std,
            source=str(folder),
        )


_FMNIST = _IdxDataset(
    name="fmnist",
    subdirs=("fashion-mnist", "fmnist", "fashion_mnist", "FashionMNIST/raw", "FashionMNIST", "."),
    hint=(
        "set FEDSHIFT_DATA or --data-dir to a folder containing "
        "fashion-mnist/train-images-idx3-ubyte.gz (and the other three IDX files); "
        "on Debian: apt-get install dataset-fashion-mnist; "
        "with internet, torchvision downloads it (download=True)"
    ),
    torchvision_class="FashionMNIST",
    classes=(
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
    mean=(0.2860,),
    std=(0.3530,),
)

_MNIST = _IdxDataset(
    name="mnist",
    subdirs=("mnist/raw", "mnist", "MNIST/raw", "MNIST"),
    hint=(
        "set FEDSHIFT_DATA or --data-dir to a folder containing "
        "mnist/raw/train-images-idx3-ubyte.gz (and the other three IDX files); "
        "with internet, torchvision downloads it (download=True)"
    ),
    torchvision_class="MNIST",
    classes=tuple(str(i) for i in range(10)),
    mean=(0.1307,),
    std=(0.3081,),
)


@DATASETS.register("fmnist", "fashion-mnist", "fashion_mnist", "fashionmnist")
def load_fmnist(data_dir: str | Path | None, download: bool) -> RawDataset:
    """Fashion-MNIST (Xiao et al., 2017): 60000 + 10000 grayscale 28x28 images, 10 classes."""
    return _FMNIST.load(data_dir, download)


@DATASETS.register("mnist")
def load_mnist(data_dir: str | Path | None, download: bool) -> RawDataset:
    """MNIST: 60000 + 10000 grayscale 28x28 handwritten digits."""
    return _MNIST.load(data_dir, download)
