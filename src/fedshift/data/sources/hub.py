"""Any image-classification dataset in the Hugging Face ``datasets`` format (issue 25): from the
hub when online, offline from a local copy.

``dataset: hf`` (aliases ``huggingface``, ``hub``) takes these ``dataset_options``:

- ``path`` (required): a hub id (``uoft-cs/cifar10``), or a local copy: a folder written by
  ``save_to_disk``, a parquet file or a folder of them (splits named by the files:
  ``train-00000-of-00001.parquet``, ``test.parquet``; a lone file is ``train``), or an image
  folder (``<split>/<class>/<image>``, as ``datasets``' ``imagefolder`` reads it). A relative
  path is looked for under the data directories (``--data-dir`` or ``FEDSHIFT_DATA``, then the
  usual ones, see :mod:`fedshift.data.sources`), then in the current directory; one found
  nowhere that reads like a hub id is loaded from the hub.
- ``format``: ``auto`` (what ``path`` holds) | ``disk`` | ``parquet`` | ``imagefolder`` | ``hub``.
- ``subset``, ``revision``: the hub dataset's configuration name and git revision.
- ``image_column``, ``label_column``: default: the first ``Image`` column (else one named
  ``image``, ``img`` or ``pixel_values``) and the first ``ClassLabel`` column (else one named
  ``label``, ``labels``, ``fine_label`` or ``target``).
- ``train_split`` (``train``) and ``test_split`` (default: ``test`` when there is one). With no
  test split, or ``test_split`` equal to ``train_split``, a ``test_fraction`` (0.2) of the
  training split, stratified by label and shuffled with ``seed`` (0), is the test set.
- ``image_size``: resize every image to ``size`` x ``size`` (or ``[height, width]``); needed when
  the images differ in size. ``channels``: 1 or 3 (default: 1 when every image is grayscale).
- ``factor_columns``: integer, boolean, string or ``ClassLabel`` columns kept as per-sample
  factors (:attr:`RawDataset.factors_train`), e.g. for ``attributes: {kind: factor, factor: <column>}``.

Labels: a ``ClassLabel`` column names the classes; integer, boolean or string labels become
``0..K-1`` in sorted order of their values. Decoded images are cached under
``<cache>/decoded``, keyed by the options and the data (size and time of every file of a local
copy; the split fingerprints of a hub dataset). ``datasets`` converts local parquet files and
image folders to Arrow under ``<cache>/hf``; hub downloads go to the Hugging Face cache
(``HF_HOME``), and with ``HF_HUB_OFFLINE=1`` only datasets already there load.

``datasets`` is imported inside the loader (the ``hub`` extra).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from fedshift.core.errors import DatasetNotFoundError, FedshiftError
from fedshift.data.sources import DATASETS, RawDataset, channel_stats
from fedshift.data.sources.cache import cached_decode, file_key
from fedshift.data.sources.hub_images import decode_images
from fedshift.data.sources.lookup import cache_root, search_dirs

EXTRA_HINT = 'pip install "fedshift[hub]"'
FORMATS = ("auto", "disk", "parquet", "imagefolder", "hub")
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_IMAGE_NAMES = ("image", "img", "pixel_values")
_LABEL_NAMES = ("label", "labels", "fine_label", "target")


def require_datasets() -> ModuleType:
    """The ``datasets`` module, or a one-line error naming the extra to install."""
    try:
        import datasets
    except ImportError:
        raise FedshiftError(
            f"dataset 'hf' needs the Hugging Face datasets package: {EXTRA_HINT}"
        ) from None
    return datasets


def _fail(message: str) -> FedshiftError:
    return FedshiftError(f"dataset 'hf': {message}")


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class HubOptions:
    """The source's options, checked (see the module docs)."""

    path: str
    format: str = "auto"
    subset: str | None = None
    revision: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    train_split: str = "train"
    test_split: str | None = None
    test_fraction: float = 0.2
    seed: int = 0
    image_size: tuple[int, int] | None = None
    channels: int | None = None
    factor_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise _fail(
                "dataset_options.path is required: a hub id (e.g. uoft-cs/cifar10) or a local "
                "save_to_disk folder, parquet file(s) or image folder"
            )
        if self.format not in FORMATS:
            raise _fail(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if not 0.0 < float(self.test_fraction) < 1.0:
            raise _fail(f"test_fraction must be in (0, 1), got {self.test_fraction!r}")
        if self.channels not in (None, 1, 3):
            raise _fail(f"channels must be 1 or 3, got {self.channels!r}")
        if self.image_size is not None and min(self.image_size) < 1:
            raise _fail(f"image_size must be positive, got {list(self.image_size)}")

    @classmethod
    def of(cls, options: dict[str, Any]) -> HubOptions:
        """The options as a config gives them (``image_size`` an int or a pair, lists)."""
        opts = dict(options)
        size = opts.get("image_size")
        if size is not None:
            pair = [size, size] if isinstance(size, int) else list(size)
            if len(pair) != 2 or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in pair
            ):
                raise _fail(f"image_size must be an int or [height, width], got {size!r}")
            opts["image_size"] = (pair[0], pair[1])
        factors = opts.get("factor_columns") or ()
        opts["factor_columns"] = (factors,) if isinstance(factors, str) else tuple(factors)
        return cls(**opts)


