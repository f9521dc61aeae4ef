"""Your own algorithms, datasets and models from your own files.

A plugin is Python code that registers named things the way fedshift's own modules do
(``@fedshift.register`` on an algorithm class, ``@DATASETS.register(...)`` on a dataset loader,
``@MODELS.register(...)`` on a model builder). fedshift imports it from one of three places:

- a config's ``plugins`` list (or ``--plugin`` on the command line): each entry a ``.py`` file
  (relative to the current folder, else to the config file's folder) or an importable module
  name (``my_package.algorithms``). Every process that runs the config imports them first:
  ``reproduce``/``sweep`` workers, Ray tasks and actors (a plugin file's text travels with
  them: a node without the file imports the same module) and Flower's ServerApp and ClientApps;
- installed packages: a distribution that declares an entry point in the group
  ``fedshift.core.plugins`` (``[project.entry-points."fedshift.core.plugins"] mine = "my_pkg.fl"``) is
  imported the first time any name is looked up;
- your own script: ``import`` the module before you call the library.

Loading is idempotent: a file or module is imported once per process.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from fedshift.core.errors import ConfigError

ENTRY_POINT_GROUP = "fedshift.core.plugins"
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
        if cand.is_dir():
            raise ConfigError(_directory(entry, cand.resolve()))
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
        except Exception as err:  # the module's own code failed: one line naming where
            raise ConfigError(_failed(entry, err, _module_file(entry))) from None
        if getattr(module, "__file__", None) is None:  # a namespace package: a bare folder
            where = list(getattr(module, "__path__", []))
            raise ConfigError(_directory(entry, Path(where[0]) if where else Path(entry)))
    _loaded[entry] = module
    return module


def _import_file(path: Path) -> ModuleType:
    """Import a ``.py`` file as a module of its own (a name unique to its path)."""
    path = path.resolve()
    if path.is_dir():
        raise ConfigError(_directory(str(path), path))
    if not path.is_file():
        raise ConfigError(f"plugins: file {str(path)!r} not found")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"plugin {path}: cannot be read ({_first_line(err)})") from None
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return _exec_source(f"fedshift_plugin_{path.stem}_{digest}", str(path), text)


def _exec_source(name: str, origin: str, text: str) -> ModuleType:
    """Run a plugin's source text as module ``name`` (once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    module = ModuleType(name)
    module.__file__ = origin
    module.__dict__["__fedshift_source__"] = text  # what sources() ships to other nodes
    sys.modules[name] = module
    try:
        exec(compile(text, origin, "exec"), module.__dict__)
    except Exception as err:  # the plugin's own mistake: one line naming its file and line
        del sys.modules[name]
        raise ConfigError(_failed(origin, err, origin)) from None
    return module


def _directory(entry: str, path: Path) -> str:
    return (
        f"plugins: {entry!r} is a directory ({path}); give a .py file in it (e.g. "
        f"{entry.rstrip('/')}/my_plugin.py) or the importable name of a package with an "
        "__init__.py (my_package.algorithms)"
    )


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0].strip()


def _module_file(entry: str) -> str | None:
    try:
        spec = importlib.util.find_spec(entry)
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


def _failed(label: str, err: Exception, file: str | None) -> str:
    """``plugin LABEL: Error at line N: message`` for an exception raised while importing a
    plugin from ``file`` (the line: a syntax error's own, else the file's last line in the
    traceback; a syntax error in another file names that file too)."""
    line: int | None = None
    if isinstance(err, SyntaxError):
        text = err.msg
        if err.filename == file:
            line = err.lineno
        else:
            text = f"{text} ({err.filename}, line {err.lineno})"
    else:
        text = _first_line(err)
        for frame in traceback.extract_tb(err.__traceback__):
            if frame.filename == file:
                line = frame.lineno
    at = f" at line {line}" if line else ""
    text = f": {text}" if text else ""
    return f"plugin {label}: {type(err).__name__}{at}{text}"


PluginSource = tuple[str, str, str]  # (entry, module name, source text)


def sources() -> list[PluginSource]:
    """The plugin files this process has imported, as text: what a Ray task or actor on a node
    without the files needs (:func:`install`) to unpickle their classes by name."""
    out = []
    for entry, module in _loaded.items():
        text = module.__dict__.get("__fedshift_source__")
        if is_file_entry(entry) and text is not None:
            out.append((entry, module.__name__, text))
    return out


def install(plugin_sources: Iterable[PluginSource]) -> None:
    """Import plugin files from their text under the module names the sending process gave
    them, and count their entries as loaded (a config naming them validates without the
    files)."""
    for entry, name, text in plugin_sources:
        if entry not in _loaded:
            _loaded[entry] = _exec_source(name, entry, text)


def load_installed() -> None:
    """Import the modules installed packages declare under the ``fedshift.core.plugins`` entry-point
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
