"""Where file-based datasets are looked for, downloaded to, and the error when they are missing.

A source lists the sub-folder spellings it accepts under each base directory (``"."`` is the base
itself), a hint on how to get the data, and a ``fetch(root)`` function that downloads it; see
:func:`find_or_download`. Downloads import torchvision lazily, inside ``fetch``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

from fedshift.core.errors import DatasetNotFoundError

T = TypeVar("T")

#: System-wide base directories searched after the user's directory (patched in tests).
SYSTEM_DATA_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets"),)


def cache_root() -> Path:
    """Root of fedshift's cache: ``$FEDSHIFT_CACHE`` or ``~/.cache/fedshift``."""
    env = os.environ.get("FEDSHIFT_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedshift"


def download_root() -> Path:
    """Where downloads go: ``<cache>/data``."""
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
    dirs.append(download_root())
    dirs.append(Path.home() / "data")
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def candidates(bases: Sequence[Path], subdirs: Sequence[str]) -> list[Path]:
    """Every ``base / sub`` (``"."``: the base itself), bases first, without repeats."""
    out: list[Path] = []
    for base in bases:
        for sub in subdirs:
            p = base if sub == "." else base / sub
            if p not in out:
                out.append(p)
    return out


def not_found(
    name: str, bases: Sequence[Path], subdirs: Sequence[str], hint: str, note: str
) -> NoReturn:
    """Raise the error naming where ``name`` was looked for and how to get it."""
    subs = list(dict.fromkeys(s + ("" if s.endswith(".npz") else "/") for s in subdirs))
    looked = ", ".join(str(b) for b in bases)
    raise DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in: {looked} "
        f"(sub-folders tried under each: {', '.join(subs)}); {note}. "
        f"To get it: {hint}."
    )


def try_download(fetch: Callable[[Path], None]) -> str | None:
    """Run ``fetch(root)`` into the cache's data folder; return an error message or None."""
    root = download_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        fetch(root)
        return None
    except Exception as exc:  # no network, no torchvision, disk full, ...: fall through
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        return text if len(text) <= 300 else text[:297] + "..."


def torchvision_fetch(class_name: str) -> Callable[[Path], None]:
    """A ``fetch`` downloading both splits of ``torchvision.datasets.<class_name>``."""

    def fetch(root: Path) -> None:
        import torchvision.datasets as tvd

        cls = getattr(tvd, class_name)
        for train in (True, False):
            cls(root=str(root), train=train, download=True)

    return fetch


def find_or_download(
    name: str,
    bases: Sequence[Path],
    download: bool,
    find: Callable[[], T | None],
    *,
    subdirs: Sequence[str],
    hint: str,
    fetch: Callable[[Path], None],
) -> T:
    """``find()`` locally; else download with ``fetch`` and look again; else a clear error.

    ``subdirs`` (every spelling the source tries) and ``hint`` only go into the error message.
    """
    hit = find()
    note = "download disabled (download=False)"
    if hit is None and download:
        err = try_download(fetch)
        hit = find() if err is None else None
        note = f"download failed: {err}" if err else "download gave no usable files"
    if hit is None:
        not_found(name, bases, subdirs, hint, note)
    return hit
