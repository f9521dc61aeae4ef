"""Digit domains: MNIST, USPS and MNIST-M as one dataset whose ``domain`` factor is the source
(0 mnist, 1 usps, 2 mnist-m), for attribute skew / feature shift by domain (FedBN, DFL).

Files under the data directory: ``mnist/raw/`` (the four IDX files, read by :mod:`.mnist`),
``usps/usps_16x16.npz`` (x_train_u8 / x_test_u8 [N, 16, 16], y_train / y_test) and
``mnist-m/mnist_m_png.npz`` (PNG bytes with offsets, decoded once with Pillow and cached under
``<cache>/decoded``). Every image is resized (bilinear) to ``size`` x ``size`` (default 28, as
FedBN) and has 3 channels (grey repeated); labels 0-9. Normalisation is FedBN's (0.5, 0.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset, formats
from fedshift.data.sources.cache import cached_decode, file_key
from fedshift.data.sources.lookup import candidates, not_found, search_dirs
from fedshift.data.sources.mnist import load_mnist

DOMAINS = ("mnist", "usps", "mnist-m")
_FILES = {
    "usps": (("usps", "USPS", "."), "usps_16x16.npz"),
    "mnist-m": (("mnist-m", "mnist_m", "mnistm", "."), "mnist_m_png.npz"),
}
_HINTS = {
    "usps": "put usps/usps_16x16.npz (x_train_u8, y_train, x_test_u8, y_test; the Hull split) "
    "under FEDSHIFT_DATA or --data-dir",
    "mnist-m": "put mnist-m/mnist_m_png.npz (train_png, train_offsets, train_labels, test_png, "
    "test_offsets, test_labels) under FEDSHIFT_DATA or --data-dir",
}

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def resize_grey(images: np.ndarray, size: int) -> np.ndarray:
    """Grey uint8 images [N, H, W] resized (bilinear) to [N, size, size]."""
    if images.shape[1:] == (size, size):
        return images
    from PIL import Image

    out = np.empty((len(images), size, size), dtype=np.uint8)
    for i, img in enumerate(images):
        pil = Image.fromarray(img).resize((size, size), Image.Resampling.BILINEAR)
        out[i] = np.asarray(pil, dtype=np.uint8)
    return out


def to_rgb(images: np.ndarray) -> np.ndarray:
    """[N, H, W] or [N, H, W, 1] grey to [N, H, W, 3] (repeated); RGB unchanged."""
    if images.ndim == 3:
        images = images[..., None]
    return np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images


def _find(domain: str, data_dir: str | Path | None) -> Path:
    subdirs, fname = _FILES[domain]
    bases = search_dirs(data_dir)
    for folder in candidates(bases, subdirs):
        if (folder / fname).is_file():
            return folder / fname
    not_found(
        f"digit-domains/{domain}",
        bases,
        [f"{s}/{fname}" if s != "." else fname for s in subdirs],
        _HINTS[domain],
        "it is not downloaded automatically",
    )


def _mnist(data_dir: str | Path | None, download: bool, size: int) -> tuple[Split, str]:
    ds = load_mnist(data_dir, download)
    split = (
        to_rgb(resize_grey(ds.x_train[..., 0], size)),
        ds.y_train,
        to_rgb(resize_grey(ds.x_test[..., 0], size)),
        ds.y_test,
    )
    return split, ds.source


def _usps(path: Path, size: int) -> Split:
    try:
        with np.load(path, allow_pickle=False) as z:
            parts = [z[k] for k in ("x_train_u8", "y_train", "x_test_u8", "y_test")]
    except Exception as exc:
        raise FedshiftError(f"cannot read USPS file {path}: {exc}") from None
    x_tr, y_tr, x_te, y_te = parts
    return to_rgb(resize_grey(x_tr, size)), y_tr, to_rgb(resize_grey(x_te, size)), y_te


def _mnist_m(path: Path, size: int) -> Split:
    def decode() -> dict[str, np.ndarray]:
        try:
            with np.load(path, allow_pickle=False) as z:
                parts = {k: z[k] for k in z.files}
            out: dict[str, np.ndarray] = {"classes": np.asarray([str(i) for i in range(10)])}
            for split, name in (("train", "x_train"), ("test", "x_test")):
                png, offs = parts[f"{split}_png"], parts[f"{split}_offsets"]
                blobs = [memoryview(png[offs[i] : offs[i + 1]]) for i in range(len(offs) - 1)]
                out[name] = formats.decode_jpeg_images(blobs, size)  # Pillow reads PNG too
                out["y" + name[1:]] = parts[f"{split}_labels"].astype(np.int64)
        except KeyError as exc:
            raise FedshiftError(f"{path}: missing key {exc} in the MNIST-M npz") from None
        return out

    a = cached_decode("mnist-m", (file_key(path), size), decode)
    return a["x_train"], a["y_train"], a["x_test"], a["y_test"]


def cap(split: Split, limit: int | None, rng: np.random.Generator) -> Split:
    """At most ``limit`` random samples of the train and of the test set (order kept)."""
    if limit is None:
        return split
    out = []
    for x, y in ((split[0], split[1]), (split[2], split[3])):
        keep = np.sort(rng.permutation(len(y))[:limit]) if len(y) > limit else np.arange(len(y))
        out += [x[keep], y[keep]]
    return tuple(out)  # type: ignore[return-value]


def _check(domains: Sequence[str] | None, size: int, max_per_domain: int | None) -> list[str]:
    chosen = list(DOMAINS if domains is None else domains)
    bad = [d for d in chosen if d not in DOMAINS]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise FedshiftError(
            f"digit-domains: domains must be distinct names among {', '.join(DOMAINS)}, "
            f"got {domains!r}"
        )
    if int(size) < 8:
        raise FedshiftError(f"digit-domains: size must be at least 8, got {size!r}")
    if max_per_domain is not None and int(max_per_domain) < 1:
        raise FedshiftError(f"digit-domains: max_per_domain must be >= 1, got {max_per_domain!r}")
    return [d for d in DOMAINS if d in chosen]


@DATASETS.register("digit-domains", "digit_domains")
def load_digit_domains(
    data_dir: str | Path | None,
    download: bool,
    *,
    domains: Sequence[str] | None = None,
    size: int = 28,
    max_per_domain: int | None = None,
    seed: int = 0,
) -> RawDataset:
    """MNIST, USPS and MNIST-M (``domains``: a subset, default all) at ``size`` x ``size`` x 3,
    each domain's train and test set capped at ``max_per_domain`` random samples (``seed``);
    factor ``domain`` (0 mnist, 1 usps, 2 mnist-m). ``download`` applies to MNIST only."""
    chosen = _check(domains, size, max_per_domain)
    size = int(size)
    parts: list[Split] = []
    where = []
    for d in chosen:
        if d == "mnist":
            split, source = _mnist(data_dir, download, size)
            where.append(source)
        else:
            path = _find(d, data_dir)
            split = _usps(path, size) if d == "usps" else _mnist_m(path, size)
            where.append(str(path))
        rng = np.random.default_rng([int(seed), DOMAINS.index(d)])
        parts.append(cap(split, max_per_domain, rng))
    ids = [DOMAINS.index(d) for d in chosen]
    dom_tr = np.concatenate(
        [np.full(len(p[1]), i, np.int64) for i, p in zip(ids, parts, strict=True)]
    )
    dom_te = np.concatenate(
        [np.full(len(p[3]), i, np.int64) for i, p in zip(ids, parts, strict=True)]
    )
    arrays = tuple(np.concatenate([p[j] for p in parts]) for j in range(4))
    return RawDataset.of_images(
        "digit-domains",
        Path(where[0]),
        arrays,  # type: ignore[arg-type]
        tuple(str(i) for i in range(10)),
        (0.5, 0.5, 0.5),
        (0.5, 0.5, 0.5),
        f"digit domains {'+'.join(chosen)} ({'; '.join(where)}), {size}x{size} RGB",
        factors_train={"domain": dom_tr},
        factors_test={"domain": dom_te},
        factor_values={"domain": DOMAINS},
    )
