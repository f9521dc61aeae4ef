"""Tiny-ImageNet-200: JPEG folders (``train/<wnid>/images``, ``val/images`` with
``val_annotations.txt``); the val split is the test set. Decoded arrays are cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset, formats
from fedshift.data.sources.cache import cached_decode, file_key
from fedshift.data.sources.lookup import candidates, find_or_download, search_dirs

_SUBDIRS = (
    "tiny-imagenet-200",
    "tinyimagenet/tiny-imagenet-200",
    "tiny-imagenet/tiny-imagenet-200",
    "tinyimagenet",
    "tiny-imagenet",
)
_HINT = (
    "set FEDSHIFT_DATA or --data-dir to a folder containing tiny-imagenet-200/ "
    "(http://cs231n.stanford.edu/tiny-imagenet-200.zip, extracted); "
    "with internet, it is downloaded (download=True)"
)
_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_JPEG_SUFFIXES = {".jpeg", ".jpg"}


def _fetch(root: Path) -> None:
    from torchvision.datasets.utils import download_and_extract_archive

    download_and_extract_archive(_URL, download_root=str(root))


def _is_tiny_imagenet(folder: Path) -> bool:
    return (
        (folder / "wnids.txt").is_file()
        and (folder / "train").is_dir()
        and (folder / "val" / "val_annotations.txt").is_file()
    )


def _listing(
    folder: Path,
) -> tuple[list[str], list[Path], list[int], list[Path], list[int]]:
    wnids = sorted({w.strip() for w in (folder / "wnids.txt").read_text().split() if w.strip()})
    index = {w: i for i, w in enumerate(wnids)}
    train_paths: list[Path] = []
    train_labels: list[int] = []
    for w in wnids:
        img_dir = folder / "train" / w / "images"
        if not img_dir.is_dir():
            img_dir = folder / "train" / w
        files: list[Path] = []
        if img_dir.is_dir():
            files = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in _JPEG_SUFFIXES)
        train_paths += files
        train_labels += [index[w]] * len(files)
    val_paths: list[Path] = []
    val_labels: list[int] = []
    ann = folder / "val" / "val_annotations.txt"
    for n, line in enumerate(ann.read_text().splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 2 or cols[1].strip() not in index:
            raise FedshiftError(f"{ann}:{n}: expected 'filename<TAB>wnid...', got {line!r}")
        val_paths.append(folder / "val" / "images" / cols[0].strip())
        val_labels.append(index[cols[1].strip()])
    if not train_paths:
        raise FedshiftError(f"{folder}: no training images under train/<wnid>/images/")
    return wnids, train_paths, train_labels, val_paths, val_labels


def _class_names(folder: Path, wnids: list[str]) -> tuple[str, ...]:
    words: dict[str, str] = {}
    wf = folder / "words.txt"
    if wf.is_file():
        for line in wf.read_text(errors="replace").splitlines():
            wnid, _, text = line.partition("\t")
            if text:
                words[wnid.strip()] = text.split(",")[0].strip()
    return tuple(words.get(w, w) for w in wnids)


def _from_folder(folder: Path) -> RawDataset:
    wnids, tr_p, tr_y, va_p, va_y = _listing(folder)
    key = (
        file_key(folder / "wnids.txt"),
        file_key(folder / "val" / "val_annotations.txt"),
        len(tr_p),
        str(tr_p[-1]),
    )

    def decode() -> dict[str, np.ndarray]:
        return {
            "x_train": formats.decode_jpeg_images(tr_p, 64),
            "y_train": np.asarray(tr_y, dtype=np.int64),
            "x_test": formats.decode_jpeg_images(va_p, 64),
            "y_test": np.asarray(va_y, dtype=np.int64),
            "classes": np.asarray(wnids),
        }

    a = cached_decode("tinyimagenet", key, decode)
    classes = _class_names(folder, [str(w) for w in a["classes"]])
    arrays = (a["x_train"], a["y_train"], a["x_test"], a["y_test"])
    return RawDataset.of_images(
        "tinyimagenet",
        folder,
        arrays,
        classes,
        (0.4802, 0.4481, 0.3975),
        (0.2770, 0.2691, 0.2821),
        f"{folder} (Tiny-ImageNet-200; val split used as test set)",
    )


@DATASETS.register("tinyimagenet", "tiny-imagenet", "tiny_imagenet", "tiny-imagenet-200")
def load_tinyimagenet(data_dir: str | Path | None, download: bool) -> RawDataset:
    """Tiny-ImageNet-200: 100000 train + 10000 val RGB 64x64 images, 200 classes."""
    bases = search_dirs(data_dir)

    def find() -> RawDataset | None:
        for folder in candidates(bases, _SUBDIRS):
            if _is_tiny_imagenet(folder):
                return _from_folder(folder)
        return None

    return find_or_download(
        "tinyimagenet", bases, download, find, subdirs=_SUBDIRS, hint=_HINT, fetch=_fetch
    )
