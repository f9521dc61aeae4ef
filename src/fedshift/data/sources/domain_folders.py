"""Multi-domain image folders: Office-Caltech-10 and DomainNet (not available offline).

Layout, under the data directory (``FEDSHIFT_DATA`` or ``--data-dir``)::

    <data>/office-caltech10/<domain>/<class>/*.jpg|*.png   domains amazon, caltech, dslr, webcam
    <data>/domainnet/<domain>/<class>/*.jpg|*.png          domains clipart, infograph, painting,
                                                           quickdraw, real, sketch

(DomainNet's official archives extract to exactly this layout; Office-Caltech-10 is the four
domains' folders of its 10 classes.) The factor ``domain`` is the domain's index in the list
above (``domains`` picks a subset; default: those present); classes are the sorted
class-folder names (``classes`` picks a subset, e.g. DomainNet's top 10 of FedBN). Train/test: when ``<root>/<domain>_train.txt`` and ``<domain>_test.txt``
exist (DomainNet's official lists: ``<domain>/<class>/<file> <label>`` per line, relative to
``<root>``) they are used; otherwise a seeded split stratified by (domain, class) puts
``test_size`` (0.2) of each in the test set. FedBN's pre-processed Office-Caltech split (pickles)
is not read. Images are resized to ``size`` x ``size`` RGB (default 64 for CPU memory; FedBN
and DFL use 256) and cached under ``<cache>/decoded``; ImageNet normalisation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset, formats
from fedshift.data.sources.cache import cached_decode
from fedshift.data.sources.lookup import candidates, not_found, search_dirs

_SUFFIXES = {".jpg", ".jpeg", ".png"}
_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_SETS = {
    "office-caltech10": (
        ("amazon", "caltech", "dslr", "webcam"),
        ("office-caltech10", "office_caltech_10", "office-caltech-10", "OfficeCaltech10"),
        "https://github.com/med-air/FedBN (Office-Caltech-10 images)",
    ),
    "domainnet": (
        ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
        ("domainnet", "DomainNet"),
        "http://ai.bu.edu/M3SDA/ (one zip per domain, extracted)",
    ),
}

Listing = list[tuple[Path, int, int]]  # (file, class index, domain index)


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in _SUFFIXES)


def _find_root(name: str, data_dir: str | Path | None) -> Path:
    domains, subdirs, url = _SETS[name]
    bases = search_dirs(data_dir)
    for folder in candidates(bases, subdirs):
        if any((folder / d).is_dir() for d in domains):
            return folder
    hint = f"put <class>/ image folders under {name}/<domain>/ ({', '.join(domains)}); from {url}"
    not_found(name, bases, subdirs, hint, "it is not downloaded automatically")


def _class_names(root: Path, domains: Sequence[str], classes: Sequence[str] | None) -> list[str]:
    found = sorted({c.name for d in domains for c in (root / d).iterdir() if c.is_dir()})
    if classes is None:
        return found
    missing = [c for c in classes if c not in found]
    if missing:
        raise FedshiftError(f"{root}: no class folder(s) {', '.join(missing)} in the domains")
    return sorted(classes)


def _from_list(root: Path, text_file: Path, index: dict[str, int], dom: int) -> Listing:
    out = []
    for line in text_file.read_text().splitlines():
        if line.strip():
            rel = Path(line.split()[0])
            if rel.parent.name in index:
                out.append((root / rel, index[rel.parent.name], dom))
    return out


def listing(
    root: Path,
    all_domains: Sequence[str],
    domains: Sequence[str],
    classes: list[str],
    test_size: float,
    seed: int,
) -> tuple[Listing, Listing]:
    """(train, test) file lists: the domains' official lists when present, else a seeded split
    stratified by (domain, class)."""
    index = {c: i for i, c in enumerate(classes)}
    train: Listing = []
    test: Listing = []
    for d in domains:
        dom = all_domains.index(d)
        lists = [root / f"{d}_{s}.txt" for s in ("train", "test")]
        if all(p.is_file() for p in lists):
            train += _from_list(root, lists[0], index, dom)
            test += _from_list(root, lists[1], index, dom)
            continue
        for c in classes:
            files = _images(root / d / c) if (root / d / c).is_dir() else []
            rng = np.random.default_rng([seed, dom, index[c]])
            order = rng.permutation(len(files))
            n_test = int(round(test_size * len(files)))
            test += [(files[i], index[c], dom) for i in sorted(order[:n_test])]
            train += [(files[i], index[c], dom) for i in sorted(order[n_test:])]
    if not train:
        raise FedshiftError(f"{root}: no images under <domain>/<class>/ for {', '.join(domains)}")
    return train, test


def _load(
    name: str,
    data_dir: str | Path | None,
    domains: Sequence[str] | None,
    classes: Sequence[str] | None,
    size: int,
    test_size: float,
    seed: int,
) -> RawDataset:
    all_domains = _SETS[name][0]
    chosen = list(all_domains if domains is None else domains)
    bad = [d for d in chosen if d not in all_domains]
    if bad or not chosen:
        raise FedshiftError(
            f"{name}: domains must be among {', '.join(all_domains)}, got {domains!r}"
        )
    if not 0.0 <= float(test_size) < 1.0 or int(size) < 8:
        raise FedshiftError(
            f"{name}: need 0 <= test_size < 1 and size >= 8, got {test_size!r}, {size!r}"
        )
    root = _find_root(name, data_dir)
    if domains is None:  # default: every domain present
        chosen = [d for d in all_domains if (root / d).is_dir()]
    missing = [d for d in chosen if not (root / d).is_dir()]
    if missing:
        raise FedshiftError(f"{name}: no domain folder(s) {', '.join(missing)} in {root}")
    names = _class_names(root, chosen, classes)
    train, test = listing(root, all_domains, chosen, names, float(test_size), int(seed))
    digest = hashlib.sha1("\n".join(str(p) for p, _, _ in train + test).encode()).hexdigest()

    def decode() -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {"classes": np.asarray(names)}
        for split, items in (("train", train), ("test", test)):
            out[f"x_{split}"] = formats.decode_jpeg_images([p for p, _, _ in items], int(size))
            out[f"y_{split}"] = np.asarray([(c, d) for _, c, d in items], np.int64).reshape(-1, 2)
        return out

    a = cached_decode(name, (str(root), digest, len(train), len(test), int(size)), decode)
    return RawDataset.of_images(
        name,
        root,
        (a["x_train"], a["y_train"][:, 0], a["x_test"], a["y_test"][:, 0]),
        tuple(names),
        _MEAN,
        _STD,
        f"{root} ({'+'.join(chosen)}; {size}x{size})",
        factors_train={"domain": np.ascontiguousarray(a["y_train"][:, 1])},
        factors_test={"domain": np.ascontiguousarray(a["y_test"][:, 1])},
        factor_values={"domain": all_domains},
    )


@DATASETS.register("office-caltech10", "office_caltech10", "office-caltech-10", "officecaltech10")
def load_office_caltech10(
    data_dir: str | Path | None,
    download: bool,
    *,
    domains: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
    size: int = 64,
    test_size: float = 0.2,
    seed: int = 0,
) -> RawDataset:
    """Office-Caltech-10 (amazon, caltech, dslr, webcam; 10 classes) from image folders; see
    the module docs. ``download`` is not used."""
    return _load("office-caltech10", data_dir, domains, classes, size, test_size, seed)


@DATASETS.register("domainnet", "domain-net")
def load_domainnet(
    data_dir: str | Path | None,
    download: bool,
    *,
    domains: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
    size: int = 64,
    test_size: float = 0.2,
    seed: int = 0,
) -> RawDataset:
    """DomainNet (six domains, 345 classes; ``classes`` for a subset) from image folders; see
    the module docs. ``download`` is not used."""
    return _load("domainnet", data_dir, domains, classes, size, test_size, seed)
