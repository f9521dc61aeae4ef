"""The plan of a ``scenario.drift`` section: what every client holds at every round, as arrays.

:func:`compile_plan` turns the declared start and events (:mod:`fedshift.config.drift`) into
per-client, per-round arrays, a pure function of the section, the number of clients, the
concepts' label maps and the seed; :mod:`fedshift.data.drift` then makes the clients' data
from it. A client's data at a round is a blend of two parts:

- part *a*: concept ``concept``, partition unit ``unit``;
- part *b*: concept ``concept_new``, unit ``unit_new``, holding a share ``share`` of the samples
  (0 outside a ramp);

and all its images have the style ``styles[style]``. Its true concept is the concept of the
part holding at least half the samples (:meth:`DriftPlan.truth`). ``onset`` marks every
client's data-event onsets (also of drifts that do not change the concept; participation
events change no data and mark none), ``available`` whether a
client may take part in a round. Unit ``k`` is client k's own partition; a ``label`` event
moves it to unit ``num_clients + k``, a second partition of the data.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedshift.config.drift import (
    DriftConfig,
    Gradual,
    Incremental,
    LabelDrift,
    LabelSwap,
    Participation,
    Recurrent,
    Sudden,
)
from fedshift.core.errors import ConfigError
from fedshift.data.concepts import Concept, LabelMap
from fedshift.data.features import parse_style

#: the arrays of a plan that make a client's data (a change in any of them is a data change)
DATA_FIELDS = ("concept", "concept_new", "unit", "unit_new", "share", "style")


@dataclass
class DriftPlan:
    concept: np.ndarray  # int [K, R]
    concept_new: np.ndarray  # int [K, R]
    unit: np.ndarray  # int [K, R]
    unit_new: np.ndarray  # int [K, R]
    share: np.ndarray  # float [K, R]
    style: np.ndarray  # int [K, R], into styles
    available: np.ndarray  # bool [K, R]
    onset: np.ndarray  # bool [K, R]
    maps: list[Concept]  # the scenario's concepts, then the label-swap concepts
    styles: list[str] = field(default_factory=lambda: ["clean"])
    final_styles: list[str] = field(default_factory=lambda: ["clean"])  # test tasks' styles

    @property
    def shape(self) -> tuple[int, int]:
        return self.concept.shape

    @property
    def uses_second_partition(self) -> bool:
        return bool((self.unit >= self.shape[0]).any() or (self.unit_new >= self.shape[0]).any())

    def truth(self) -> np.ndarray:
        """The true concept of every client at every round: the concept of the part holding at
        least half of its samples."""
        return np.where(self.share >= 0.5, self.concept_new, self.concept)

    def spec(self, k: int, r: int) -> tuple:
        """What client ``k`` holds at round ``r`` (1-based), as a hashable tuple."""
        return tuple(getattr(self, f)[k, r - 1].item() for f in DATA_FIELDS)

    def data_changes(self) -> np.ndarray:
        """Where a client's data differs from the round before, bool [K, R]."""
        out = np.zeros(self.shape, dtype=bool)
        for f in DATA_FIELDS:
            a = getattr(self, f)
            out[:, 1:] |= a[:, 1:] != a[:, :-1]
        return out


def _affected(ev, K: int, rng: np.random.Generator) -> list[int]:
    if isinstance(ev.clients, list):
        bad = [c for c in ev.clients if c >= K]
        if bad:
            raise ConfigError(f"drift event names client {bad[0]}, but there are {K} clients")
        return sorted(set(ev.clients))
    n = max(1, int(round(ev.clients * K)))
    return sorted(rng.permutation(K)[:n].tolist())


def _onsets(ev, clients: list[int], rng: np.random.Generator) -> dict[int, int]:
    lo, hi = ev.onset_range
    return {k: int(rng.integers(lo, hi + 1)) for k in clients}


def _effective(p: DriftPlan, k: int, j: int) -> tuple[int, int]:
    """(concept, unit) of client k at column j: the part holding at least half its samples."""
    b = p.share[k, j] >= 0.5
    return (
        int(p.concept_new[k, j] if b else p.concept[k, j]),
        int(p.unit_new[k, j] if b else p.unit[k, j]),
    )