@dataclass(frozen=True)
class HubData:
    """A loaded dataset and where its samples come from: ``rows_train[j]`` is the row of split
    ``train_split`` holding training sample j (likewise for the test set)."""

    raw: RawDataset
    train_split: str
    rows_train: np.ndarray
    test_split: str
    rows_test: np.ndarray


# --------------------------------------------------------------------------------- opening


def _find_local(path: str, data_dir: str | Path | None) -> Path | None:
    p = Path(path).expanduser()
    if p.is_absolute():
        return p if p.exists() else None
    for base in [*search_dirs(data_dir), Path.cwd()]:
        if (base / p).exists():
            return base / p
    return None


def _detect(p: Path) -> str:
    if p.is_file():
        if p.suffix == ".parquet":
            return "parquet"
        raise _fail(f"cannot tell the format of {p}; set format: disk, parquet or imagefolder")
    if (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
        return "disk"
    files = [f for f in p.rglob("*") if f.is_file()]
    if any(f.suffix == ".parquet" for f in files):
        return "parquet"
    if any(f.suffix.lower() in _IMAGE_SUFFIXES for f in files):
        return "imagefolder"
    raise _fail(
        f"{p} holds no dataset: expected a save_to_disk folder (dataset_dict.json or state.json), "
        "parquet files or <split>/<class>/ image folders"
    )


def _files_key(p: Path) -> str:
    """A digest that changes when any file under ``p`` (or ``p`` itself) does."""
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    return hashlib.sha1(repr([file_key(f) for f in files]).encode()).hexdigest()


def _as_splits(obj: Any) -> dict[str, Any]:
    return dict(obj) if hasattr(obj, "keys") else {"train": obj}


def _open_local(datasets: ModuleType, p: Path, fmt: str) -> dict[str, Any]:
    cache = str(cache_root() / "hf")
    quiet = not datasets.utils.are_progress_bars_disabled()
    if quiet:
        datasets.utils.disable_progress_bars()
    try:
        if fmt == "disk":
            return _as_splits(datasets.load_from_disk(str(p)))
        if fmt == "parquet" and p.is_file():
            files = {"data_files": {"train": str(p)}}
        else:
            files = {"data_dir": str(p)}
        return _as_splits(datasets.load_dataset(fmt, cache_dir=cache, **files))
    except Exception as exc:
        raise _fail(f"cannot read {p} as {fmt}: {_one_line(exc)}") from None
    finally:
        if quiet:
            datasets.utils.enable_progress_bars()


def _open_hub(datasets: ModuleType, opts: HubOptions, data_dir: str | Path | None) -> dict:
    try:
        return _as_splits(datasets.load_dataset(opts.path, opts.subset, revision=opts.revision))
    except Exception as exc:
        looked = ", ".join(str(b) for b in [*search_dirs(data_dir), Path.cwd()])
        offline = bool(datasets.config.HF_HUB_OFFLINE) or os.environ.get(
            "HF_DATASETS_OFFLINE", ""
        ).strip().lower() in ("1", "true", "yes", "on")
        why = (
            "the hub is offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set) with no copy "
            "in the Hugging Face cache: load it once online, or give a local copy"
            if offline
            else f"loading it from the hub failed: {_one_line(exc)}"
        )
        raise DatasetNotFoundError(
            f"dataset 'hf': {opts.path!r} is no local path (looked under {looked}), and {why}"
        ) from None


def _open(opts: HubOptions, data_dir: str | Path | None) -> tuple[dict, str, str, tuple]:
    """The splits, where they came from, the format and a cache-key part for the data."""
    datasets = require_datasets()
    local = None if opts.format == "hub" else _find_local(opts.path, data_dir)
    if local is None:
        if opts.format not in ("auto", "hub") or not _HUB_ID.match(opts.path):
            looked = ", ".join(str(b) for b in [*search_dirs(data_dir), Path.cwd()])
            raise DatasetNotFoundError(
                f"dataset 'hf': path {opts.path!r} does not exist (looked under {looked}); "
                "give a save_to_disk folder, parquet file(s), an image folder or a hub id"
            )
        splits = _open_hub(datasets, opts, data_dir)
        prints = tuple((name, ds._fingerprint) for name, ds in sorted(splits.items()))
        return splits, f"hub:{opts.path}", "hub", (opts.path, opts.subset, opts.revision, prints)
    fmt = _detect(local) if opts.format == "auto" else opts.format
    splits = _open_local(datasets, local, fmt)
    return splits, str(local), fmt, (str(local.resolve()), fmt, _files_key(local))


# --------------------------------------------------------------------------------- columns


def _split_names(splits: dict, opts: HubOptions, where: str) -> tuple[str, str | None]:
    """(train split, test split or None to hold a fraction of the training split out)."""
    names = ", ".join(splits)
    if opts.train_split not in splits:
        raise _fail(f"{where} has no split {opts.train_split!r} (train_split); its splits: {names}")
    test = opts.test_split
    if test is None:
        return opts.train_split, (
            "test" if "test" in splits and opts.train_split != "test" else None
        )
    if test not in splits:
        raise _fail(f"{where} has no split {test!r} (test_split); its splits: {names}")
    return opts.train_split, (None if test == opts.train_split else test)


def _column(ds: Any, given: str | None, option: str, typ: type, names: tuple, where: str) -> str:
    feats = ds.features
    have = ", ".join(feats)
    if given is not None:
        if given not in feats:
            raise _fail(f"{where} has no column {given!r} ({option}); its columns: {have}")
        return given
    found = [c for c, f in feats.items() if isinstance(f, typ)] + [c for c in names if c in feats]
    if not found:
        raise _fail(
            f"{where}: no {option.split('_')[0]} column found; its columns: {have} (set {option})"
        )
    return found[0]


def _values(ds: Any, col: str, what: str, where: str) -> np.ndarray:
    arr = ds.select_columns([col]).with_format("arrow")[:].column(col)
    if arr.null_count:
        raise _fail(f"{where}: {arr.null_count} rows have no {what} (column {col!r})")
    return arr.to_numpy(zero_copy_only=False)


def _encode(
    datasets: ModuleType, parts: Sequence[tuple[Any, str]], col: str, what: str
) -> tuple[list[np.ndarray], tuple[str, ...]]:
    """The int64 codes of column ``col`` in each (split, where) and the names of the codes:
    a ClassLabel's names, else the sorted distinct values."""
    feat = parts[0][0].features[col]
    if not isinstance(feat, datasets.ClassLabel | datasets.Value):
        raise _fail(
            f"column {col!r} ({what}) holds {type(feat).__name__} values; it must hold "
            "integers, booleans, strings or a ClassLabel"
        )
    values = [_values(ds, col, what, where) for ds, where in parts]
    if isinstance(feat, datasets.ClassLabel):
        for v, (_, where) in zip(values, parts, strict=True):
            bad = int(((v < 0) | (v >= feat.num_classes)).sum())
            if bad:
                raise _fail(
                    f"{where}: {bad} rows have no {what} (column {col!r} is -1 or out of range); "
                    "set test_split to a labelled split, or to train_split to hold a test "
                    "fraction out of it"
                )
        return [v.astype(np.int64) for v in values], tuple(str(n) for n in feat.names)
    kinds = {v.dtype.kind for v in values}
    if not kinds <= {"i", "u", "b", "U", "O"}:
        raise _fail(
            f"column {col!r} ({what}) holds {values[0].dtype} values; it must hold integers, "
            "booleans, strings or a ClassLabel"
        )
    distinct, codes = np.unique(np.concatenate(values), return_inverse=True)
    cuts = np.cumsum([len(v) for v in values])[:-1]
    return [c.astype(np.int64) for c in np.split(codes, cuts)], tuple(str(d) for d in distinct)


# --------------------------------------------------------------------------------- loading


def hold_out(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) rows: ``fraction`` of each label's rows (rounded) tested, picked
    with ``seed``."""
    test = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        perm = np.random.default_rng([int(seed), int(c)]).permutation(idx)
        test.append(perm[: int(round(fraction * len(idx)))])
    test_rows = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    if not len(test_rows):
        raise _fail(f"test_fraction={fraction} of the training split leaves no test sample")
    train_rows = np.setdiff1d(np.arange(len(labels)), test_rows)
    return train_rows.astype(np.int64), test_rows.astype(np.int64)


def read_hub(data_dir: str | Path | None = None, **options: Any) -> HubData:
    """Load a dataset in the Hugging Face format (``options``: see the module docs), with the
    rows its samples come from."""
    opts = HubOptions.of(options)
    datasets = require_datasets()
    splits, where, fmt, data_key = _open(opts, data_dir)
    train_name, test_name = _split_names(splits, opts, where)
    parts = [(splits[train_name], f"{where} [{train_name}]")]
    if test_name is not None:
        parts.append((splits[test_name], f"{where} [{test_name}]"))
    image_col = _column(
        parts[0][0], opts.image_column, "image_column", datasets.Image, _IMAGE_NAMES, where
    )
    label_col = _column(
        parts[0][0], opts.label_column, "label_column", datasets.ClassLabel, _LABEL_NAMES, where
    )
    for ds, at in parts[1:]:
        for col, option in [(image_col, "image_column"), (label_col, "label_column")] + [
            (f, "factor_columns") for f in opts.factor_columns
        ]:
            _column(ds, col, option, type(None), (), at)
    for f in opts.factor_columns:
        _column(parts[0][0], f, "factor_columns", type(None), (), parts[0][1])
    labels, classes = _encode(datasets, parts, label_col, "label")
    if not len(labels[0]):
        raise _fail(f"{parts[0][1]} is empty")
    factors = {f: _encode(datasets, parts, f, f"factor {f!r}") for f in opts.factor_columns}

    def decode() -> dict[str, np.ndarray]:
        x = decode_images(datasets, parts, image_col, opts.image_size, opts.channels)
        x_test = x[1] if len(x) > 1 else np.zeros((0, *x[0].shape[1:]), np.uint8)
        y_test = labels[1] if len(labels) > 1 else np.zeros(0, np.int64)
        return {
            "x_train": x[0],
            "y_train": labels[0],
            "x_test": x_test,
            "y_test": y_test,
            "classes": np.asarray(classes),
        }

    size = None if opts.image_size is None else list(opts.image_size)
    key = ("hf", data_key, train_name, test_name, image_col, size, opts.channels)
    arrays = cached_decode("hf", key, decode)
    x_full, y_full = arrays["x_train"], labels[0]
    if test_name is None:
        tr, te = hold_out(y_full, float(opts.test_fraction), int(opts.seed))
        x = (x_full[tr], y_full[tr], x_full[te], y_full[te])
        f_tr = {f: codes[0][tr] for f, (codes, _) in factors.items()}
        f_te = {f: codes[0][te] for f, (codes, _) in factors.items()}
        test_name = train_name
    else:
        tr, te = np.arange(len(y_full)), np.arange(len(labels[1]))
        x = (x_full, y_full, arrays["x_test"], labels[1])
        f_tr = {f: codes[0] for f, (codes, _) in factors.items()}
        f_te = {f: codes[1] for f, (codes, _) in factors.items()}
    mean, std = channel_stats(x[0])
    h, w, c = x[0].shape[1:]
    raw = RawDataset.of_images(
        f"hf:{opts.path}",
        Path(where),
        x,
        classes,
        mean,
        std,
        f"{where} ({fmt}; {train_name}/{test_name}; {h}x{w}x{c})",
        factors_train=f_tr,
        factors_test=f_te,
        factor_values={f: names for f, (_, names) in factors.items()},
    )
    return HubData(raw, train_name, tr.astype(np.int64), test_name, te.astype(np.int64))


@DATASETS.register("hf", "huggingface", "hugging-face", "hub")
def load_hf(
    data_dir: str | Path | None,
    download: bool,
    *,
    path: str | None = None,
    format: str = "auto",
    subset: str | None = None,
    revision: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    train_split: str = "train",
    test_split: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    image_size: int | Sequence[int] | None = None,
    channels: int | None = None,
    factor_columns: Sequence[str] | None = None,
) -> RawDataset:
    """Any image-classification dataset in the Hugging Face ``datasets`` format, from the hub or
    a local copy; see the module docs. ``download`` is not used (the Hugging Face cache and its
    offline switches decide)."""
    options = {k: v for k, v in locals().items() if k not in ("data_dir", "download")}
    return read_hub(data_dir, **options).raw
