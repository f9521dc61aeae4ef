"""Images of a Hugging Face dataset column as one uint8 array [N, H, W, C] per split (the
:mod:`~fedshift.data.sources.hub` source): ``Image`` columns decoded with Pillow from their
bytes or files, array columns read as pixels; resized on request, grayscale or RGB throughout.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from fedshift.core.errors import FedshiftError

#: Pillow modes read as grayscale (every other mode is converted to RGB, alpha dropped)
GRAY_MODES = {"1", "L", "LA", "La", "I", "I;16", "F"}


def _fail(message: str) -> FedshiftError:
    return FedshiftError(f"dataset 'hf': {message}")


def _decode_one(item: dict, size: tuple[int, int] | None) -> np.ndarray:
    from PIL import Image

    img = Image.open(io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"])
    try:
        img = img.convert("L" if img.mode in GRAY_MODES else "RGB")
        if size is not None and img.size != size[::-1]:
            img = img.resize(size[::-1], Image.Resampling.BILINEAR)
        return np.asarray(img, dtype=np.uint8)
    finally:
        img.close()


def _as_pixels(a: np.ndarray, where: str) -> np.ndarray:
    """An array column's entry as uint8 (floats in [0, 1] scaled by 255)."""
    if a.dtype.kind == "f":
        a = a * 255.0 if a.size and float(np.nanmax(a)) <= 1.0 else a
        return np.clip(np.rint(a), 0, 255).astype(np.uint8)
    if a.dtype.kind in "iub":
        return np.clip(a, 0, 255).astype(np.uint8)
    raise _fail(f"{where}: image arrays of dtype {a.dtype} cannot be read as pixels")


def _resize(a: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    if a.shape[:2] == size:
        return a
    img = Image.fromarray(a[..., 0] if a.ndim == 3 and a.shape[-1] == 1 else a)
    return np.asarray(img.resize(size[::-1], Image.Resampling.BILINEAR))


def decode_split(
    datasets: ModuleType, ds: Any, col: str, size: tuple[int, int] | None, where: str
) -> list[np.ndarray]:
    """The split's images as uint8 arrays [H, W] (grayscale) or [H, W, C], resized to ``size``
    (height, width) when given."""
    if isinstance(ds.features[col], datasets.Image):
        files = ds.select_columns([col]).cast_column(col, datasets.Image(decode=False))
        out = []
        for batch in files.iter(batch_size=1024):
            for item in batch[col]:
                try:
                    out.append(_decode_one(item, size))
                except Exception as exc:
                    why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                    raise _fail(f"{where}: cannot decode image {len(out)}: {why}") from None
        return out
    if isinstance(ds.features[col], datasets.Value | datasets.ClassLabel):
        raise _fail(
            f"{where}: column {col!r} holds {type(ds.features[col]).__name__} values, not images; "
            "set image_column"
        )
    table = ds.select_columns([col]).with_format("numpy")[:]
    arrays = [_as_pixels(np.asarray(a), where) for a in table[col]]
    if any(a.ndim not in (2, 3) for a in arrays):
        raise _fail(
            f"{where}: column {col!r} holds arrays of shape {arrays[0].shape}, not images "
            "([H, W] or [H, W, C]); set image_column"
        )
    return arrays if size is None else [_resize(a, size) for a in arrays]


def stack(images: list[np.ndarray], channels: int) -> np.ndarray:
    """Images of one size as [N, H, W, channels] uint8 (RGB to gray by ITU-R 601 luma)."""
    out = []
    for a in images:
        a = a if a.ndim == 3 else a[..., None]
        if a.shape[-1] == 4:
            a = a[..., :3]
        if a.shape[-1] == 1 and channels == 3:
            a = np.repeat(a, 3, axis=-1)
        elif a.shape[-1] == 3 and channels == 1:
            weights = np.array([299, 587, 114])
            a = ((a.astype(np.int64) @ weights + 500) // 1000).astype(np.uint8)[..., None]
        out.append(a)
    return np.ascontiguousarray(np.stack(out)) if out else np.zeros((0, 1, 1, channels), np.uint8)


def decode_images(
    datasets: ModuleType,
    parts: Sequence[tuple[Any, str]],
    col: str,
    size: tuple[int, int] | None,
    channels: int | None,
) -> list[np.ndarray]:
    """Column ``col`` of each (split, where) as [N, H, W, C] uint8: one size (``size``, else an
    error when the images differ), ``channels`` channels (default: 1 when every image is
    grayscale, else 3)."""
    decoded = [decode_split(datasets, ds, col, size, where) for ds, where in parts]
    every = [a for d in decoded for a in d]
    sizes = sorted({a.shape[:2] for a in every})
    if len(sizes) > 1:
        shown = ", ".join(f"{h}x{w}" for h, w in sizes[:4]) + (", ..." if len(sizes) > 4 else "")
        raise _fail(
            f"the images differ in size ({shown}); set dataset_options.image_size "
            f"(e.g. image_size: {max(max(s) for s in sizes)}) to resize them"
        )
    gray = all(a.ndim == 2 or a.shape[-1] == 1 for a in every)
    channels = channels or (1 if gray else 3)
    return [stack(d, channels) for d in decoded]
