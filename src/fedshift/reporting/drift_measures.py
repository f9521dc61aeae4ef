"""How a method copes with drift, scored against the scenario's truth: pure functions on arrays.

Any engine can feed them: they take plain numpy arrays and do no I/O. The conventions:

- rounds are numbered 1..R and round ``r`` is column ``r - 1`` of every ``[client, round]`` array;
- ``truth[c, r]`` is the true concept of client ``c`` at round ``r``; a *change* of client ``c``
  at round ``r`` (``r >= 2``) is ``truth[c, r] != truth[c, r - 1]``;
- ``flags[c, r]`` is True where the method *reacted* at round ``r`` for client ``c`` (a drift
  flag, or a change of the client's cluster: :func:`reactions_from_assignments`); the caller
  decides what counts as a reaction;
- accuracy is in percent, NaN where a round was not evaluated; only evaluated rounds are used;
- undefined values (a mean over nothing, a recovery that never happens) are ``None``, never a
  number, so a report prints "n/a" rather than a misleading 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _grid(a: Any, name: str, dtype: Any = None) -> np.ndarray:
    """``a`` as a 2-D ``[client, round]`` array, refusing anything else (a silent transpose or a
    1-D row would shift every round)."""
    out = np.asarray(a, dtype=dtype)
    if out.ndim != 2:
        raise ValueError(f"{name} must be 2-D [client, round], got shape {out.shape}")
    return out


def _pair(truth: Any, flags: Any) -> tuple[np.ndarray, np.ndarray]:
    t, f = _grid(truth, "truth"), _grid(flags, "flags", bool)
    if t.shape != f.shape:
        raise ValueError(f"truth {t.shape} and flags {f.shape} differ in shape")
    return t, f


def change_points(truth: Any) -> list[tuple[int, int]]:
    """Every change as ``(client, round)``, sorted: round ``r`` (1-based, so ``r >= 2``) where
    the client's concept differs from its concept at round ``r - 1``."""
    t = _grid(truth, "truth")
    cs, cols = np.nonzero(t[:, 1:] != t[:, :-1])
    return sorted((int(c), int(j) + 2) for c, j in zip(cs, cols, strict=True))  # col j+1: round j+2


def _with_next(changes: list[tuple[int, int]]) -> list[tuple[int, int, int | None]]:
    """Each sorted change with the round of its client's next change (None for the last)."""
    nxt = [*changes[1:], (-1, 0)][: len(changes)]
    return [(c, r, n if m == c else None) for (c, r), (m, n) in zip(changes, nxt, strict=True)]


def reactions_from_assignments(assign: Any) -> np.ndarray:
    """Reactions read off cluster assignments ``assign[client, round]`` (-1 = unknown): True at
    round ``r`` iff the assignment is known there and differs from the client's last known
    assignment before ``r``. The first known assignment is no reaction (nothing changed), and a
    stretch of unknowns between two equal assignments is none either (2, -1, 2 is no change)."""
    a = _grid(assign, "assign", int)
    out = np.zeros(a.shape, dtype=bool)
    for c in range(a.shape[0]):
        last = -1
        for j, k in enumerate(a[c]):
            if k == -1:
                continue
            out[c, j] = last != -1 and k != last
            last = k
    return out


@dataclass
class Detections:
    """Changes reacted to, ``(client, round, delay)``, and missed, ``(client, round)``: a missed
    change has no delay (not infinity, not the horizon), so it never biases the mean delay."""

    detected: list[tuple[int, int, int]] = field(default_factory=list)
    missed: list[tuple[int, int]] = field(default_factory=list)

    @property
    def mean_delay(self) -> float | None:
        """Mean delay over the detected changes; None if none was detected."""
        return float(np.mean([d for *_, d in self.detected])) if self.detected else None

    @property
    def detection_rate(self) -> float | None:
        """Detected changes / all changes; None if there was no change."""
        n = len(self.detected) + len(self.missed)
        return len(self.detected) / n if n else None


