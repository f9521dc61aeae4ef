"""Algorithms registered by name (each module registers its class with ``@register``)."""

from __future__ import annotations

from fedshift.errors import UnknownNameError

_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make an algorithm available under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> type:
    """The algorithm class registered under ``name`` (case-insensitive)."""
    _load_builtin()
    key = name.lower()
    if key not in _REGISTRY:
        raise UnknownNameError("algorithm", name, list(_REGISTRY))
    return _REGISTRY[key]


def _load_builtin() -> None:
    """Import every module of this package once, so each registers its algorithm(s)."""
    import importlib
    import pkgutil

    import fedshift.algorithms as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name not in ("base", "registry"):
            importlib.import_module(f"fedshift.algorithms.{mod.name}")
