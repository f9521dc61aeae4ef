"""File formats shared by the sources: IDX files, CIFAR python pickles and JPEG images."""

from __future__ import annotations

import gzip
import io
import pickle
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedshift.core.errors import FedshiftError

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


def cifar_batches(paths: Sequence[Path], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, 32, 32, 3] uint8 and int64 labels from CIFAR python pickle batches."""
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


def meta_names(path: Path, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """Class names stored under ``key`` in a CIFAR meta pickle, else ``default``."""
    if not path.is_file():
        return default
    try:
        return tuple(_decode_str(c) for c in _get(_load_pickle(path), key))
    except KeyError:
        return default


def check_labels(where: Path, classes: tuple[str, ...], *labels: np.ndarray) -> None:
    """Raise unless every label is in ``0..len(classes)-1``."""
    for y in labels:
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= len(classes)):
            raise FedshiftError(
                f"{where}: labels outside 0..{len(classes) - 1} for {len(classes)} classes"
            )


# --------------------------------------------------------------------------------------------
# JPEG


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


def decode_jpeg_images(blobs: Sequence[bytes | memoryview | Path], size: int) -> np.ndarray:
    """Decode images (bytes or file paths) to a uint8 array [N, size, size, 3]."""
    out = np.empty((len(blobs), size, size, 3), dtype=np.uint8)
    for i, blob in enumerate(blobs):
        try:
            out[i] = _decode_one(blob, size)
        except Exception as exc:
            where = blob if isinstance(blob, Path) else f"image {i}"
            raise FedshiftError(f"cannot decode {where}: {exc}") from exc
    return out
