"""Algorithms registered by name: each module registers its class with ``@register``."""

from __future__ import annotations

from fedshift.registry import Registry

#: modules of this package that define the contract, not algorithms
_CONTRACT = frozenset({"base", "registry", "task", "ops", "capabilities", "server_opt"})


def _load_builtin() -> None:
    """Import every algorithm module of this package once, so each registers its class(es)."""
    import importlib
    import pkgutil

    import fedshift.algorithms as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name not in _CONTRACT:
            importlib.import_module(f"fedshift.algorithms.{mod.name}")


ALGORITHMS: Registry[type] = Registry("algorithm", loader=_load_builtin)


def register(cls: type) -> type:
    """Class decorator: make an algorithm available under ``cls.name``."""
    return ALGORITHMS.add(cls.name, cls)


def algorithm_names() -> list[str]:
    return ALGORITHMS.names()


def get_algorithm(name: str) -> type:
    """The algorithm class registered under ``name`` (case-insensitive)."""
    return ALGORITHMS.get(name)
