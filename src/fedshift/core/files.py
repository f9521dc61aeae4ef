"""Files written whole or not at all (a reader never sees half a file, a crash never leaves
one), and output folders checked before work starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fedshift.core.errors import FedshiftError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def ensure_writable_dir(
    path: str | Path,
    what: str = "output directory",
    fix: str = "choose another folder (output.dir=...)",
    mode: int = 0o777,
) -> Path:
    """Create ``path`` (and parents; ``path`` itself with ``mode``, less the umask) and check
    that files can be written in it, before any work starts; a folder that cannot be created
    or written is a one-line user error ending in ``fix``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FedshiftError(f"{what} {str(path)!r} is a file, not a folder; {fix}")
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise FedshiftError(
            f"{what} {str(path)!r} cannot be created or written ({_reason(path, err)}); {fix}"
        ) from None
    return path


def _reason(path: Path, err: OSError) -> str:
    """Why ``path`` could not be made: the file in its way (``a/b`` where ``a`` is a file), else
    the system's words (Permission denied, Read-only file system, ...)."""
    if isinstance(err, NotADirectoryError):
        for parent in path.parents:
            if parent.exists() and not parent.is_dir():
                return f"{parent} is a file"
    return err.strerror or type(err).__name__
