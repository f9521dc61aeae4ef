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


def ensure_writable_dir(path: str | Path, what: str = "output directory") -> Path:
    """Create ``path`` (and parents) and check that files can be written in it, before any
    work starts; a folder that cannot be created or written is a one-line user error."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise FedshiftError(
            f"{what} {str(path)!r} cannot be created or written ({reason}); choose another "
            "folder (output.dir=...)"
        ) from None
    return path