def _settle(p: DriftPlan, k: int, j: int, concept: int, unit: int) -> None:
    """From column j on, client k holds one part: (concept, unit)."""
    p.concept[k, j:], p.concept_new[k, j:] = concept, concept
    p.unit[k, j:], p.unit_new[k, j:] = unit, unit
    p.share[k, j:] = 0.0


def _ramp(p: DriftPlan, k: int, j: int, old: tuple, new: tuple, over: int) -> None:
    """Client k moves from part ``old`` to ``new`` (concept, unit) over ``over`` rounds from
    column j: a share d/over of its samples from ``new`` at the d-th round, all at the last."""
    _settle(p, k, j, *new)
    for d in range(1, over):
        c = j + d - 1
        if c >= p.shape[1]:
            break
        p.concept[k, c], p.unit[k, c] = old
        p.concept_new[k, c], p.unit_new[k, c] = new
        p.share[k, c] = d / over


def _style_index(p: DriftPlan, spec: str) -> int:
    if spec not in p.styles:
        p.styles.append(spec)
    return p.styles.index(spec)


def _ramp_styles(ev: Incremental) -> list[str]:
    """The style of each round of an incremental ramp (``over`` entries, the last the target)."""
    target = parse_style(ev.style)
    if target.kind not in ("rotate", "corruption"):
        raise ConfigError(
            f"incremental drift style {ev.style!r}: use rotate:<degrees> or a corruption name"
        )
    out = []
    for d in range(1, ev.over + 1):
        level = math.ceil(d / ev.over * ev.levels) / ev.levels  # in (0, 1]
        if target.kind == "rotate":
            out.append(f"rotate:{target.angle * level:g}")
        else:
            out.append(f"{target.name}/{max(1, math.ceil(5 * level))}")
    return out


def _swap_map(base: Concept, pairs: list[tuple[int, int]]) -> LabelMap:
    if not isinstance(base, LabelMap):
        raise ConfigError(
            f"label_swap swaps the classes of a label map, but the concept is {base.name!r}, a "
            "decision rule of the input; use a sudden event to another concept"
        )
    m = list(base.mapping)
    for a, b in pairs:
        if max(a, b) >= len(m):
            raise ConfigError(f"label_swap pair ({a}, {b}) names a class beyond {len(m) - 1}")
    swap = {a: b for a, b in pairs} | {b: a for a, b in pairs}
    return LabelMap("permutation", tuple(swap.get(v, v) for v in m))


