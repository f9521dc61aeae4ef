"""One registry helper for every named thing: datasets, models, partitioners, label maps,
corruptions and algorithms.

A :class:`Registry` maps case-insensitive names (and optional aliases) to objects, is filled by
decorating the object where it is defined (``@DATASETS.register("fmnist", "fashionmnist")``),
and answers an unknown name with :class:`~fedshift.core.errors.UnknownNameError`, which lists what
is allowed. ``loader`` imports the modules that register the built-in entries the first time a
name is looked up, so registration stays next to the code it names and no module keeps a
hand-written table. Ground level: any layer may import it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from fedshift.core.errors import ConfigError, UnknownNameError
from fedshift.core.plugins import load_installed

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind (``kind`` is the word error messages use, e.g. "dataset")."""

    def __init__(self, kind: str, loader: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._loader = loader
        self._loaded = loader is None
        self._loading = False  # the loader is registering the built-in entries now
        self._early: set[str] = set()  # names registered before the built-in ones (plugins)

    # ------------------------------------------------------------------ filling
    def add(self, name: str, entry: T, *aliases: str) -> T:
        """Register ``entry`` under ``name`` (and ``aliases``); a name taken twice is an error
        and registers nothing."""
        keys = [self._key(n) for n in (name, *aliases)]
        taken = [k for k in keys if k in self._entries or k in self._aliases]
        early = [k for k in taken if k in self._early]
        if self._loading and early:  # a plugin took a built-in name before they were loaded
            raise ConfigError(
                f"{self.kind} {early[0]!r} is one of fedshift's own names, and "
                f"{_origin(self._entries.get(early[0]))} registers it too: register yours "
                "under another name"
            )
        if taken or len(set(keys)) != len(keys):
            which = repr(taken[0] if taken else name)
            raise ValueError(
                f"{self.kind} {which} is registered twice: {which} is taken (fedshift's own "
                f"names: `fedshift list`); register yours under another name"
            )
        self._entries[keys[0]] = entry
        for akey in keys[1:]:
            self._aliases[akey] = keys[0]
        if not self._loaded:
            self._early.update(keys)
        return entry

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def deco(entry: T) -> T:
            return self.add(name, entry, *aliases)

        return deco

    @contextmanager
    def temporarily(self, name: str, entry: T) -> Iterator[T]:
        """``entry`` registered under ``name`` inside the block only (unless that name already
        holds this very entry), e.g. a class checked by :func:`fedshift.testing.check_algorithm`
        without registering it for good."""
        self._load()
        key = self._key(name)
        if self._entries.get(key) is entry:
            yield entry
            return
        self.add(name, entry)
        try:
            yield entry
        finally:
            self._entries.pop(key, None)

    # ------------------------------------------------------------------ looking up
    def canonical(self, name: str) -> str:
        """The registered name ``name`` refers to (aliases resolved); unknown: an error."""
        self._load()
        key = self._key(name)
        key = self._aliases.get(key, key)
        if key not in self._entries:
            raise UnknownNameError(self.kind, name, self.names())
        return key

    def get(self, name: str) -> T:
        return self._entries[self.canonical(name)]

    def names(self) -> list[str]:
        """The registered names (aliases not included), sorted."""
        self._load()
        return sorted(self._entries)

    def in_order(self) -> list[str]:
        """The registered names (aliases not included) in the order they were registered."""
        self._load()
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        if not isinstance(name, str):
            return False
        key = self._key(name)
        return key in self._entries or key in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _key(name: str) -> str:
        return str(name).strip().lower()

    def _load(self) -> None:
        if not self._loaded and self._loader is not None:
            self._loaded = True  # before loading: registering modules may look names up
            self._loading = True
            try:
                self._loader()
            finally:
                self._loading = False

            load_installed()


def _origin(entry: object) -> str:
    """Where ``entry`` was defined, for messages: its module's file, else the module's name."""
    module = getattr(entry, "__module__", None)
    file = getattr(sys.modules.get(module or ""), "__file__", None)
    return f"plugin {file}" if file else f"module {module or '?'}"
