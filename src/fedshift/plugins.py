"""Your own algorithms, datasets and models from your own files.

A plugin is Python code that registers named things the way fedshift's own modules do
(``@fedshift.register`` on an algorithm class, ``@DATASETS.register(...)`` on a dataset loader,
``@MODELS.register(...)`` on a model builder). fedshift imports it from one of three places:

- a config's ``plugins`` list (or ``--plugin`` on the command line): each entry a ``.py`` file
  (relative to the current folder, else to the config file's folder) or an importable module
  name (``my_package.algorithms``). Every process that runs the config imports them first:
  ``reproduce``/``sweep`` workers, Ray tasks and actors (a plugin file's classes travel by
  value) and Flower's ServerApp and ClientApps;
- installed packages: a distribution that declares an entry point in the group
  ``fedshift.plugins`` (``[project.entry-points."fedshift.plugins"] mine = "my_pkg.fl"``) is
  imported the first time any name is looked up;
- your own script: ``import`` the module before you call the library.

Loading is idempotent: a file or module is imported once per process.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from fedshift.errors import ConfigError

ENTRY_POINT_GROUP = "fedshift.plugins"
_loaded: dict[str, ModuleType] = {}
_installed_done = False


def is_file_entry(entry: str) -> bool:
    """Whether a plugin entry names a file (ends in ``.py`` or holds a path separator)."""
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def resolve(entry: str, base: Path | None = None) -> str:
    """A plugin entry with a file path made absolute: relative to the current folder, else to
    ``base`` (the config file's folder). Module names are returned unchanged. A file that is
    found nowhere is a one-line :class:`ConfigError`."""
    if not is_file_entry(entry):
        return entry
    for cand in (Path(entry), *([base / entry] if base is not None else [])):
        if cand.is_file():
            return str(cand.resolve())
    where = " or ".join(str(p) for p in (Path.cwd(), base) if p is not None)
    raise ConfigError(f"plugins: file {entry!r} not found (looked in {where})")


def load_plugins(entries: Iterable[str]) -> list[ModuleType]:
    """Import every plugin entry once (files and module names; see the module docstring)."""
    return [_load(e) for e in entries]


def _load(entry: str) -> ModuleType:
    if entry in _loaded:
        return _loaded[entry]
    if is_file_entry(entry):
        module = _import_file(Path(entry))
    else:
        try:
            module = importlib.import_module(entry)
        except ImportError as err:
            raise ConfigError(
                f"plugins: cannot import module {entry!r} ({err}); give a .py file or install "
                "the package"
            ) from None
    _loaded[entry] = module
    return module


def _import_file(path: Path) -> ModuleType:
    """Import a ``.py`` file as a module of its own (a name unique to its path), and mark it
    to be pickled by value, so Ray workers that never imported the file can rebuild its
    classes."""
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"plugins: file {str(path)!r} not found")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"fedshift_plugin_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugins: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    _pickle_by_value(module)
    return module


def _pickle_by_value(module: ModuleType) -> None:
    """Have Ray's serialiser (cloudpickle), when Ray is imported, ship the module's classes by
    value: a worker process that never imported the plugin file can still unpickle them."""
    cp = sys.modules.get("ray.cloudpickle")
    if cp is not None and hasattr(cp, "register_pickle_by_value"):
        cp.register_pickle_by_value(module)


def ship_by_value() -> None:
    """Mark every plugin file imported so far to travel by value with Ray (called when a Ray
    session starts; plugin files imported later are marked as they load)."""
    for entry, module in _loaded.items():
        if is_file_entry(entry):
            _pickle_by_value(module)


def load_installed() -> None:
    """Import the modules installed packages declare under the ``fedshift.plugins`` entry-point
    group (once per process)."""
    global _installed_done
    if _installed_done:
        return
    _installed_done = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as err:  # a broken third-party plugin names itself, nothing else
            raise ConfigError(
                f"installed fedshift plugin {ep.name!r} ({ep.value}) failed to load: {err}"
            ) from None
