"""Per-client state under a memory budget: in memory while it fits, on disk when it does not.

:class:`ClientStore` holds every piece of per-client state a run keeps between rounds (the
algorithm's client states, kept SGD momentum, the latest local models of FedNH's personal
protocol) in named tables, each a mapping ``client id -> value`` (:meth:`ClientStore.table`).
All tables share one byte budget:

- A value is *compacted* when stored: detached, and a tensor that is a view into a larger
  storage (a slice of an executor's stacked chunk) is copied, so a stored client never keeps
  a whole chunk alive and its size is what it holds.
- While the resident values exceed the budget, the store writes the *most recently used* large
  value to disk (``<table>-<cid>.<version>.pt``, a new name for every version) and drops it
  from memory; it is read back on its next access. Rounds and evaluations visit clients in ascending order, so the
  value used last is the one needed latest: this keeps ``budget`` worth of clients resident
  from round to round, where least-recently-used eviction would miss on every client.
- Values under :data:`INLINE_BYTES` (FedRC's ω, a cluster index) always stay in memory.

Spilled values are written by a background thread (:class:`~fedshift.engine.store_writer.Writer`), so the disk works while
the round computes: a spilled value stays in memory until its file is written, within a
write-ahead allowance inside the budget (:func:`write_ahead`: an eighth of it, at most
:data:`WRITE_AHEAD_MAX` bytes; a spill waits while the allowance is full), a value read while
its file is being written waits for that write and is given back without reading the file,
and a write that fails is raised by the store's next call. The writer also flushes each file
to disk (``fsync``), so a checkpoint has only the files written at once left to flush.

Reads look one client ahead: when a spilled value is read back, the next client of its table
(in ascending id, the order of rounds and evaluations) is read by a background thread if its
value is on disk too and fits in the write-ahead allowance beside the values being written,
so the next access finds it read (:attr:`ClientStore.stats` counts these as ``prefetched``).
A value changed or deleted while it is read ahead is never given back from the read.

Checkpoints write what changed (:meth:`commit`): every value changed since the last one is
written to its own file (small ones travel inside the checkpoint), and the checkpoint holds a
manifest of which file version each client has. A file the last checkpoint refers to is
deleted only by :meth:`collect`, which the run calls after the next checkpoint is saved, so a
run killed at any moment resumes from its last checkpoint with every file it refers to; a file
no checkpoint refers to is deleted as soon as a newer version replaces it (a client has at
most two files on disk). Files are flushed to disk (``fsync``) before the checkpoint that
refers to them is written.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedshift.engine import store_writer
from fedshift.engine.trees import tensors

State = Any

#: values smaller than this (bytes) are never spilled; checkpoints carry them inline
INLINE_BYTES = 64 * 1024
#: the manifest's tag in a checkpoint
_MANIFEST = "__client_store_v3__"
#: the most bytes of spilled values held in memory while the background writer writes them
WRITE_AHEAD_MAX = 256 * 2**20


def write_ahead(budget: int | None, largest: int) -> int:
    """Bytes of spilled values that may wait in memory for the writer, within the store's
    ``budget``: an eighth of it, at most :data:`WRITE_AHEAD_MAX`; 0 (every spill written at
    once) without a byte budget, or when that share cannot hold the ``largest`` value."""
    if budget is None:
        return 0
    share = min(budget // 8, WRITE_AHEAD_MAX)
    return share if share >= largest else 0


def nbytes(tree: Any) -> int:
    """Bytes of the tensor storages in ``tree`` (nested dicts, lists, tuples), each storage
    counted once."""
    seen: dict[int, int] = {}
    for t in tensors(tree):
        s = t.untyped_storage()
        seen[s.data_ptr() or id(s)] = s.nbytes()
    return sum(seen.values())


def compact(tree: Any) -> Any:
    """``tree`` with every tensor detached and owning exactly its own memory: a view into a
    larger storage (a row of a stacked chunk) is copied, any other tensor is kept as the same
    object."""
    if isinstance(tree, torch.Tensor):
        t = tree.detach() if tree.requires_grad else tree
        if t.untyped_storage().nbytes() > t.numel() * t.element_size() or not t.is_contiguous():
            t = t.clone(memory_format=torch.contiguous_format)
        return t
    if isinstance(tree, dict):
        return {k: compact(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [compact(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(compact(v) for v in tree)
    return tree


@dataclass
class _Entry:
    value: Any  # None while the value is on disk only
    size: int  # bytes of its tensors
    version: int | None = None  # the file holding this value (None: no file yet)
    committed: int | None = None  # the version the last checkpoint refers to
    dirty: bool = True  # the value in memory differs from its file
    used: int = 0  # access clock, for the eviction order


class ClientStore:
    """Per-client values in named tables under one byte ``budget`` (None: unbounded, all in
    memory); spilled values go to ``folder`` (needed once anything is spilled or committed),
    loaded back onto ``device``. ``max_resident``, if set, also bounds the number of large
    values in memory (the ``clients_in_memory`` setting). ``background`` False writes every
    spill at once and reads nothing ahead (no threads); ``read_ahead`` False keeps the writer
    and reads nothing ahead (both for comparisons)."""

    def __init__(
        self,
        budget: int | None = None,
        folder: str | Path | None = None,
        device: torch.device | str | None = None,
        max_resident: int | None = None,
        background: bool = True,
        read_ahead: bool = True,
    ) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"a ClientStore's budget must be 0 or more bytes, not {budget}")
        if max_resident is not None and max_resident < 1:
            raise ValueError("max_resident must be at least 1")
        self.budget, self.max_resident, self.device = budget, max_resident, device
        self.folder = None if folder is None else Path(folder)
        self._entries: dict[tuple[str, int], _Entry] = {}
        self._tables: dict[str, set[int]] = {}
        self._resident: set[tuple[str, int]] = set()  # the large values in memory
        self._version = 0
        self._clock = 0
        self.resident_bytes = 0  # bytes of the values in memory
        self.peak_resident_bytes = 0
        self._unsynced: set[Path] = set()
        self._writer = store_writer.Writer()
        self._background = background
        self._read_ahead_on = background and read_ahead
        self._largest = 0  # bytes of the largest value held so far
        self._written = 0  # bytes of the files written by this thread (commits)
        #: counters of what the store did (for benchmarks and the closing numbers of a run)
        self._stats = {"spilled": 0, "loaded": 0, "committed": 0, "prefetched": 0}
        #: per table, the one value being read ahead: (key, version, bytes, read)
        self._prefetch: dict[str, tuple[tuple[str, int], int, int, store_writer.Prefetch]] = {}
        self._order: dict[str, list[int]] = {}  # each table's client ids, ascending

    @property
    def stats(self) -> dict[str, int]:
        """What the store did: values spilled, loaded back (``prefetched``: of those, read
        ahead by the background reader) and written by commits, and the bytes of the files
        written so far (a background write counts once it is done)."""
        return {**self._stats, "bytes_written": self._written + self._writer.written}

    def flush(self) -> None:
        """Wait until every spilled value is written to its file."""
        self._writer.drain()

    # ------------------------------------------------------------------ tables
    def table(self, name: str) -> StoreTable:
        """The mapping ``client id -> value`` of table ``name``."""
        return StoreTable(self, name)

    def keys_of(self, name: str) -> list[int]:
        return sorted(self._tables.get(name, ()))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def in_memory(self) -> int:
        """How many values are in memory."""
        return sum(e.value is not None for e in self._entries.values())

    @property
    def total_bytes(self) -> int:
        """Bytes of every value, in memory or on disk."""
        return sum(e.size for e in self._entries.values())

    # ------------------------------------------------------------------ access
    def get_value(self, key: tuple[str, int]) -> Any:
        entry = self._entries[key]
        self._clock += 1
        entry.used = self._clock
        if entry.value is None:
            assert entry.version is not None
            value = self._take_prefetched(key, entry.version)
            if value is None:
                # a value whose file is still being written comes back once written
                value = self._writer.wait(self._file(key, entry.version))
            entry.value = self._read(key, entry.version) if value is None else value
            entry.dirty = False
            self._add(key, entry)
            self._stats["loaded"] += 1
            self._fit(protect=key)
            self._read_ahead(key)
        return entry.value

    def set_value(self, key: tuple[str, int], value: Any) -> None:
        value = compact(value)
        self._forget_prefetch(key)
        old = self._entries.get(key)
        if old is not None and old.value is not None:
            self._remove(key, old)
        self._clock += 1
        entry = _Entry(value, nbytes(value), used=self._clock)
        if old is not None:  # its file stays while a checkpoint refers to it
            entry.version, entry.committed = old.version, old.committed
        self._entries[key] = entry
        if key[1] not in self._tables.setdefault(key[0], set()):
            self._tables[key[0]].add(key[1])
            self._order.pop(key[0], None)
        self._add(key, entry)
        self._fit(protect=key)

    def del_value(self, key: tuple[str, int]) -> None:
        self._forget_prefetch(key)
        entry = self._entries.pop(key)
        self._tables[key[0]].discard(key[1])
        self._order.pop(key[0], None)
        if entry.value is not None:
            self._remove(key, entry)

    def has(self, key: tuple[str, int]) -> bool:
        return key in self._entries

    # ------------------------------------------------------------------ reading ahead
    def _read_ahead(self, key: tuple[str, int]) -> None:
        """Start reading the next client of ``key``'s table (ascending id) when its value is
        on disk only, not being written, and fits in the write-ahead allowance beside the
        values waiting for the writer and the other reads ahead; one read per table."""
        if key[0] in self._prefetch or not self._read_ahead_on or self.folder is None:
            return
        order = self._order.get(key[0])
        if order is None:
            order = self._order[key[0]] = sorted(self._tables.get(key[0], ()))
        at = bisect.bisect_right(order, key[1])
        if at == len(order):
            return
        nxt = (key[0], order[at])
        entry = self._entries[nxt]
        if entry.value is not None or entry.version is None:
            return
        if entry.size + self._writer.pending_bytes + self._prefetched_bytes() > self._ahead():
            return
        path = self._file(nxt, entry.version)
        if path in self._writer.pending:
            return  # given back by the writer once written
        read = store_writer.Prefetch(path, self.device)
        self._prefetch[key[0]] = (nxt, entry.version, entry.size, read)

    def _prefetched_bytes(self) -> int:
        return sum(p[2] for p in self._prefetch.values())

    def _take_prefetched(self, key: tuple[str, int], version: int) -> Any:
        """The value read ahead for ``key`` at ``version`` (None: none was)."""
        ahead = self._prefetch.get(key[0])
        if ahead is not None and ahead[0][1] < key[1]:  # passed over (not sampled): drop it
            self._forget_prefetch(ahead[0])
            return None
        if ahead is None or ahead[0] != key:
            return None
        del self._prefetch[key[0]]
        value = ahead[3].take()
        if value is None or ahead[1] != version:
            return None
        self._stats["prefetched"] += 1
        return value

    def _forget_prefetch(self, key: tuple[str, int]) -> None:
        """Drop a read ahead of ``key`` (its value is replaced or deleted); the read is waited
        for, so no file is removed under it."""
        ahead = self._prefetch.get(key[0])
        if ahead is not None and ahead[0] == key:
            ahead[3].take()
            del self._prefetch[key[0]]

    # ------------------------------------------------------------------ budget
    def _add(self, key: tuple[str, int], entry: _Entry) -> None:
        """Count a value now in memory."""
        self.resident_bytes += entry.size
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
        if entry.size >= INLINE_BYTES:
            self._resident.add(key)
            self._largest = max(self._largest, entry.size)

    def _remove(self, key: tuple[str, int], entry: _Entry) -> None:
        """Count a value no longer in memory."""
        self.resident_bytes -= entry.size
        self._resident.discard(key)

    def _ahead(self) -> int:
        """This store's write-ahead allowance (0: spills are written at once)."""
        return write_ahead(self.budget, self._largest) if self._background else 0

    def _over(self) -> bool:
        """Whether the values in memory exceed the budget less the write-ahead allowance
        (values waiting for the writer count against the allowance, see :func:`write_ahead`)."""
        room = None if self.budget is None else self.budget - self._ahead()
        if room is not None and self.resident_bytes > room:
            return True
        return self.max_resident is not None and len(self._resident) > self.max_resident

    def _fit(self, protect: tuple[str, int]) -> None:
        """Spill the most recently used large values (not ``protect``) until within budget."""
        while self._over():
            candidates = [k for k in self._resident if k != protect]
            if not candidates:
                return  # the value just used alone exceeds the budget: it stays while in use
            self._spill(max(candidates, key=lambda k: self._entries[k].used))

    def _spill(self, key: tuple[str, int]) -> None:
        entry = self._entries[key]
        if entry.dirty or entry.version is None:
            background = self._ahead() > 0
            self._rewrite(key, entry, background=background)
        entry.value = None
        self._remove(key, entry)
        self._stats["spilled"] += 1

    # ------------------------------------------------------------------ files
    def _file(self, key: tuple[str, int], version: int) -> Path:
        if self.folder is None:
            raise RuntimeError("this ClientStore has no folder to spill to")
        return self.folder / f"{key[0]}-{key[1]}.{version}.pt"

    def _rewrite(self, key: tuple[str, int], entry: _Entry, background: bool = False) -> None:
        """Write the entry's value to a new file (``background``: by the writer thread); the
        file it replaces goes at once (or once written) unless the last checkpoint refers to
        it (then :meth:`collect` deletes it after the next one), so a client has at most two
        files: the checkpoint's and the current one."""
        old = entry.version
        entry.version = self._write(key, entry.value, entry.size if background else None)
        entry.dirty = False
        if old is not None and old != entry.committed:
            path = self._file(key, old)
            if not self._writer.drop(path):
                path.unlink(missing_ok=True)
            self._unsynced.discard(path)

    def _write(self, key: tuple[str, int], value: Any, size: int | None = None) -> int:
        """Write ``value`` to a new file (its name is never reused: a file half written by a
        killed process is referred to by no checkpoint and collected later), here or, given
        its ``size``, by the writer thread; flushed to disk by the next :meth:`commit`."""
        if self.folder is None:
            raise RuntimeError(
                "the client states exceed the memory budget and this store has no folder to "
                "spill to"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self._version += 1
        while self._file(key, self._version).exists():  # a file of an earlier run of the folder
            self._version += 1  # (written after the checkpoint this store resumed from)
        path = self._file(key, self._version)
        self._unsynced.add(path)
        if size is not None:  # within the allowance the reads ahead leave
            self._writer.put(path, value, size, self._ahead() - self._prefetched_bytes())
            return self._version
        try:
            torch.save(value, path)
        except BaseException:
            path.unlink(missing_ok=True)
            self._unsynced.discard(path)
            raise
        self._written += path.stat().st_size
        return self._version

    def _read(self, key: tuple[str, int], version: int | None) -> Any:
        if version is None:
            raise KeyError(key)
        path = self._file(key, version)
        try:
            return torch.load(path, map_location=self.device, weights_only=True)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"client state file {path} is missing: the run directory was changed by hand "
                "or copied without its store/ folder; start the run over"
            ) from None

    # ------------------------------------------------------------------ checkpoints
    def commit(self) -> dict[str, Any]:
        """Write every large value changed since the last commit to its file, flush the files
        to disk and return the manifest a checkpoint holds: per table, client id -> ``("file",
        version)`` or ``("inline", value)``."""
        tables: dict[str, dict[int, tuple]] = {}
        for key, e in self._entries.items():
            if e.size < INLINE_BYTES and e.value is not None:
                item: tuple = ("inline", e.value)
            else:
                if e.dirty or e.version is None:
                    self._rewrite(key, e)
                    self._stats["committed"] += 1
                item = ("file", e.version)
            tables.setdefault(key[0], {})[key[1]] = item
        self._writer.drain()  # a checkpoint refers only to files that are written
        for path in self._unsynced - self._writer.take_synced():  # the writer flushed its own
            store_writer.fsync(path)
        self._unsynced.clear()
        for e in self._entries.values():
            e.committed = e.version
        return {
            _MANIFEST: {
                "tables": tables,
                "version": self._version,
                "budget": self.budget,
                "max_resident": self.max_resident,
                "sizes": {f"{t}:{c}": e.size for (t, c), e in self._entries.items()},
            }
        }

    def collect(self) -> None:
        """Delete the files no value refers to (call after a checkpoint is saved: the values'
        versions are then exactly the checkpoint's)."""
        if self.folder is None or not self.folder.is_dir():
            return
        live = {
            self._file(k, e.version).name for k, e in self._entries.items() if e.version is not None
        }
        for f in self.folder.glob("*.pt"):
            if f.name not in live:
                f.unlink(missing_ok=True)

    @classmethod
    def is_manifest(cls, value: Any) -> bool:
        return isinstance(value, dict) and set(value) == {_MANIFEST}

    @classmethod
    def from_manifest(
        cls, manifest: dict[str, Any], folder: str | Path, device=None
    ) -> ClientStore:
        """The store a checkpoint's manifest describes (values on disk are read lazily)."""
        m = manifest[_MANIFEST]
        store = cls(m["budget"], folder, device, m["max_resident"])
        store._version = m["version"]
        sizes = m.get("sizes", {})
        for name, items in m["tables"].items():
            store._tables[name] = set(items)
            for cid, (kind, payload) in items.items():
                key = (name, cid)
                if kind == "inline":
                    store._entries[key] = entry = _Entry(payload, nbytes(payload), dirty=False)
                    store._add(key, entry)
                else:
                    size = sizes.get(f"{name}:{cid}", 0)
                    store._entries[key] = _Entry(
                        None, size, version=payload, dirty=False, committed=payload
                    )
        return store

    def set_limits(self, budget: int | None, max_resident: int | None = None) -> None:
        """A new budget (a resumed run takes its config's), spilling what no longer fits."""
        self.budget, self.max_resident = budget, max_resident
        if self._over():
            self._fit(protect=("", -1))


class StoreTable(MutableMapping[int, State]):
    """One table of a :class:`ClientStore`: client id -> value (read back from disk when it
    was spilled)."""

    def __init__(self, store: ClientStore, name: str) -> None:
        self.store, self.name = store, name

    def __getitem__(self, cid: int) -> State:
        key = (self.name, int(cid))
        if not self.store.has(key):
            raise KeyError(cid)
        return self.store.get_value(key)

    def __setitem__(self, cid: int, value: State) -> None:
        self.store.set_value((self.name, int(cid)), value)

    def __delitem__(self, cid: int) -> None:
        key = (self.name, int(cid))
        if not self.store.has(key):
            raise KeyError(cid)
        self.store.del_value(key)

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, int) and self.store.has((self.name, cid))

    def __iter__(self) -> Iterator[int]:
        return iter(self.store.keys_of(self.name))

    def __len__(self) -> int:
        return len(self.store.keys_of(self.name))

    def clear(self) -> None:
        for cid in list(self):
            del self[cid]

    def __repr__(self) -> str:
        return f"StoreTable({self.name!r}, {len(self)} clients)"