def _apply(p: DriftPlan, ev, k: int, t: int, rng, swaps: dict) -> None:
    """Event ``ev`` for client k from round t on."""
    j = t - 1
    concept, unit = _effective(p, k, j - 1)
    if isinstance(ev, Sudden):
        _settle(p, k, j, ev.to, unit)
    elif isinstance(ev, Gradual):
        _ramp(p, k, j, (concept, unit), (ev.to, unit), ev.over)
    elif isinstance(ev, LabelDrift):
        _ramp(p, k, j, (concept, unit), (concept, k + p.shape[0]), ev.over)
    elif isinstance(ev, LabelSwap):
        key = (concept, tuple(map(tuple, ev.pairs)))
        if key not in swaps:
            p.maps.append(_swap_map(p.maps[concept], ev.pairs))
            swaps[key] = len(p.maps) - 1
        _settle(p, k, j, swaps[key], unit)
    elif isinstance(ev, Recurrent):
        cur = ev.concepts[0]
        for c in range(j, p.shape[1]):
            if ev.period is not None:
                cur = ev.concepts[((c - j) // ev.period) % len(ev.concepts)]
            elif c > j and rng.random() < ev.switch_prob:
                others = [x for x in ev.concepts if x != cur]
                cur = others[int(rng.integers(len(others)))]
            _settle(p, k, c, cur, unit)
    elif isinstance(ev, Incremental):
        ramp = _ramp_styles(ev)
        p.style[k, j:] = _style_index(p, ramp[-1])
        if ramp[-1] not in p.final_styles:
            p.final_styles.append(ramp[-1])
        for d, spec in enumerate(ramp[:-1]):
            if j + d < p.shape[1]:
                p.style[k, j + d] = _style_index(p, spec)
    p.onset[k, j] = True


def _participation(p: DriftPlan, ev: Participation, clients: list[int], onsets, rng) -> None:
    truth = p.truth()
    end = (ev.until or p.shape[1] + 1) - 1
    for k in clients:
        j = onsets[k] - 1
        for c in range(j, end):
            if ev.concept is None or truth[k, c] == ev.concept:
                p.available[k, c] = rng.random() < ev.rate


def read_change_points(path: str | Path, sha256: str | None = None) -> np.ndarray:
    """A FedDrift change-point matrix, int [time steps, clients] (one row per line, entries
    separated by whitespace). ``sha256``: the content the run recorded (another is refused)."""
    path = Path(path)
    where = "scenario.drift.schedule.file"
    if path.is_dir():
        raise ConfigError(f"{where}: {path} is a directory; give the change-point file in it")
    if not path.is_file():
        raise ConfigError(f"{where}: {path} does not exist")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{where}: {path} cannot be read ({err.strerror})") from None
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise ConfigError(
            f"{where}: {path} has changed since the run recorded it (sha256 {sha256[:12]}... "
            "in its config.yaml); put the original file back, or start a new run (another "
            "name=... or --overwrite)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); a "
            "change-point file is text: whitespace-separated concept ids"
        ) from None
    rows = [line.split() for line in text.splitlines() if line.strip()]
    try:
        m = np.array([[int(v) for v in row] for row in rows], dtype=np.int64)
    except ValueError:
        raise ConfigError(
            f"{path}: a change-point file holds whitespace-separated concept ids, one row per "
            "time step and one column per client, all rows the same length"
        ) from None
    except OverflowError:
        big = next(v for row in rows for v in row if abs(int(v)) >= 2**63)
        shown = big if len(big) <= 24 else big[:20] + "..."
        raise ConfigError(
            f"{path}: concept id {shown} is too large; entries are indices into "
            "scenario.concepts (0, 1, ...)"
        ) from None
    if m.ndim != 2 or m.size == 0 or (m < 0).any():
        raise ConfigError(f"{path}: expected a non-empty matrix of concept ids >= 0")
    return m


def compile_plan(cfg: DriftConfig, num_clients: int, maps: list[Concept], seed: int) -> DriftPlan:
    """The plan of ``cfg`` for ``num_clients`` clients (deterministic given the seed)."""
    K, R = num_clients, cfg.rounds
    shape = (K, R)
    start = np.asarray(cfg.start)[np.random.default_rng([seed, 10]).permutation(K) % len(cfg.start)]
    units = np.broadcast_to(np.arange(K)[:, None], shape).copy()
    p = DriftPlan(
        concept=np.broadcast_to(start[:, None], shape).copy(),
        concept_new=np.broadcast_to(start[:, None], shape).copy(),
        unit=units,
        unit_new=units.copy(),
        share=np.zeros(shape),
        style=np.zeros(shape, dtype=np.int64),
        available=np.ones(shape, dtype=bool),
        onset=np.zeros(shape, dtype=bool),
        maps=list(maps),
    )
    if cfg.schedule is not None:
        m = read_change_points(cfg.schedule.file, cfg.schedule.sha256)
        if m.shape[1] != K:
            raise ConfigError(
                f"{cfg.schedule.file}: {m.shape[1]} columns (clients) but scenario.num_clients "
                f"is {K}; set num_clients={m.shape[1]}"
            )
        if m.max() >= len(maps):
            raise ConfigError(
                f"{cfg.schedule.file}: concept {m.max()} but scenario.concepts has {len(maps)}"
            )
        rows = np.minimum(np.arange(R) // cfg.schedule.rounds_per_row, len(m) - 1)
        p.concept[:], p.concept_new[:] = m[rows].T, m[rows].T
        p.onset[:, 1:] = p.concept[:, 1:] != p.concept[:, :-1]
        return p
    swaps: dict = {}
    later = []
    for i, ev in enumerate(cfg.events):
        rng = np.random.default_rng([seed, 11, i])
        clients = _affected(ev, K, rng)
        onsets = _onsets(ev, clients, rng)
        if isinstance(ev, Participation):
            later.append((ev, clients, onsets, rng))
            continue
        for k in clients:
            _apply(p, ev, k, onsets[k], rng, swaps)
    for ev, clients, onsets, rng in later:
        _participation(p, ev, clients, onsets, rng)
    return p
