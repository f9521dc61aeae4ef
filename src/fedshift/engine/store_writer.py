"""The client store's background disk work: spilled values written to their files (and flushed
to disk) by a thread of their own while the round computes, and the next client's spilled value
read ahead by another (see :mod:`fedshift.engine.store`, which decides what is spilled, what is
read ahead and when a checkpoint may refer to a file)."""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

import torch

#: how long the writer thread waits for work before it ends
_IDLE_S = 0.3


class Writer:
    """Writes spilled values to their files in a background thread, in the order given. A
    value stays in :attr:`pending` (and in memory) until its file is written; the thread ends
    when it has had nothing to write for :data:`_IDLE_S` seconds and starts again with the
    next value."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.pending: dict[Path, tuple[Any, int]] = {}  # file -> (value, bytes), not yet written
        self.pending_bytes = 0
        self.dropped: set[Path] = set()  # files replaced before they were written: delete them
        self.synced: set[Path] = set()  # files written and flushed to disk since take_synced()
        self.written = 0  # bytes of the files written
        self.error: BaseException | None = None
        self._queue: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, path: Path, value: Any, size: int, allowance: int) -> None:
        """Queue ``value`` for ``path``, first waiting while the values waiting for the disk
        would exceed ``allowance`` bytes (one value always may)."""
        with self.cv:
            self.cv.wait_for(
                lambda: (
                    self.error is not None
                    or not self.pending
                    or self.pending_bytes + size <= allowance
                )
            )
            self.raise_error()
            self.pending[path] = (value, size)
            self.pending_bytes += size
            self._queue.put(path)  # under the lock: a thread about to end sees it
            if self._thread is None or not self._thread.is_alive():
                # not a daemon: the interpreter waits for it at exit, so no write is cut off
                # in torch's code (which would abort the process)
                self._thread = threading.Thread(target=self._run, name="fedshift-store")
                self._thread.start()

    def wait(self, path: Path) -> Any:
        """The value being written to ``path``, once it is written (None: not pending)."""
        with self.cv:
            item = self.pending.get(path)
            self.cv.wait_for(lambda: path not in self.pending or self.error is not None)
            self.raise_error()
            return None if item is None else item[0]

    def drain(self) -> None:
        """Wait until every queued value is written."""
        with self.cv:
            self.cv.wait_for(lambda: not self.pending or self.error is not None)
            self.raise_error()

    def drop(self, path: Path) -> bool:
        """Mark a pending file for deletion once written; False when it is not pending."""
        with self.cv:
            if path in self.pending:
                self.dropped.add(path)
                return True
            return False

    def take_synced(self) -> set[Path]:
        """The files written and flushed to disk since the last call."""
        with self.cv:
            out, self.synced = self.synced, set()
            return out

    def raise_error(self) -> None:
        if self.error is not None:
            err, self.error = self.error, None
            raise OSError(f"writing a spilled client state failed: {err}") from err

    def _run(self) -> None:
        while True:
            try:
                path = self._queue.get(timeout=_IDLE_S)
            except queue.Empty:
                with self.cv:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            with self.cv:
                value, size = self.pending[path]
            error = None
            try:
                torch.save(value, path)
                fsync(path)  # here, not in the checkpoint that will refer to it
                n = path.stat().st_size
            except BaseException as exc:  # e.g. a full disk: raised by the store's next call
                path.unlink(missing_ok=True)
                error, n = exc, 0
            with self.cv:
                del self.pending[path]
                self.pending_bytes -= size
                self.written += n
                if error is None:
                    self.synced.add(path)
                if error is not None and self.error is None:
                    self.error = error
                if path in self.dropped:
                    self.dropped.discard(path)
                    path.unlink(missing_ok=True)
                self.cv.notify_all()


class Prefetch:
    """One file read in a thread of its own (``torch.load`` onto ``device``); :meth:`take`
    waits for it and gives the value, or None when the read failed (the caller then reads the
    file itself, so that a missing or damaged file is reported as any read's would be)."""

    def __init__(self, path: Path, device: Any) -> None:
        self.path = path
        self._value: Any = None
        self._thread = threading.Thread(
            target=self._run, args=(device,), name="fedshift-store-read", daemon=True
        )
        self._thread.start()

    def _run(self, device: Any) -> None:
        try:
            self._value = torch.load(self.path, map_location=device, weights_only=True)
        except BaseException:  # read again by the caller, which reports it
            self._value = None

    def take(self) -> Any:
        self._thread.join()
        value, self._value = self._value, None
        return value


def fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # replaced since (collected): nothing refers to it
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
