"""A results folder's run files in one archive (``artifacts.tar.xz``), so that the thousands of
small files its tables are rendered from are not most of the repository.

What a reader opens stays a plain file beside the archive: ``provenance.yaml``, the markdown
(the rendered tables and the notes) and images. Everything else of the folder (each run's
``config.yaml``, ``metrics.jsonl``, ``summary.json``, a benchmark's JSON, logs) goes into the
archive at its path relative to the folder. Packing is deterministic: members sorted by path,
no directory entries, mtime 0, mode 0644, no owner, so packing the same files again gives the
same bytes (and ``git diff`` shows only a real change).

A folder is *packed* (the archive, no loose run files) or *unpacked* (loose run files, as a
run or ``benchmarks/collect_runs.py`` leaves them, and no archive); the checks read both, and a
loose file wins over the archive's copy of it.
"""

from __future__ import annotations

import io
import lzma
import tarfile
from functools import lru_cache
from pathlib import Path, PurePosixPath

from fedshift.core.errors import FedshiftError
from fedshift.core.files import atomic_write_bytes

ARCHIVE = "artifacts.tar.xz"
#: what stays a plain file: the provenance, and what a reader opens (markdown, images)
PLAIN_NAMES = ("provenance.yaml",)
PLAIN_SUFFIXES = (".md", ".png", ".svg", ".jpg", ".jpeg", ".gif")


def is_plain(rel: str) -> bool:
    """Whether the file at ``rel`` (a path relative to the folder) stays outside the archive."""
    path = PurePosixPath(rel)
    return rel in PLAIN_NAMES or path.suffix.lower() in PLAIN_SUFFIXES or rel == ARCHIVE


def loose_files(folder: Path) -> list[str]:
    """The run files lying unpacked in ``folder`` (relative posix paths, sorted): every file but
    the plain ones and hidden ones (a name starting with ``.``, such as a half-written file)."""
    folder = Path(folder)
    out = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        hidden = any(p.startswith(".") for p in rel.parts)
        if path.is_file() and not hidden and not is_plain(rel.as_posix()):
            out.append(rel.as_posix())
    return sorted(out)


def archive_bytes(files: dict[str, bytes]) -> bytes:
    """A deterministic ``.tar.xz`` of ``files`` (relative posix path -> content)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(_safe(name))
            info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    return lzma.compress(buf.getvalue(), check=lzma.CHECK_CRC64, preset=6 | lzma.PRESET_EXTREME)


def _safe(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or name in ("", "."):
        raise FedshiftError(f"{name!r}: an archive member must be a path inside its folder")
    return path.as_posix()


@lru_cache(maxsize=4)
def _read(path: str, _mtime_ns: int, _size: int) -> dict[str, bytes]:
    try:
        with tarfile.open(path, "r:xz") as tar:
            return {
                _safe(m.name): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()
            }
    except (tarfile.TarError, lzma.LZMAError, EOFError) as err:
        raise FedshiftError(f"{path}: not a readable {ARCHIVE} ({err})") from None


def members(folder: Path) -> dict[str, bytes]:
    """The files of the folder's archive (relative posix path -> content); none if unpacked."""
    path = Path(folder) / ARCHIVE
    if not path.is_file():
        return {}
    stat = path.stat()
    return dict(_read(str(path), stat.st_mtime_ns, stat.st_size))


def artifact_files(folder: Path, suffix: str = "") -> dict[str, bytes]:
    """The folder's run files ending in ``suffix``, packed or loose (a loose file wins)."""
    folder = Path(folder)
    out = {k: v for k, v in members(folder).items() if k.endswith(suffix)}
    for rel in loose_files(folder):
        if rel.endswith(suffix):
            out[rel] = (folder / rel).read_bytes()
    return dict(sorted(out.items()))


def extract(folder: Path, into: Path) -> list[str]:
    """Write the folder's archive members into the folder ``into`` where no file of that path
    is there yet (a loose file wins); the paths written."""
    into = Path(into)
    written = []
    for rel, data in members(folder).items():
        target = into / rel
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(rel)
    return written


def pack(folder: Path) -> tuple[Path, int]:
    """Pack the folder's loose run files into its archive and remove them (and the folders they
    leave empty): the archive and how many files it holds. An archive already there is kept
    when nothing is loose; it is rebuilt when every one of its files is loose (the folder was
    unpacked), and a mix is refused rather than a run dropped."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FedshiftError(f"{folder}: no such results folder")
    loose = loose_files(folder)
    packed = members(folder)
    path = folder / ARCHIVE
    if not loose:
        if not packed:
            raise FedshiftError(f"{folder}: no run files to pack")
        return path, len(packed)
    missing = sorted(set(packed) - set(loose))
    if missing:
        raise FedshiftError(
            f"{path} holds {len(missing)} file(s) that are not in the folder ({missing[0]}, ...):"
            " unpack it first (fedshift results unpack), or delete it to drop them"
        )
    atomic_write_bytes(path, archive_bytes({rel: (folder / rel).read_bytes() for rel in loose}))
    for rel in loose:
        (folder / rel).unlink()
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        if not any(sub.iterdir()):
            sub.rmdir()
    return path, len(loose)


def unpack(folder: Path, into: Path | None = None) -> list[str]:
    """Unpack the folder's archive: into the folder itself (which then no longer has an archive:
    ``pack`` makes the same one again), or with ``into`` a copy of the run files there,
    leaving the folder as it is. The paths written."""
    folder = Path(folder)
    if not (folder / ARCHIVE).is_file():
        raise FedshiftError(f"{folder}: no {ARCHIVE} to unpack")
    if into is not None:
        return extract(folder, into)
    clash = [rel for rel in members(folder) if (folder / rel).exists()]
    if clash:
        raise FedshiftError(f"{folder}/{clash[0]}: already there; unpacking would overwrite it")
    written = extract(folder, folder)
    (folder / ARCHIVE).unlink()
    return written
