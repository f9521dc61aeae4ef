"""A client's data as a folder of its own, for a node that trains on local files (a Flower
SuperNode of a real deployment) and for moving a scenario's split to other tools.

Layout of a client folder::

    client.json          cid, num_classes, input_shape, mean, std (and what made it)
    train.npz, test.npz  x (images NHWC uint8, or features float32) and y (int64)

or a Hugging Face dataset saved with ``save_to_disk`` (splits ``train`` and ``test``, columns
``image`` and ``label`` unless ``client.json`` names others), or, for a person's own images,
``train/<class>/*.png|jpg`` and ``test/<class>/*`` with an optional ``client.json``: a class folder is named by the class index (``0``, ``1``, ...) or by
a name listed in ``client.json``'s ``classes``; images are read as RGB, or as grey when
``input_shape`` says one channel, and must all have the scenario's size.

:func:`export_clients` writes a scenario's training clients so (``fedshift export``): the
pixels and labels each client trains and is tested on in simulation (its style and label map
applied), so a deployment over the folders trains on the same samples in the same order.
:func:`read_clients` reads a folder back (a client folder, or a folder of them), each file
checked (:func:`split_fault`: a file that is not an npz archive, holds Python objects, inputs
of another shape or type than ``client.json`` says, labels of another length, a ``cid`` that is
not a whole number are one-line errors naming the file), and :func:`node_data` makes the node's
:class:`FederatedData` of them.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedshift.core.errors import FedshiftError
from fedshift.core.files import ensure_writable_dir
from fedshift.data.concepts import identity_map, make_label_map
from fedshift.data.features import apply_style, parse_style
from fedshift.data.federated import CLEAN, Client, FederatedData
from fedshift.data.sources.hub import require_datasets
from fedshift.data.sources.hub_images import decode_images

FORMAT = "fedshift-client-folder/1"
MANIFEST = "client.json"
REMAKE = "re-make the folder with `fedshift export CONFIG OUT`"
_IMAGES = {".png", ".jpg", ".jpeg"}


@dataclass
class FolderClient:
    """One client read from its folder: its id (None: not said), data and normalisation."""

    cid: int | None
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    mean: list[float]
    std: list[float]
    source: str


# ---------------------------------------------------------------------- export


def _nhwc(x: torch.Tensor) -> np.ndarray:
    """Pool entries as files keep them: images NHWC uint8, features as they are."""
    arr = x.detach().cpu().numpy()
    return arr.transpose(0, 2, 3, 1).copy() if arr.ndim == 4 else arr


def _private(path: Path) -> Any:
    """``path`` opened for writing, readable by its owner only (0600, an existing file too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "wb")


