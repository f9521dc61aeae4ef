"""Per-client state that may spill to disk, so thousands of clients with personal models (or
momentum buffers) fit in a bounded amount of memory.

:class:`ClientStore` is a mapping ``client id -> state``. With ``capacity`` None it is a plain
in-memory dict. With a capacity, at most that many states stay in memory (the most recently
used); the others are written to ``folder`` (one ``torch.save`` file per client, atomic) and
read back on access.

Checkpoints stay exact: a spilled state's file is versioned (``<cid>.<version>.pt``) and
pickling the store records which version each spilled client has, so the checkpoint refers to
files that exist. A file replaced after a checkpoint is only deleted by :meth:`collect`, which
the run calls right after the next checkpoint is written; a run resumed from the older
checkpoint therefore still finds its files.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch

State = Any


class ClientStore(MutableMapping[int, State]):
    """Client states in memory up to ``capacity`` (most recently used), the rest on disk."""

    def __init__(
        self, capacity: int | None = None, folder: str | Path | None = None, device=None
    ) -> None:
        if capacity is not None and (capacity < 1 or folder is None):
            raise ValueError("a bounded ClientStore needs capacity >= 1 and a folder")
        self.capacity, self.device = capacity, device
        self.folder = None if folder is None else Path(folder)
        self._memory: OrderedDict[int, State] = OrderedDict()
        self._spilled: dict[int, int] = {}  # cid -> version of its file
        self._version = 0

    # ------------------------------------------------------------------ mapping
    def __getitem__(self, cid: int) -> State:
        if cid in self._memory:
            self._memory.move_to_end(cid)
            return self._memory[cid]
        if cid not in self._spilled:
            raise KeyError(cid)
        state = torch.load(self._file(cid), map_location=self.device, weights_only=True)
        del self._spilled[cid]  # its file stays until collect(): a checkpoint may need it
        self._put(cid, state)
        return state

    def __setitem__(self, cid: int, state: State) -> None:
        self._spilled.pop(cid, None)
        self._put(cid, state)

    def __delitem__(self, cid: int) -> None:
        if cid in self._memory:
            del self._memory[cid]
        else:
            del self._spilled[cid]

    def __iter__(self) -> Iterator[int]:
        return iter([*self._memory, *self._spilled])

    def __len__(self) -> int:
        return len(self._memory) + len(self._spilled)

    def __contains__(self, cid: object) -> bool:
        return cid in self._memory or cid in self._spilled

    @property
    def in_memory(self) -> int:
        return len(self._memory)

    # ------------------------------------------------------------------ spilling
    def _put(self, cid: int, state: State) -> None:
        self._memory[cid] = state
        self._memory.move_to_end(cid)
        while self.capacity is not None and len(self._memory) > self.capacity:
            old, st = self._memory.popitem(last=False)
            self._spill(old, st)

    def _file(self, cid: int, version: int | None = None) -> Path:
        v = self._spilled[cid] if version is None else version
        return self.folder / f"{cid}.{v}.pt"  # type: ignore[operator]

    def _spill(self, cid: int, state: State) -> None:
        self._version += 1
        self.folder.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        while self._file(cid, self._version).exists():  # a file of another run of the folder
            self._version += 1  # (e.g. written after the checkpoint this store resumed from)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".spill.")
        os.close(fd)
        torch.save(state, tmp)
        os.replace(tmp, self._file(cid, self._version))
        self._spilled[cid] = self._version

    def collect(self) -> None:
        """Delete the files no spilled state refers to (call after a checkpoint is saved)."""
        if self.folder is None or not self.folder.is_dir():
            return
        live = {self._file(c).name for c in self._spilled}
        for f in self.folder.glob("*.pt"):
            if f.name not in live:
                f.unlink(missing_ok=True)

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "folder": None if self.folder is None else str(self.folder),
            "memory": dict(self._memory),
            "spilled": dict(self._spilled),
            "version": self._version,
        }

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.capacity, self.device = d["capacity"], None
        self.folder = None if d["folder"] is None else Path(d["folder"])
        self._memory = OrderedDict(d["memory"])
        self._spilled = dict(d["spilled"])
        self._version = d["version"]
