"""One writer per run directory.

A run holds an exclusive ``flock`` on ``<run dir>/.lock`` (a file that names its process) from
the moment it claims the folder until it ends, so a second run started with the same name or
output folder, or a ``--resume`` of a run that is still going, is refused with one line
instead of both writing into one folder. The kernel releases the lock when the process ends
in any way (SIGKILL and out-of-memory kills included), so a killed run never leaves its folder
unusable: the next run takes the stale file over. A file system without ``flock`` (rare network
mounts) runs without the lock.

Only the standard library is imported here (the lock is taken before torch is needed).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from fedshift.core.errors import FedshiftError

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

#: the lock file inside a run directory
LOCK = ".lock"


class RunDirInUseError(FedshiftError):
    """Another live process writes into the run directory."""


class RunLock:
    """Context manager: the exclusive claim of this process on run directory ``path`` (which
    must exist); :class:`RunDirInUseError` when another process holds it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.file = self.path / LOCK
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if fcntl is None:
            return self
        while True:
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _owner(fd)
                os.close(fd)
                raise RunDirInUseError(
                    f"run folder {self.path} is in use by {owner}; wait for it to end or stop "
                    "it, or choose another name=... (or output.dir=...)"
                ) from None
            except OSError:  # no flock on this file system: go on unlocked
                os.close(fd)
                return self
            # the previous holder may have removed the file between our open and flock:
            # then we locked a file nobody else sees; take the one at the path again
            try:
                same = os.fstat(fd).st_ino == os.stat(self.file).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        # the process a user sees and stops: the `fedshift` command watching this one, if this
        # is the process it watches (a worker process of that one names itself)
        watcher = os.environ.get(SUPERVISOR_PID_ENV)
        pid = watcher if watcher == str(os.getppid()) else os.getpid()
        os.write(fd, f"{pid} {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        self.file.unlink(missing_ok=True)  # while still locked, so no one takes it half-way
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        lock = self.acquire()
        announce_run_dir(self.path)
        return lock

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


#: names a file where this process notes the run directory it works in (set by the CLI's
#: supervising process, :mod:`fedshift.run.supervise`, which names it if this process is killed)
RUN_NOTE_ENV = "FEDSHIFT_RUN_NOTE"
#: the process id of that supervising process (the one a lock names as the folder's user)
SUPERVISOR_PID_ENV = "FEDSHIFT_SUPERVISOR_PID"


def announce_run_dir(path: str | Path) -> None:
    """Note ``path`` as the run directory this process works in, for a supervising process."""
    note = os.environ.get(RUN_NOTE_ENV)
    if not note:
        return
    try:
        tmp = f"{note}.tmp"
        with open(tmp, "w") as fh:
            fh.write(str(Path(path).resolve()))
        os.replace(tmp, note)
    except OSError:  # a note that cannot be written only loses the hint
        pass


def _owner(fd: int) -> str:
    """'process N' (with its host when it is another machine) from a held lock file."""
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").split()
    except OSError:
        text = []
    if not text:
        return "another process"
    pid, host = text[0], text[1] if len(text) > 1 else ""
    return f"process {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")


def missing_folders(path: str | Path) -> list[Path]:
    """The folders that creating ``path`` would create, deepest first."""
    out, p = [], Path(path).absolute()
    while not p.exists() and p != p.parent:
        out.append(p)
        p = p.parent
    return out


#: what a run writes before its first round: alone in a folder, it holds no result
START_FILES = frozenset({"config.yaml"})


def remove_if_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) as long as they hold nothing but what a start writes
    (:data:`START_FILES`): what a run that failed to start (an unknown name, a missing dataset,
    a Ray address that does not answer) created and left no result in."""
    for p in folders:
        try:
            names = {c.name for c in p.iterdir()}
            if not names <= START_FILES:
                return
            for name in names:
                (p / name).unlink()
            p.rmdir()
        except OSError:
            return


@contextmanager
def removed_if_failed(path: str | Path) -> Iterator[list[Path]]:
    """The folders up to ``path`` that do not exist yet (yielded, deepest first) are removed
    again, as long as they are empty, when the block fails: a command stopped by a user error
    (an unknown name, a missing dataset) leaves no empty folder behind."""
    created = missing_folders(path)
    try:
        yield created
    except BaseException:
        remove_if_empty(created)
        raise