def _private_dir(path: Path) -> Path:
    """``path`` made (if needed) and open to its owner only (0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _exported(folder: Path) -> bool:
    """Whether ``folder`` is a client folder an export wrote (``client_<n>`` with its files)."""
    name = folder.name.removeprefix("client_")
    return (
        folder.is_dir()
        and not folder.is_symlink()
        and folder.name.startswith("client_")
        and name.isdigit()
        and (folder / MANIFEST).is_file()
    )


def check_export_target(out: Path, overwrite: bool = False) -> None:
    """An export may write to ``out``: a new or empty folder, or with ``overwrite`` one that
    holds an earlier export (refused otherwise, before anything is built); a new one is made
    here (0700), and a folder that cannot be made or written is refused too."""
    fix = "give OUT a new or empty folder that you can write to"
    ensure_writable_dir(out, "export: folder", fix, mode=0o700)
    if any(out.iterdir()) and not overwrite:
        raise FedshiftError(
            f"export: {out} is not empty; give --overwrite to replace the export there (its "
            "client_<n> folders are removed first) or choose an empty folder"
        )


def export_clients(
    data: FederatedData, out: Path, made_by: str = "", overwrite: bool = False
) -> list[Path]:
    """Write every training client of ``data`` to ``out/client_<cid>`` (see the module's doc);
    return the folders, and their files, readable by their owner only. A folder that is not
    empty is refused unless ``overwrite``, which first removes the client folders of an earlier
    export there. Drift scenarios are refused (a client's data changes with time)."""
    if data.steps:
        raise FedshiftError(
            "export: this scenario's data changes over time (scenario.drift or time steps); "
            "export a static scenario"
        )
    check_export_target(out, overwrite)
    for old in sorted(p for p in out.iterdir() if _exported(p)):
        shutil.rmtree(old)
    folders = []
    for c in data.clients:
        folder = _private_dir(out / f"client_{c.cid}")
        for split, idx, y in (("train", c.train_idx, c.y_train), ("test", c.test_idx, c.y_test)):
            x = _nhwc(data.x[idx.cpu()])
            with _private(folder / f"{split}.npz") as fh:
                np.savez_compressed(fh, x=x, y=y.cpu().numpy().astype(np.int64))
        manifest = {
            "format": FORMAT,
            "cid": c.cid,
            "dataset": data.name,
            "num_classes": data.num_classes,
            "input_shape": list(data.input_shape),
            "mean": data.mean.flatten().tolist(),
            "std": data.std.flatten().tolist(),
            "num_train": c.num_train,
            "num_test": c.num_test,
            # ground truth of the simulation, for the reader: a node never uses it
            "truth": {"concept": c.concept, "style": c.style.label()},
            "made_by": made_by,
        }
        with _private(folder / MANIFEST) as fh:
            fh.write((json.dumps(manifest, indent=1) + "\n").encode())
        folders.append(folder)
    return folders


# ---------------------------------------------------------------------- reading


HF_MARK = "dataset_dict.json"  # what ``DatasetDict.save_to_disk`` writes


def _is_client(folder: Path) -> bool:
    return any((folder / f).exists() for f in ("train.npz", "train", HF_MARK))


def read_clients(path: str | Path) -> list[FolderClient]:
    """The clients of ``path``: a client folder, or a folder whose sub-folders are clients."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FedshiftError(f"node data {root}: no such folder (make one with `fedshift export`)")
    if _is_client(root):
        return [read_client(root)]
    subs = sorted(p for p in root.iterdir() if p.is_dir() and _is_client(p))
    if not subs:
        raise FedshiftError(
            f"node data {root}: no client folder (train.npz, or train/<class>/ images) in it "
            "or below it; make one with `fedshift export CONFIG OUT`"
        )
    return [read_client(p) for p in subs]


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FedshiftError(f"{path}: not JSON ({err}); {REMAKE}") from None
    if not isinstance(meta, dict):
        raise FedshiftError(f"{path}: not a JSON object of settings; {REMAKE}")
    if why := _manifest_fault(meta):
        raise FedshiftError(f"{path}: {why}; {REMAKE}")
    return meta


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _manifest_fault(meta: dict[str, Any]) -> str | None:
    """What is wrong with the values of a ``client.json`` that a node reads (None: nothing):
    ``cid`` a whole number >= 0, ``num_classes`` >= 1, ``input_shape`` whole numbers >= 1,
    ``mean`` and ``std`` numbers."""
    cid, classes, shape = meta.get("cid"), meta.get("num_classes"), meta.get("input_shape")
    if cid is not None and not _whole(cid, 0):
        return f"cid {cid!r} is not a client id (a whole number, e.g. 0)"
    if classes is not None and not _whole(classes, 1):
        return f"num_classes {classes!r} is not a whole number >= 1"
    if shape is not None and not (
        isinstance(shape, list) and shape and all(_whole(v, 1) for v in shape)
    ):
        return f"input_shape {shape!r} is not a list of sizes (e.g. [3, 32, 32] or [16])"
    for key in ("mean", "std"):
        v = meta.get(key)
        if v is not None and not (
            isinstance(v, list) and all(isinstance(e, int | float) for e in v)
        ):
            return f"{key} {v!r} is not a list of numbers (one per channel)"
    return None


def read_client(folder: Path) -> FolderClient:
    """One client folder (npz files or class folders of images)."""
    meta = _manifest(folder)
    names = {"train": "train", "test": "test"}  # where each split is read from
    if (folder / "train.npz").is_file():
        names = {s: f"{s}.npz" for s in names}
        (xtr, ytr), (xte, yte) = (_npz(folder / f"{s}.npz") for s in ("train", "test"))
    elif (folder / HF_MARK).is_file():
        (xtr, ytr), (xte, yte), classes = _hf_splits(folder, meta)
        meta = {"num_classes": classes, **meta}
    else:
        (xtr, ytr), (xte, yte) = (_image_split(folder / s, meta) for s in ("train", "test"))
    shape = tuple(meta.get("input_shape") or _input_shape(xtr))
    said = f"the input_shape of its {MANIFEST}" if meta.get("input_shape") else names["train"]
    for split, x, y in (("train", xtr, ytr), ("test", xte, yte)):
        if why := split_fault(x, y, shape, said):
            raise FedshiftError(f"{folder / names[split]}: {why}; {REMAKE}")
    num_classes = int(meta.get("num_classes") or len(meta.get("classes") or []) or 0)
    if num_classes <= 0:
        raise FedshiftError(f"{folder}: say num_classes (or classes) in its {MANIFEST}")
    bad = [int(v) for v in np.concatenate([ytr, yte]) if not 0 <= v < num_classes]
    if bad:
        raise FedshiftError(f"{folder}: label {bad[0]} is outside 0..{num_classes - 1}")
    channels = shape[0] if len(shape) == 3 else 1
    cid = meta.get("cid")
    return FolderClient(
        cid=None if cid is None else int(cid),
        x_train=xtr,
        y_train=ytr,
        x_test=xte,
        y_test=yte,
        num_classes=num_classes,
        input_shape=shape,
        mean=list(meta.get("mean") or [0.5] * channels),
        std=list(meta.get("std") or [0.5] * channels),
        source=str(folder),
    )


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Arrays ``x`` and ``y`` of an npz file; a file that is empty, not an npz archive, cut
    short, or holds Python objects (which are never unpickled) is a one-line error."""
    if not path.is_file():
        raise FedshiftError(f"{path}: missing (a client folder has train.npz and test.npz)")
    if path.stat().st_size == 0 or not zipfile.is_zipfile(path):
        what = "is empty" if path.stat().st_size == 0 else "is not an npz archive"
        raise FedshiftError(f"{path}: {what} (x and y arrays); {REMAKE}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z or "y" not in z:
                raise FedshiftError(f"{path}: needs arrays x and y, has {sorted(z.files)}")
            x, y = z["x"], z["y"]
    except ValueError as err:  # object arrays: numpy would need allow_pickle
        if "allow_pickle" not in str(err):
            raise FedshiftError(f"{path}: cannot be read ({err}); {REMAKE}") from None
        raise FedshiftError(
            f"{path}: holds Python objects (an array of dtype object), which a node never "
            f"unpickles; save x and y as numeric arrays, or {REMAKE}"
        ) from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as err:
        raise FedshiftError(
            f"{path}: cannot be read ({type(err).__name__}: {err}); {REMAKE}"
        ) from None
    if not (y.ndim == 1 and np.issubdtype(y.dtype, np.integer)):
        raise FedshiftError(
            f"{path}: labels y must be whole numbers, one per input; they are {y.dtype} of "
            f"shape {list(y.shape)}; {REMAKE}"
        )
    return x, y.astype(np.int64)


def split_fault(
    x: np.ndarray, y: np.ndarray, shape: tuple[int, ...], said: str = "the input shape"
) -> str | None:
    """What is wrong with a split's inputs ``x`` and labels ``y`` for inputs of ``shape``
    (C, H, W for images NHWC uint8; the feature shape for features; ``said``: where that shape
    comes from), None when they fit."""
    if len(x) != len(y):
        return f"{len(x)} inputs but {len(y)} labels"
    got = _input_shape(x) if x.ndim >= 2 else ()
    if len(x) and got != tuple(shape):
        return (
            f"inputs of shape {list(got)} (x is {list(x.shape)}), expected {list(shape)} ({said})"
        )
    kind = np.dtype(np.uint8 if x.ndim == 4 else np.float32)
    if x.dtype != kind:
        return f"inputs x are {x.dtype}, expected {kind} (images uint8 NHWC, features float32)"
    return None


def _hf_splits(folder: Path, meta: dict[str, Any]):
    """The ``train`` and ``test`` splits of a Hugging Face dataset saved with
    ``save_to_disk``: images of ``image_column`` (default ``image``) as NHWC uint8, labels of
    ``label_column`` (``label``); and its number of classes (a ClassLabel's, else 0)."""

    ds = require_datasets()
    dd = ds.load_from_disk(str(folder))
    missing = [s for s in ("train", "test") if s not in dd]
    if missing:
        raise FedshiftError(f"{folder}: the saved dataset has no split {missing[0]!r}")
    img, lab = meta.get("image_column", "image"), meta.get("label_column", "label")
    for col in (img, lab):
        if col not in dd["train"].column_names:
            raise FedshiftError(f"{folder}: no column {col!r}; name it in {MANIFEST}")
    channels = (meta.get("input_shape") or [None])[0]
    parts = [(dd[s], f"{folder} ({s})") for s in ("train", "test")]
    x_tr, x_te = decode_images(ds, parts, img, None, channels)
    feature = dd["train"].features[lab]
    classes = int(feature.num_classes) if isinstance(feature, ds.ClassLabel) else 0
    ys = [np.asarray(dd[s][lab], np.int64) for s in ("train", "test")]
    return (x_tr, ys[0]), (x_te, ys[1]), classes


def _input_shape(x: np.ndarray) -> tuple[int, ...]:
    return (x.shape[3], x.shape[1], x.shape[2]) if x.ndim == 4 else tuple(x.shape[1:])


def _image_split(folder: Path, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The images of ``folder/<class>/`` as NHWC uint8 and their class indices."""
    from PIL import Image

    if not folder.is_dir():
        raise FedshiftError(f"{folder}: missing (an image client has train/ and test/)")
    names = [str(c) for c in meta.get("classes") or []]
    grey = (meta.get("input_shape") or [3])[0] == 1
    xs, ys = [], []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if sub.name in names:
            label = names.index(sub.name)
        elif sub.name.isdigit():
            label = int(sub.name)
        else:
            raise FedshiftError(
                f"{sub}: a class folder is named by its index or listed in {MANIFEST}'s classes"
            )
        for f in sorted(p for p in sub.iterdir() if p.suffix.lower() in _IMAGES):
            with Image.open(f) as img:
                arr = np.asarray(img.convert("L" if grey else "RGB"))
            xs.append(arr[..., None] if arr.ndim == 2 else arr)
            ys.append(label)
    if not xs:
        return np.zeros((0, 1, 1, 1 if grey else 3), np.uint8), np.zeros(0, np.int64)
    if len({x.shape for x in xs}) > 1:
        raise FedshiftError(f"{folder}: images of different sizes; resize them to one size")
    return np.stack(xs), np.asarray(ys, np.int64)


# ---------------------------------------------------------------------- a node's data


def local_shift(client: FolderClient, style: str | None, labels: str | None) -> FolderClient:
    """``client`` with a feature style (e.g. ``rotate:90``, ``fog/3``) applied to its images
    and a label map (e.g. ``reverse``, ``shift:1``) to its labels: a shift made on the node."""
    x_tr, x_te, y_tr, y_te = client.x_train, client.x_test, client.y_train, client.y_test
    if style:
        if x_tr.ndim != 4 or x_tr.dtype != np.uint8:
            raise FedshiftError(f"shift {style!r}: feature styles apply to images only")
        st, rng = parse_style(style), np.random.default_rng(0)
        x_tr, x_te = apply_style(x_tr, st, rng), apply_style(x_te, st, rng)
    if labels:
        lm = make_label_map(labels, client.num_classes)
        y_tr, y_te = lm.apply(y_tr), lm.apply(y_te)
    shape = _input_shape(x_tr) if x_tr.ndim == 4 and len(x_tr) else client.input_shape
    return FolderClient(
        client.cid, x_tr, y_tr, x_te, y_te, client.num_classes, shape, client.mean,
        client.std, client.source,
    )  # fmt: skip


def node_data(clients: list[FolderClient], name: str = "node") -> FederatedData:
    """A node's :class:`FederatedData`: its clients' samples in one pool (train then test of
    each, in file order), their ids, no ground truth (concept -1). All clients must agree on
    the classes, input shape and normalisation."""
    first = clients[0]
    for c in clients[1:]:
        same = (c.num_classes, c.input_shape, c.mean, c.std)
        if same != (first.num_classes, first.input_shape, first.mean, first.std):
            raise FedshiftError(f"{c.source} and {first.source} differ in classes, shape or mean")
    if any(c.cid is None for c in clients):
        raise FedshiftError(
            f"{first.source}: no client id; set cid in its {MANIFEST} (or the node's client-id)"
        )
    xs, records, start = [], [], 0
    image = first.x_train.ndim == 4
    for c in clients:
        for x in (c.x_train, c.x_test):
            xs.append(
                torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2) if image else x))
            )
        n_tr, n_te = len(c.y_train), len(c.y_test)
        records.append(
            Client(
                cid=int(c.cid),  # type: ignore[arg-type]
                concept=-1,
                label_map=identity_map(c.num_classes),
                style=CLEAN,
                train_idx=torch.arange(start, start + n_tr),
                test_idx=torch.arange(start + n_tr, start + n_tr + n_te),
                y_train=torch.from_numpy(c.y_train),
                y_test=torch.from_numpy(c.y_test),
                label_hist=np.bincount(c.y_train, minlength=c.num_classes),
            )
        )
        start += n_tr + n_te
    shape = (-1, 1, 1) if image else (-1,)
    return FederatedData(
        name=name,
        x=torch.cat(xs),
        num_classes=first.num_classes,
        input_shape=first.input_shape,
        mean=torch.tensor(first.mean, dtype=torch.float32).view(shape),
        std=torch.tensor(first.std, dtype=torch.float32).view(shape),
        clients=records,
        test_clients=[],
        concepts=[identity_map(first.num_classes)],
        source="the node's own folders",
    )
