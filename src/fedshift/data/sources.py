"""Raw dataset sources: find, parse and return datasets as plain numpy arrays.

Every dataset is returned as a :class:`RawDataset` (images channels-last ``uint8``, tabular data
``float32``, labels ``int64``). File-based datasets are looked up, in order, in

1. the explicit ``data_dir`` argument, else the ``FEDSHIFT_DATA`` environment variable;
2. well-known locations: ``/usr/share/datasets`` (Debian's ``dataset-*`` packages),
   ``<cache>/data`` and ``~/data``, where ``<cache>`` is ``FEDSHIFT_CACHE`` or
   ``~/.cache/fedshift``;
3. if ``download=True``, a download into ``<cache>/data`` (via torchvision, imported lazily).

Under each base directory several sub-folder spellings are accepted (see ``_SUBDIRS``). Decoded
JPEG datasets are cached as uncompressed ``.npz`` files under ``<cache>/decoded``.

This module never imports torch at import time.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tempfile
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import numpy as np

from fedshift.errors import DatasetNotFoundError, FedshiftError, UnknownNameError

T = TypeVar("T")

__all__ = [
    "RawDataset",
    "cache_root",
    "dataset_names",
    "load_dataset",
    "read_idx",
    "resolve_name",
    "search_dirs",
]

#: System-wide base directories searched after the user's directory (patched in tests).
SYSTEM_DATA_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets"),)

_CACHE_FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class RawDataset:
    """A dataset as numpy arrays, before any partitioning, shift or tensor conversion."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise ValueError(f"{self.name}: inputs and labels differ in length")
        if len(self.classes) != self.num_classes:
            raise ValueError(
                f"{self.name}: {len(self.classes)} class names for {self.num_classes} classes"
            )

    @property
    def is_image(self) -> bool:
        """True for image data ``[N, H, W, C]``."""
        return self.x_train.ndim == 4

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample (``(H, W, C)`` or ``(D,)``)."""
        return tuple(int(s) for s in self.x_train.shape[1:])


# --------------------------------------------------------------------------------------------
# names

_CANONICAL: tuple[str, ...] = (
    "fmnist",
    "mnist",
    "cifar10",
    "cifar100",
    "tinyimagenet",
    "digits",
    "synthetic",
)
_ALIASES: dict[str, str] = {
    "fashion-mnist": "fmnist",
    "fashion_mnist": "fmnist",
    "fashionmnist": "fmnist",
    "cifar-10": "cifar10",
    "cifar_10": "cifar10",
    "cifar-100": "cifar100",
    "cifar_100": "cifar100",
    "tiny-imagenet": "tinyimagenet",
    "tiny_imagenet": "tinyimagenet",
    "tiny-imagenet-200": "tinyimagenet",
}


def dataset_names() -> list[str]:
    """Canonical dataset names."""
    return list(_CANONICAL)


def resolve_name(name: str) -> str:
    """Map a (case-insensitive) name or alias to its canonical name."""
    key = str(name).strip().lower()
    if key in _CANONICAL:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise UnknownNameError("dataset", name, dataset_names())


# --------------------------------------------------------------------------------------------
# directories


def cache_root() -> Path:
    """Root of fedshift's cache: ``$FEDSHIFT_CACHE`` or ``~/.cache/fedshift``."""
    env = os.environ.get("FEDSHIFT_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedshift"


def _download_root() -> Path:
    return cache_root() / "data"


def search_dirs(data_dir: str | Path | None) -> list[Path]:
    """Base directories searched for file-based datasets, in lookup order."""
    dirs: list[Path] = []
    if data_dir is not None and str(data_dir).strip():
        dirs.append(Path(data_dir).expanduser())
    else:
        env = os.environ.get("FEDSHIFT_DATA", "").strip()
        if env:
            dirs.append(Path(env).expanduser())
    dirs.extend(SYSTEM_DATA_DIRS)
    dirs.append(_download_root())
    dirs.append(Path.home() / "data")
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


#: Sub-folder spellings tried under each base directory ("." is the base itself).
_SUBDIRS: dict[str, tuple[str, ...]] = {
    "fmnist": ("fashion-mnist", "fmnist", "fashion_mnist", "FashionMNIST/raw", "FashionMNIST", "."),
    "mnist": ("mnist/raw", "mnist", "MNIST/raw", "MNIST"),
    "cifar10": (
        "cifar-10-batches-py",
        "cifar10/cifar-10-batches-py",
        "CIFAR10/cifar-10-batches-py",
    ),
    "cifar10-jpeg": (
        "cifar10-jpeg/cifar10-jpeg.npz",
        "cifar10-jpeg.npz",
        "cifar10/cifar10-jpeg.npz",
    ),
    "cifar100": ("cifar-100-python", "cifar100/cifar-100-python", "CIFAR100/cifar-100-python"),
    "tinyimagenet": (
        "tiny-imagenet-200",
        "tinyimagenet/tiny-imagenet-200",
        "tiny-imagenet/tiny-imagenet-200",
        "tinyimagenet",
        "tiny-imagenet",
    ),
}

_HINTS: dict[str, str] = {
    "fmnist": (
        "set FEDSHIFT_DATA or --data-dir to a folder containing "
        "fashion-mnist/train-images-idx3-ubyte.gz (and the other three IDX files); "
        "on Debian: apt-get install dataset-fashion-mnist; "
        "with internet, torchvision downloads it (download=True)"
    ),
    "mnist": (
        "set FEDSHIFT_DATA or --data-dir to a folder containing "
        "mnist/raw/train-images-idx3-ubyte.gz (and the other three IDX files); "
        "with internet, torchvision downloads it (download=True)"
    ),
    "cifar10": (
        "set FEDSHIFT_DATA or --data-dir to a folder containing cifar-10-batches-py/ "
        "(https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, extracted) or "
        "cifar10-jpeg/cifar10-jpeg.npz; with internet, torchvision downloads it (download=True)"
    ),
    "cifar100": (
        "set FEDSHIFT_DATA or --data-dir to a folder containing cifar-100-python/ "
        "(https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz, extracted); "
        "with internet, torchvision downloads it (download=True)"
    ),
    "tinyimagenet": (
        "set FEDSHIFT_DATA or --data-dir to a folder containing tiny-imagenet-200/ "
        "(http://cs231n.stanford.edu/tiny-imagenet-200.zip, extracted); "
        "with internet, it is downloaded (download=True)"
    ),
}


def _candidates(key: str, bases: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for base in bases:
        for sub in _SUBDIRS[key]:
            p = base if sub == "." else base / sub
            if p not in out:
                out.append(p)
    return out


def _not_found(name: str, bases: Sequence[Path], keys: Sequence[str], note: str) -> NoReturn:
    subs = list(
        dict.fromkeys(s + ("" if s.endswith(".npz") else "/") for k in keys for s in _SUBDIRS[k])
    )
    looked = ", ".join(str(b) for b in bases)
    raise DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in: {looked} "
        f"(sub-folders tried under each: {', '.join(subs)}); {note}. "
        f"To get it: {_HINTS[name]}."
    )


# --------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            return gzip.decompress(raw)
        return raw
    except (OSError, EOFError, zlib.error) as exc:
        raise FedshiftError(f"cannot read {path}: {exc} (corrupt or truncated file?)") from exc


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (plain or gzip-compressed) into a numpy array."""
    path = Path(path)
    data = _read_maybe_gzip(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise FedshiftError(f"{path} is not a valid IDX file (bad magic number {data[:4]!r})")
    dtype = _IDX_DTYPES[data[2]]
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise FedshiftError(f"{path} is not a valid IDX file (truncated header)")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - header != expected:
        raise FedshiftError(
            f"{path} is corrupt: header says {dims} ({expected} bytes of data) but the file has "
            f"{len(data) - header} bytes of data"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


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


_FMNIST_CLASSES = (
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
)
_DIGIT_CLASSES = tuple(str(i) for i in range(10))


def _find_or_download(
    name: str, bases: list[Path], keys: Sequence[str], download: bool, find: Callable[[], T | None]
) -> T:
    """``find()`` locally; else download with torchvision and look again; else a clear error."""
    hit = find()
    note = "download disabled (download=False)"
    if hit is None and download:
        err = _download_torchvision(name)
        hit = find() if err is None else None
        note = f"download failed: {err}" if err else "download gave no usable files"
    if hit is None:
        _not_found(name, bases, keys, note)
    return hit


def _load_mnist_like(name: str, bases: list[Path], download: bool) -> RawDataset:
    def find() -> tuple[Path, dict[str, Path]] | None:
        for folder in _candidates(name, bases):
            files = _find_idx_files(folder)
            if files is not None:
                return folder, files
        return None

    hit = _find_or_download(name, bases, [name], download, find)
    folder, files = hit
    x_tr, y_tr, x_te, y_te = _load_idx_dataset(files, 10)
    fm = name == "fmnist"
    return RawDataset(
        name=name,
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        num_classes=10,
        classes=_FMNIST_CLASSES if fm else _DIGIT_CLASSES,
        mean=(0.2860,) if fm else (0.1307,),
        std=(0.3530,) if fm else (0.3081,),
        source=str(folder),
    )


# --------------------------------------------------------------------------------------------
# downloads (lazy torchvision)


def _download_torchvision(name: str) -> str | None:
    """Download ``name`` into the cache's data folder; return an error message or None."""
    root = _download_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        if name == "tinyimagenet":
            from torchvision.datasets.utils import download_and_extract_archive

            download_and_extract_archive(
                "http://cs231n.stanford.edu/tiny-imagenet-200.zip", download_root=str(root)
            )
            return None
        import torchvision.datasets as tvd

        cls = {
            "fmnist": tvd.FashionMNIST,
            "mnist": tvd.MNIST,
            "cifar10": tvd.CIFAR10,
            "cifar100": tvd.CIFAR100,
        }[name]
        for train in (True, False):
            cls(root=str(root), train=train, download=True)
        return None
    except Exception as exc:  # no network, no torchvision, disk full, ...: fall through
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        return text if len(text) <= 300 else text[:297] + "..."


# --------------------------------------------------------------------------------------------
# CIFAR pickles


def _get(d: dict[Any, Any], key: str) -> Any:
    if key.encode() in d:
        return d[key.encode()]
    if key in d:
        return d[key]
    raise KeyError(key)


def _load_pickle(path: Path) -> dict[Any, Any]:
    try:
        with path.open("rb") as f:
            obj = pickle.load(f, encoding="bytes")
    except Exception as exc:
        raise FedshiftError(f"cannot read CIFAR pickle {path}: {exc}") from exc
    if not isinstance(obj, dict):
        raise FedshiftError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _decode_str(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _cifar_batches(paths: Sequence[Path], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p in paths:
        d = _load_pickle(p)
        try:
            data = np.asarray(_get(d, "data"), dtype=np.uint8)
            labels = np.asarray(_get(d, label_key), dtype=np.int64)
        except KeyError as exc:
            raise FedshiftError(f"{p}: missing key {exc} in CIFAR pickle") from exc
        if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise FedshiftError(
                f"{p}: expected data [N, 3072] with N labels, got {data.shape} and {labels.shape}"
            )
        xs.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(labels)
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)


def _meta_names(path: Path, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    if not path.is_file():
        return default
    try:
        return tuple(_decode_str(c) for c in _get(_load_pickle(path), key))
    except KeyError:
        return default


def _check_labels(where: Path, classes: tuple[str, ...], *labels: np.ndarray) -> None:
    for y in labels:
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= len(classes)):
            raise FedshiftError(
                f"{where}: labels outside 0..{len(classes) - 1} for {len(classes)} classes"
            )


_CIFAR10_CLASSES = (
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
_CIFAR10_MEAN, _CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


def _has_cifar10_pickles(folder: Path) -> bool:
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return folder.is_dir() and all((folder / n).is_file() for n in names)


def _cifar10_from_pickles(folder: Path) -> RawDataset:
    x_tr, y_tr = _cifar_batches([folder / f"data_batch_{i}" for i in range(1, 6)], "labels")
    x_te, y_te = _cifar_batches([folder / "test_batch"], "labels")
    classes = _meta_names(folder / "batches.meta", "label_names", _CIFAR10_CLASSES)
    _check_labels(folder, classes, y_tr, y_te)
    return RawDataset(
        name="cifar10",
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        num_classes=len(classes),
        classes=classes,
        mean=_CIFAR10_MEAN,
        std=_CIFAR10_STD,
        source=f"{folder} (CIFAR-10 python pickles)",
    )


def _has_cifar100_pickles(folder: Path) -> bool:
    return folder.is_dir() and (folder / "train").is_file() and (folder / "test").is_file()


def _cifar100_from_pickles(folder: Path) -> RawDataset:
    x_tr, y_tr = _cifar_batches([folder / "train"], "fine_labels")
    x_te, y_te = _cifar_batches([folder / "test"], "fine_labels")
    default = tuple(f"class_{i}" for i in range(100))
    classes = _meta_names(folder / "meta", "fine_label_names", default)
    _check_labels(folder, classes, y_tr, y_te)
    return RawDataset(
        name="cifar100",
        x_train=x_tr,
        y_train=y_tr,
        x_test=x_te,
        y_test=y_te,
        num_classes=len(classes),
        classes=classes,
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
        source=f"{folder} (CIFAR-100 python pickles)",
    )


# --------------------------------------------------------------------------------------------
# JPEG decoding and the decoded-array cache


def _decode_one(blob: bytes | memoryview | Path, size: int) -> np.ndarray:
    from PIL import Image

    img = Image.open(blob if isinstance(blob, Path) else io.BytesIO(blob))
    try:
        if img.mode != "RGB":
            img = img.convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(img, dtype=np.uint8)
    finally:
        img.close()


def _decode_jpeg_images(blobs: Sequence[bytes | memoryview | Path], size: int) -> np.ndarray:
    """Decode images (bytes or file paths) to a uint8 array [N, size, size, 3]."""
    out = np.empty((len(blobs), size, size, 3), dtype=np.uint8)
    for i, blob in enumerate(blobs):
        try:
            out[i] = _decode_one(blob, size)
        except Exception as exc:
            where = blob if isinstance(blob, Path) else f"image {i}"
            raise FedshiftError(f"cannot decode {where}: {exc}") from exc
    return out


def _cache_file(kind: str, key_parts: Sequence[object]) -> Path:
    digest = hashlib.sha1(repr((_CACHE_FORMAT_VERSION, *key_parts)).encode()).hexdigest()[:16]
    return cache_root() / "decoded" / f"{kind}-{digest}.npz"


_CACHE_KEYS = ("x_train", "y_train", "x_test", "y_test", "classes")


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in _CACHE_KEYS}
    except Exception as exc:
        warnings.warn(f"ignoring unreadable cache file {path}: {exc}", stacklevel=3)
        return None


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=path.stem + ".", suffix=".tmp", delete=False
        ) as f:
            tmp_name = f.name
            np.savez(f, **arrays)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
        tmp_name = None
    except OSError as exc:
        warnings.warn(f"could not write cache file {path}: {exc}", stacklevel=3)
    finally:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)