def detection_delays(truth: Any, flags: Any, horizon: int | None = None) -> Detections:
    """The delay of each change: for a change of client ``c`` at round ``r``, ``r' - r`` for the
    first reaction ``flags[c, r']`` with ``r <= r'``, ``r'`` before the client's next change
    (a reaction after it belongs to that change) and, if ``horizon`` is given,
    ``r' - r <= horizon``. A change with no such reaction is missed."""
    t, f = _pair(truth, flags)
    out = Detections()
    for c, r, nxt in _with_next(change_points(t)):
        end = t.shape[1] if nxt is None else nxt - 1  # last round (1-based) of this change
        if horizon is not None:
            end = min(end, r + horizon)
        hits = np.flatnonzero(f[c, r - 1 : end])
        if hits.size:
            out.detected.append((c, r, int(hits[0])))
        else:
            out.missed.append((c, r))
    return out


def false_alarms_per_100(truth: Any, flags: Any, tolerance: int = 5) -> float:
    """Reactions not attributable to a change, per 100 client-rounds. A reaction of client ``c``
    at round ``r'`` is attributable iff ``c`` has a change at some ``r`` with
    ``r <= r' <= r + tolerance``; every other reaction (a flag at round 1 included) is a false
    alarm. The denominator is all client-rounds, ``C * R``."""
    t, f = _pair(truth, flags)
    if t.size == 0:
        raise ValueError("no client-rounds to score")
    covered = np.zeros(t.shape, dtype=bool)
    for c, r in change_points(t):
        covered[c, r - 1 : r + tolerance] = True
    return 100.0 * int((f & ~covered).sum()) / t.size


def _curve(acc: Any) -> np.ndarray:
    """``acc`` as one 1-D accuracy curve over rounds."""
    a = np.asarray(acc, dtype=float)
    if a.ndim != 1:
        raise ValueError(f"expected a 1-D accuracy curve over rounds, got shape {a.shape}")
    return a


def pre_drift_level(acc: Any, change_round: int, window: int = 3) -> float | None:
    """Mean accuracy over the last ``window`` evaluated rounds strictly before ``change_round``
    (fewer if fewer were evaluated); None if none was."""
    a = _curve(acc)[: max(change_round - 1, 0)]
    seen = a[~np.isnan(a)][-window:]
    return float(seen.mean()) if seen.size else None


def recovery_time(
    acc: Any,
    change_round: int,
    window: int = 3,
    within: float = 2.0,
    end_round: int | None = None,
) -> int | None:
    """Rounds from ``change_round`` to the first evaluated round ``r' >= change_round`` whose
    accuracy is at least the pre-drift level minus ``within`` points (0: it never dipped; being
    above the level counts as recovered). The level is :func:`pre_drift_level`. Only rounds
    before ``end_round`` (e.g. the next change) are searched. None if it never recovers; a
    ValueError if no round before the change was evaluated (no level to recover to)."""
    a = _curve(acc)
    level = pre_drift_level(a, change_round, window)
    if level is None:
        raise ValueError(f"no evaluated round before round {change_round}")
    after = a[change_round - 1 : None if end_round is None else end_round - 1]
    hits = np.flatnonzero(~np.isnan(after) & (after >= level - within))
    return int(hits[0]) if hits.size else None


def accuracy_auc(acc: Any, rounds: Any = None) -> float | None:
    """Normalised area under the accuracy curve: the trapezoid integral over the evaluated
    rounds divided by their span (last minus first evaluated round), i.e. the time-weighted mean
    accuracy, so a constant 80% gives 80.0. ``rounds`` are the round numbers of ``acc``'s entries
    (default 1..R). One evaluated round gives its accuracy; none gives None."""
    a = _curve(acc)
    x = np.arange(1, a.size + 1, dtype=float) if rounds is None else np.asarray(rounds, float)
    x, y = x[~np.isnan(a)], a[~np.isnan(a)]
    if y.size < 2:
        return float(y[0]) if y.size else None
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


