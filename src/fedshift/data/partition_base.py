"""What every label-shift partitioner shares (:mod:`fedshift.data.partition` has the
partitioners themselves): the :class:`Partitioner` protocol, the registry, the input checks
that turn impossible inputs into a :class:`~fedshift.core.errors.ConfigError` naming the parameter
and its range, and the sampling helpers (a Dirichlet draw that never returns NaN, grouping by
owner, largest-remainder rounding, the ``min_size`` fix-up)."""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from fedshift.core.errors import ConfigError
from fedshift.core.registry import Registry

#: Rejection-sampling attempts for ``min_size`` before the deterministic fix-up.
MAX_ATTEMPTS = 50

#: Every partitioner class by name; :func:`~fedshift.data.partition.make_partitioner` builds
#: one from its fields.
PARTITIONERS: Registry[type] = Registry("label shift")


class Partitioner(Protocol):
    """Anything that splits sample indices over clients."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Return one sorted int64 index array per client."""
        ...


# --------------------------------------------------------------------------- validation


def check_int(owner: str, name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """Return ``value`` as an int, or raise ConfigError naming ``name`` and the range."""
    rng_txt = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{owner}: {name} must be {rng_txt}, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{owner}: {name} must be {rng_txt}, got {value!r}")
    return int(value)


def check_alpha(owner: str, value: Any) -> float:
    """Return ``alpha`` as a float, or raise ConfigError unless it is finite and > 0."""
    ok = not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        raise ConfigError(f"{owner}: alpha must be a finite number > 0, got {value!r}")
    return float(value)


def as_labels(labels: np.ndarray) -> np.ndarray:
    """Validate a 1-D array of non-negative integer labels."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ConfigError(f"labels must be a 1-D array, got shape {y.shape}")
    if y.size == 0:
        raise ConfigError("labels is empty: there is nothing to split")
    if y.dtype.kind not in "iu":
        raise ConfigError(f"labels must be an integer array, got dtype {y.dtype}")
    if y.min() < 0:
        raise ConfigError(f"labels must be >= 0, got {int(y.min())}")
    return y.astype(np.int64, copy=False)


def check_clients(owner: str, num_clients: Any, n: int, min_size: int = 1) -> int:
    """Check ``1 <= num_clients`` and ``num_clients * min_size <= n``."""
    m = check_int(owner, "num_clients", num_clients, 1, n)
    if m * min_size > n:
        raise ConfigError(
            f"{owner}: num_clients * min_size must be <= {n} (the number of samples), "
            f"got {m} * {min_size} = {m * min_size}; lower num_clients or min_size"
        )
    return m


# --------------------------------------------------------------------------- helpers


def safe_dirichlet(rng: np.random.Generator, conc: np.ndarray) -> np.ndarray:
    """Draw from Dirichlet(conc) (all conc > 0); never returns NaN.

    For tiny concentrations the draw can underflow to all zeros; then the limit of the
    Dirichlet as the concentration goes to 0 is used: a point mass on one coordinate, chosen
    with probability proportional to ``conc``.
    """
    k = conc.size
    if k == 1:
        return np.ones(1)
    p = rng.dirichlet(conc)
    s = p.sum()
    if not np.all(np.isfinite(p)) or s <= 0:
        p = np.zeros(k)
        p[rng.choice(k, p=conc / conc.sum())] = 1.0
        return p
    return p / s


def group_by_owner(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Indices ``i`` with ``owner[i] == j`` for each client ``j`` (sorted; -1 is unassigned)."""
    idx = np.flatnonzero(owner >= 0)
    own = owner[idx]
    order = np.argsort(own, kind="stable")  # stable keeps indices ascending within a client
    sizes = np.bincount(own, minlength=num_clients)
    return [a.astype(np.int64) for a in np.split(idx[order], np.cumsum(sizes)[:-1])]


def by_class(y: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distinct labels and, for each, the (ascending) indices holding it."""
    classes, counts = np.unique(y, return_counts=True)
    order = np.argsort(y, kind="stable")
    return classes, np.split(order, np.cumsum(counts)[:-1])


def fill_min_size(
    parts: list[np.ndarray], min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Move random samples from the largest clients to those below ``min_size``.

    Needs ``sum(sizes) >= len(parts) * min_size``. Runs at most ``2 * len(parts)`` moves.
    """
    parts = list(parts)
    sizes = np.array([p.size for p in parts], dtype=np.int64)
    for j in np.flatnonzero(sizes < min_size):
        while sizes[j] < min_size:
            donor = int(np.argmax(sizes))  # has > min_size samples while some client lacks
            take = int(min(min_size - sizes[j], sizes[donor] - min_size))
            pick = rng.choice(sizes[donor], size=take, replace=False)
            moved = parts[donor][pick]
            parts[donor] = np.delete(parts[donor], pick)
            parts[j] = np.sort(np.concatenate([parts[j], moved]))
            sizes[donor] -= take
            sizes[j] += take
    return parts


def largest_remainder(total: int, p: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total``, proportional to ``p`` (largest-remainder rounding)."""
    raw = total * p
    base = np.floor(raw).astype(np.int64)
    while base.sum() > total:  # float round-off only
        base[int(np.argmax(base))] -= 1
    rest = total - int(base.sum())
    order = np.argsort(-(raw - base), kind="stable")
    while rest > 0:
        step = min(rest, base.size)
        base[order[:step]] += 1
        rest -= step
    return base