def _cached_decode(
    kind: str, key_parts: Sequence[object], decode: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    path = _cache_file(kind, key_parts)
    arrays = _read_cache(path)
    if arrays is None:
        arrays = decode()
        _write_cache(path, arrays)
    return arrays


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def _cifar10_from_jpeg_npz(path: Path) -> RawDataset:
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
            out[f"x_{split}"] = _decode_jpeg_images(blobs, 32)
            out[f"y_{split}"] = labels.astype(np.int64)
        classes = parts.get("classes")
        out["classes"] = (
            np.asarray(classes).astype(str) if classes is not None else np.asarray(_CIFAR10_CLASSES)
        )
        return out

    a = _cached_decode("cifar10-jpeg", _file_key(path), decode)
    classes = tuple(str(c) for c in a["classes"])
    _check_labels(path, classes, a["y_train"], a["y_test"])
    return RawDataset(
        name="cifar10",
        x_train=a["x_train"],
        y_train=a["y_train"].astype(np.int64),
        x_test=a["x_test"],
        y_test=a["y_test"].astype(np.int64),
        num_classes=len(classes),
        classes=classes,
        mean=_CIFAR10_MEAN,
        std=_CIFAR10_STD,
        source=f"cifar10-jpeg npz (JPEG-derived CIFAR-10): {path}",
    )


def _load_cifar10(bases: list[Path], download: bool) -> RawDataset:
    def find() -> RawDataset | None:
        for folder in _candidates("cifar10", bases):
            if _has_cifar10_pickles(folder):
                return _cifar10_from_pickles(folder)
        for f in _candidates("cifar10-jpeg", bases):
            if f.is_file():
                return _cifar10_from_jpeg_npz(f)
        return None

    ds = _find_or_download("cifar10", bases, ["cifar10", "cifar10-jpeg"], download, find)
    return ds


def _load_cifar100(bases: list[Path], download: bool) -> RawDataset:
    def find() -> RawDataset | None:
        for folder in _candidates("cifar100", bases):
            if _has_cifar100_pickles(folder):
                return _cifar100_from_pickles(folder)
        return None

    ds = _find_or_download("cifar100", bases, ["cifar100"], download, find)
    return ds


# --------------------------------------------------------------------------------------------
# Tiny-ImageNet

_JPEG_SUFFIXES = {".jpeg", ".jpg"}


def _is_tiny_imagenet(folder: Path) -> bool:
    return (
        (folder / "wnids.txt").is_file()
        and (folder / "train").is_dir()
        and (folder / "val" / "val_annotations.txt").is_file()
    )


def _tiny_imagenet_listing(
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


def _tiny_imagenet_class_names(folder: Path, wnids: list[str]) -> tuple[str, ...]:
    words: dict[str, str] = {}
    wf = folder / "words.txt"
    if wf.is_file():
        for line in wf.read_text(errors="replace").splitlines():
            wnid, _, text = line.partition("\t")
            if text:
                words[wnid.strip()] = text.split(",")[0].strip()
    return tuple(words.get(w, w) for w in wnids)


def _tiny_imagenet_from_folder(folder: Path) -> RawDataset:
    wnids, tr_p, tr_y, va_p, va_y = _tiny_imagenet_listing(folder)
    key = (
        _file_key(folder / "wnids.txt"),
        _file_key(folder / "val" / "val_annotations.txt"),
        len(tr_p),
        str(tr_p[-1]),
    )

    def decode() -> dict[str, np.ndarray]:
        return {
            "x_train": _decode_jpeg_images(tr_p, 64),
            "y_train": np.asarray(tr_y, dtype=np.int64),
            "x_test": _decode_jpeg_images(va_p, 64),
            "y_test": np.asarray(va_y, dtype=np.int64),
            "classes": np.asarray(wnids),
        }

    a = _cached_decode("tinyimagenet", key, decode)
    classes = _tiny_imagenet_class_names(folder, [str(w) for w in a["classes"]])
    _check_labels(folder, classes, a["y_train"], a["y_test"])
    return RawDataset(
        name="tinyimagenet",
        x_train=a["x_train"],
        y_train=a["y_train"].astype(np.int64),
        x_test=a["x_test"],
        y_test=a["y_test"].astype(np.int64),
        num_classes=len(classes),
        classes=classes,
        mean=(0.4802, 0.4481, 0.3975),
        std=(0.2770, 0.2691, 0.2821),
        source=f"{folder} (Tiny-ImageNet-200; val split used as test set)",
    )


def _load_tinyimagenet(bases: list[Path], download: bool) -> RawDataset:
    def find() -> RawDataset | None:
        for folder in _candidates("tinyimagenet", bases):
            if _is_tiny_imagenet(folder):
                return _tiny_imagenet_from_folder(folder)
        return None

    ds = _find_or_download("tinyimagenet", bases, ["tinyimagenet"], download, find)
    return ds


# --------------------------------------------------------------------------------------------
# always-available datasets


def _load_digits(seed: int = 0, test_size: float = 0.2) -> RawDataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < float(test_size) < 1.0:
        raise FedshiftError(f"digits: test_size must be in (0, 1), got {test_size!r}")
    bunch = load_digits()
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
        classes=_DIGIT_CLASSES,
        mean=(float(scaled.mean()),),
        std=(float(scaled.std()),),
        source="scikit-learn",
    )


def _load_synthetic(
    num_classes: int = 10,
    dim: int = 32,
    n_train: int = 6000,
    n_test: int = 2000,
    separation: float = 3.0,
    seed: int = 0,
) -> RawDataset:
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


# --------------------------------------------------------------------------------------------
# entry point

_OPTIONS: dict[str, tuple[str, ...]] = {
    "digits": ("seed", "test_size"),
    "synthetic": ("num_classes", "dim", "n_train", "n_test", "separation", "seed"),
}


def load_dataset(
    name: str, data_dir: str | Path | None = None, *, download: bool = True, **options: Any
) -> RawDataset:
    """Load dataset ``name`` (case-insensitive, aliases accepted) as a :class:`RawDataset`.

    ``data_dir`` overrides ``FEDSHIFT_DATA``; ``download`` allows a torchvision download into the
    cache when no local copy is found; ``options`` are dataset-specific (e.g. for ``synthetic``).
    """
    canonical = resolve_name(name)
    allowed = _OPTIONS.get(canonical, ())
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise FedshiftError(
            f"dataset {canonical!r} does not accept option(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(allowed) if allowed else '(none)'}"
        )
    if canonical == "synthetic":
        return _load_synthetic(**options)
    if canonical == "digits":
        return _load_digits(**options)
    bases = search_dirs(data_dir)
    if canonical in ("fmnist", "mnist"):
        return _load_mnist_like(canonical, bases, download)
    if canonical == "cifar10":
        return _load_cifar10(bases, download)
    if canonical == "cifar100":
        return _load_cifar100(bases, download)
    return _load_tinyimagenet(bases, download)