def forgetting(acc: Any, concepts: Any) -> list[tuple[int, int, float]]:
    """Forgetting on returning concepts along one client's timeline, as ``(return_round,
    concept, forgetting)``. ``acc[r]`` is the client's accuracy at round ``r`` on the concept it
    has then (``concepts[r]``, its row of ``truth``). A *visit* is a maximal run of rounds with
    one concept; a *return* is a visit to a concept already visited. Forgetting of a return =
    the last evaluated accuracy of the concept's previous visit (right before it was left) minus
    the first evaluated accuracy of the return: positive means the method forgot. Returns
    without an evaluation in either visit are left out (nothing to compare)."""
    a, k = _curve(acc), np.asarray(concepts).ravel()
    if a.shape != k.shape:
        raise ValueError(f"acc {a.shape} and concepts {k.shape} differ in shape")
    starts = [0, *(np.flatnonzero(k[1:] != k[:-1]) + 1).tolist()]
    last_seen: dict[int, float | None] = {}  # concept -> last evaluated acc of its last visit
    out = []
    for s, e in zip(starts, [*starts[1:], k.size], strict=True):
        seen = a[s:e][~np.isnan(a[s:e])]
        concept = int(k[s])
        before = last_seen.get(concept)
        if before is not None and seen.size:
            out.append((s + 1, concept, before - float(seen[0])))
        last_seen[concept] = float(seen[-1]) if seen.size else None
    return out


def drift_summary(
    truth: Any,
    flags: Any,
    acc: Any,
    *,
    tolerance: int = 5,
    horizon: int | None = None,
    window: int = 3,
    within: float = 2.0,
    onsets: Any = None,
) -> dict[str, Any]:
    """Every drift metric of one run in one dict (what ``compare``/``report`` print).

    ``acc`` is per client ``[client, round]`` or overall ``[round]``. Per client, each change is
    scored on its client's curve up to the client's next change, forgetting is pooled over all
    clients, and the AUC is that of the per-round mean over evaluated clients. Overall, recovery
    is scored once per distinct change round, up to the next one, and forgetting is None (a
    return is a client's). Changes without an evaluated round before them are not measurable and
    counted apart from those that never recover.

    ``onsets`` (bool ``[client, round]``) are the rounds recovery is measured from, when
    drifts that change no concept count too (a rotation, a new label distribution); default:
    the concept changes. Detection is always scored on concept changes."""
    t, f = _pair(truth, flags)
    a = np.asarray(acc, dtype=float)
    det = detection_delays(t, f, horizon)
    changes = change_points(t)
    if onsets is not None:
        o = _grid(onsets, "onsets", bool)
        if o.shape != t.shape:
            raise ValueError(f"onsets {o.shape} and truth {t.shape} differ in shape")
        cs, rs = np.nonzero(o)
        starts = sorted((int(c), int(r) + 1) for c, r in zip(cs, rs, strict=True) if r > 0)
    else:
        starts = changes
    if a.ndim == 2:
        if a.shape != t.shape:
            raise ValueError(f"acc {a.shape} and truth {t.shape} differ in shape")
        cases = [(a[c], r, nxt) for c, r, nxt in _with_next(starts)]
        n = (~np.isnan(a)).sum(axis=0)  # a round no client was evaluated at stays NaN
        curve = np.where(n > 0, np.nansum(a, axis=0) / np.maximum(n, 1), np.nan)
        returns = [x for c in range(t.shape[0]) for _, _, x in forgetting(a[c], t[c])]
    else:
        rs = sorted({r for _, r in starts})
        cases = [(_curve(a), r, n) for r, n in zip(rs, [*rs[1:], None], strict=True)]
        curve, returns = a, None
    ok = [(row, r, end) for row, r, end in cases if pre_drift_level(row, r, window) is not None]
    times = [recovery_time(row, r, window, within, end) for row, r, end in ok]
    done = [x for x in times if x is not None]
    return {
        "changes": len(changes),
        "onsets": len(starts),
        "detected": len(det.detected),
        "missed": len(det.missed),
        "detection_rate": det.detection_rate,
        "mean_delay": det.mean_delay,
        "false_alarms_per_100": false_alarms_per_100(t, f, tolerance),
        "recovered": len(done),
        "never_recovered": len(times) - len(done),
        "recovery_unmeasurable": len(cases) - len(ok),
        "mean_recovery": float(np.mean(done)) if done else None,
        "accuracy_auc": accuracy_auc(curve),
        "returns": None if returns is None else len(returns),
        "mean_forgetting": float(np.mean(returns)) if returns else None,
    }
