"""The grid grammar of the commands that run many settings: ``key=v1,v2,...``.

A list of values is split at the commas outside brackets, braces and quotes
(:func:`split_values`): ``scenario.concepts=[identity],[identity,reverse]`` has two values, each
a YAML list. Three commands read it:

- ``fedshift sweep``: :func:`parse_grid`, the overrides as axes (a value with a top-level comma),
  seeds (``seed=...``) and fixed overrides (any other ``key=value``, YAML lists included);
- ``fedshift compare --tune``: :func:`parse_choices`, each key's candidate values read as YAML
  numbers and words (``lr=0.01,0.05``; ``lr=[0.01,0.05]`` is the same list);
- ``fedshift reproduce --lr-grid``: :func:`parse_numbers` (``0.01,0.03`` or ``[0.01,0.03]``).

Every mistake is a one-line :class:`~fedshift.core.errors.ConfigError`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedshift.config.schema import parse_value
from fedshift.core.errors import ConfigError

#: keys a sweep sets itself (where each run goes), never axes
OWN_KEYS = ("name", "output.dir", "output")

Setting = tuple[tuple[str, str], ...]  # (dotted key, value as typed) per axis, in grid order


def split_values(text: str, *, unwrap: bool = False) -> list[str]:
    """``text`` split at commas outside ``[]``, ``{}`` and quotes: ``"0.1,[a,b]"`` ->
    ``["0.1", "[a,b]"]``; unbalanced brackets are an error. ``unwrap``: a text that is one
    bracketed list gives its items (``"[0.1,0.2]"`` -> ``["0.1", "0.2"]``)."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"{text!r}: a closing bracket without an opening one")
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if depth or quote:
        raise ConfigError(f"{text!r}: unbalanced brackets or quotes")
    parts.append("".join(cur).strip())
    if unwrap and len(parts) == 1 and parts[0].startswith("[") and parts[0].endswith("]"):
        return split_values(parts[0][1:-1])
    return parts


# ----------------------------------------------------------------------------- sweep


@dataclass(frozen=True)
class Axis:
    """One swept key and its values, as typed (YAML text)."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Grid:
    """The axes (without seeds), the seeds (None: the config's) and the fixed overrides."""

    axes: tuple[Axis, ...] = ()
    seeds: tuple[int, ...] | None = None
    fixed: tuple[str, ...] = ()

    @property
    def keys(self) -> list[str]:
        return [a.key for a in self.axes]

    def settings(self) -> list[Setting]:
        """Every combination of the axes' values, the last axis changing fastest."""
        values = [[(a.key, v) for v in a.values] for a in self.axes]
        return [tuple(s) for s in itertools.product(*values)]


def parse_grid(overrides: Sequence[str]) -> Grid:
    """Axes (a value with a top-level comma), seeds (``seed=...``) and fixed overrides."""
    axes: list[Axis] = []
    fixed: list[str] = []
    seeds: tuple[int, ...] | None = None
    seen: set[str] = set()
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value or key=v1,v2,...")
        key, text = (x.strip() for x in item.split("=", 1))
        if key in seen:
            raise ConfigError(f"override {key}: given twice; give each key once")
        seen.add(key)
        values = _split(f"override {key}", text)
        if key == "seed":
            seeds = tuple(_seed(v) for v in values)
            _no_repeats(key, list(seeds))
        elif len(values) == 1:
            fixed.append(f"{key}={text}")
        elif key == "log":  # tracking sinks are where every run goes, never an axis
            fixed.append(f"log=[{text}]")
        elif key in OWN_KEYS or key.startswith(("output.", "tracking.")):
            raise ConfigError(f"override {key}: cannot be an axis (the sweep places its runs)")
        elif "" in values:
            raise ConfigError(f"override {item!r}: an empty value in the list")
        else:
            _no_repeats(key, [parse_value(v) for v in values])
            axes.append(Axis(key, tuple(values)))
    return Grid(tuple(axes), seeds, tuple(fixed))


def _split(what: str, text: str, unwrap: bool = False) -> list[str]:
    """:func:`split_values`, its error naming ``what`` (e.g. ``override train.lr``)."""
    try:
        return split_values(text, unwrap=unwrap)
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from None


def _seed(text: str) -> int:
    value = parse_value(text)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"seed={text}: seeds are whole numbers, e.g. seed=0,1,2")
    return value


def _no_repeats(key: str, values: list[Any]) -> None:
    dup = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if dup is not None:
        raise ConfigError(f"override {key}: the value {dup!r} is given twice")


# ----------------------------------------------------------------------------- choices


def parse_choices(
    specs: Sequence[str], *, flag: str = "--tune", aliases: Mapping[str, str] | None = None
) -> dict[str, list[Any]]:
    """``["lr=0.01,0.05", "algorithm.params.mu=0.1,1"]`` as {key: values}, a key's short name
    replaced by ``aliases`` (``lr``: ``train.lr``); each value is read as YAML, a number where
    the text is one (:func:`typed_value`). ``lr=[0.01,0.05]`` is ``lr=0.01,0.05``."""
    example = "e.g. lr=0.01,0.05,0.1"
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        key, sep, text = (x.strip() for x in spec.partition("="))
        if not key or not sep:
            raise ConfigError(f"{flag} {spec!r}: expected key=v1,v2,..., {example}")
        values = _split(f"{flag} {spec!r}", text, unwrap=True)
        if not any(values):
            raise ConfigError(
                f"{flag} {spec!r}: the list of values for {key} is empty; give at least one "
                f"value, {example}"
            )
        if "" in values:
            raise ConfigError(
                f"{flag} {spec!r}: an empty value in the list of {key} (a comma too many); {example}"
            )
        grid[(aliases or {}).get(key, key)] = [typed_value(v) for v in values]
    if not grid:
        raise ConfigError(f"{flag} needs at least one key=v1,v2,... ({example})")
    return grid


def typed_value(text: str) -> Any:
    """A number where the text is one (``1e-2`` too, which YAML reads as a string), else YAML."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return parse_value(text)


def parse_numbers(text: str) -> list[float]:
    """``"0.01,0.03"`` (or ``"[0.01,0.03]"``) as numbers; anything else is a :class:`ConfigError`."""
    try:
        return [float(v) for v in split_values(text, unwrap=True) if v]
    except ValueError:
        raise ConfigError(f"{text!r}: not comma-separated numbers") from None
