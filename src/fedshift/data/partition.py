"""Label shift and quantity skew: split a labelled training set over clients.

Every partitioner is a small frozen dataclass with a ``split(labels, num_clients, rng)`` method
that returns one int64 index array per client (indices into ``labels``, each array sorted in
ascending order). All partitioners guarantee that

* no index is given to two clients, and every index is valid;
* every client gets at least one sample;
* the split always terminates (no unbounded retry loops);
* impossible inputs raise :class:`~fedshift.errors.ConfigError` naming the parameter and the
  allowed range.

The split is a deterministic function of ``labels``, ``num_clients`` and the state of ``rng``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from fedshift.errors import ConfigError
from fedshift.registry import Registry

__all__ = [
    "PARTITIONERS",
    "CappedDirichletPartitioner",
    "DirichletPartitioner",
    "EqualDirichletPartitioner",
    "IIDPartitioner",
    "Partitioner",
    "PathologicalPartitioner",
    "QuantitySkewPartitioner",
    "SequentialDirichletPartitioner",
    "label_histogram",
    "make_partitioner",
]

#: Rejection-sampling attempts for ``min_size`` before the deterministic fix-up.
_MAX_ATTEMPTS = 50


class Partitioner(Protocol):
    """Anything that splits sample indices over clients."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Return one sorted int64 index array per client."""
        ...


# --------------------------------------------------------------------------- validation


def _check_int(owner: str, name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """Return ``value`` as an int, or raise ConfigError naming ``name`` and the range."""
    rng_txt = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{owner}: {name} must be {rng_txt}, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{owner}: {name} must be {rng_txt}, got {value!r}")
    return int(value)


def _check_alpha(owner: str, value: Any) -> float:
    """Return ``alpha`` as a float, or raise ConfigError unless it is finite and > 0."""
    ok = not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        raise ConfigError(f"{owner}: alpha must be a finite number > 0, got {value!r}")
    return float(value)


def _as_labels(labels: np.ndarray) -> np.ndarray:
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


def _check_clients(owner: str, num_clients: Any, n: int, min_size: int = 1) -> int:
    """Check ``1 <= num_clients`` and ``num_clients * min_size <= n``."""
    m = _check_int(owner, "num_clients", num_clients, 1, n)
    if m * min_size > n:
        raise ConfigError(
            f"{owner}: num_clients * min_size must be <= {n} (the number of samples), "
            f"got {m} * {min_size} = {m * min_size}; lower num_clients or min_size"
        )
    return m


# --------------------------------------------------------------------------- helpers


def _safe_dirichlet(rng: np.random.Generator, conc: np.ndarray) -> np.ndarray:
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


def _group(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Indices ``i`` with ``owner[i] == j`` for each client ``j`` (sorted; -1 is unassigned)."""
    idx = np.flatnonzero(owner >= 0)
    own = owner[idx]
    order = np.argsort(own, kind="stable")  # stable keeps indices ascending within a client
    sizes = np.bincount(own, minlength=num_clients)
    return [a.astype(np.int64) for a in np.split(idx[order], np.cumsum(sizes)[:-1])]


def _by_class(y: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distinct labels and, for each, the (ascending) indices holding it."""
    classes, counts = np.unique(y, return_counts=True)
    order = np.argsort(y, kind="stable")
    return classes, np.split(order, np.cumsum(counts)[:-1])


def _fill_min_size(
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


def _largest_remainder(total: int, p: np.ndarray) -> np.ndarray:
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


# --------------------------------------------------------------------------- partitioners

#: Every partitioner class by name; :func:`make_partitioner` builds one from its fields.
PARTITIONERS: Registry[type] = Registry("label shift")


@PARTITIONERS.register("iid")
@dataclass(frozen=True)
class IIDPartitioner:
    """Random equal-size split: client sizes differ by at most one; uses all samples."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Shuffle all indices and cut them into ``num_clients`` near-equal parts."""
        y = _as_labels(labels)
        m = _check_clients("iid", num_clients, y.size)
        perm = rng.permutation(y.size)
        return [np.sort(a).astype(np.int64) for a in np.array_split(perm, m)]


@PARTITIONERS.register("dirichlet")
@dataclass(frozen=True)
class DirichletPartitioner:
    """Per-class Dirichlet split (Hsu et al. 2019); uses all samples.

    For each class ``c`` a proportion vector ``p_c ~ Dir(alpha * 1_M)`` over the ``M`` clients
    is drawn and the class's (shuffled) samples are cut accordingly. Smaller ``alpha`` means
    more label skew. If a client ends up with fewer than ``min_size`` samples the whole draw is
    repeated, at most ``_MAX_ATTEMPTS`` times; after that the best draw is fixed up by moving
    random samples from the largest clients to the small ones.
    """

    alpha: float
    min_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_alpha("dirichlet", self.alpha))
        object.__setattr__(self, "min_size", _check_int("dirichlet", "min_size", self.min_size, 1))

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients; see the class docstring."""
        y = _as_labels(labels)
        m = _check_clients("dirichlet", num_clients, y.size, self.min_size)
        _, members = _by_class(y)
        conc = np.full(m, self.alpha)
        best: np.ndarray | None = None
        best_deficit = math.inf
        for _ in range(_MAX_ATTEMPTS):
            owner = np.empty(y.size, dtype=np.int64)
            for idx in members:
                p = _safe_dirichlet(rng, conc)
                cuts = np.clip((np.cumsum(p)[:-1] * idx.size).astype(np.int64), 0, idx.size)
                counts = np.diff(np.concatenate(([0], cuts, [idx.size])))
                owner[rng.permutation(idx)] = np.repeat(np.arange(m), counts)
            sizes = np.bincount(owner, minlength=m)
            deficit = int(np.maximum(self.min_size - sizes, 0).sum())
            if deficit < best_deficit:
                best, best_deficit = owner, deficit
            if deficit == 0:
                break
        assert best is not None
        parts = _group(best, m)
        return _fill_min_size(parts, self.min_size, rng) if best_deficit else parts


@PARTITIONERS.register("dirichlet_seq")
@dataclass(frozen=True)
class SequentialDirichletPartitioner:
    """Sequential Dirichlet split, as in the FedRC authors' code.

    Clients are filled one after another. For client ``i`` a class distribution
    ``q ~ Dir(alpha * p_remaining)`` is drawn, where ``p_remaining`` is the share of each class
    still left in the pool (classes with nothing left are excluded, so the concentration sums
    to ``alpha``). Then ``samples_per_client`` samples (default ``len(labels) // num_clients``)
    are drawn one class at a time from ``q``, each a random remaining sample of that class
    (without replacement). A class that runs out gets probability 0 and ``q`` is renormalised;
    if all of ``q``'s support is exhausted, ``q`` is re-drawn from the remaining proportions.
    With ``redraw_every`` set (Tiny-ImageNet variant) ``q`` is also re-drawn after every
    ``redraw_every`` samples of a client (at fixed positions ``k * redraw_every``).

    The per-sample draws are vectorised (multinomial counts, clipped to availability, the
    deficit re-drawn from the renormalised ``q``), which has the same distribution as drawing
    one sample at a time. All clients get exactly ``samples_per_client`` samples; the remainder
    of the pool is left out.
    """

    alpha: float
    samples_per_client: int | None = None
    redraw_every: int | None = None
    kind: ClassVar[str] = "dirichlet_seq"

    def __post_init__(self) -> None:
        owner = self.kind
        object.__setattr__(self, "alpha", _check_alpha(owner, self.alpha))
        if self.samples_per_client is not None:
            spc = _check_int(owner, "samples_per_client", self.samples_per_client, 1)
            object.__setattr__(self, "samples_per_client", spc)
        if self.redraw_every is not None:
            every = _check_int(owner, "redraw_every", self.redraw_every, 1)
            object.__setattr__(self, "redraw_every", every)

    def _draw_q(self, avail: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """q ~ Dir(alpha * p_remaining) over the classes that still have samples."""
        support = avail > 0
        p = avail[support] / avail.sum()
        q = np.zeros(avail.size)
        q[support] = _safe_dirichlet(rng, self.alpha * p)
        return q

    def _draw_counts(
        self, k: int, q: np.ndarray, avail: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Per-class counts of ``k`` draws from ``q`` without exceeding ``avail`` (updated)."""
        out = np.zeros(avail.size, dtype=np.int64)
        while k > 0:  # each pass fills k or exhausts at least one class: <= C + 1 passes
            q = np.where(avail > 0, q, 0.0)
            s = q.sum()
            if s <= 0:
                q = self._draw_q(avail, rng)
                s = q.sum()
            got = np.minimum(rng.multinomial(k, q / s), avail)
            out += got
            avail -= got
            k -= int(got.sum())
        return out

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients; see the class docstring."""
        owner = self.kind
        y = _as_labels(labels)
        m = _check_clients(owner, num_clients, y.size)
        spc = self.samples_per_client if self.samples_per_client is not None else y.size // m
        if spc * m > y.size:
            raise ConfigError(
                f"{owner}: samples_per_client * num_clients must be <= {y.size} (the number of "
                f"samples), got {spc} * {m} = {spc * m}; samples_per_client must be in "
                f"1..{y.size // m}"
            )
        _, members = _by_class(y)
        pools = [rng.permutation(idx) for idx in members]
        avail = np.array([idx.size for idx in members], dtype=np.int64)
        used = np.zeros_like(avail)
        every = self.redraw_every or spc
        parts = []
        for _ in range(m):
            counts = np.zeros_like(avail)
            drawn = 0
            while drawn < spc:
                q = self._draw_q(avail, rng)  # at the client's start and every `every` samples
                k = min(spc, drawn + every) - drawn
                counts += self._draw_counts(k, q, avail, rng)
                drawn += k
            taken = [pools[c][used[c] : used[c] + counts[c]] for c in np.flatnonzero(counts)]
            used += counts
            parts.append(np.sort(np.concatenate(taken)).astype(np.int64))
        return parts


@PARTITIONERS.register("dirichlet_equal")
@dataclass(frozen=True)
class EqualDirichletPartitioner(SequentialDirichletPartitioner):
    """Equal-size clients, each with its own label distribution ``q ~ Dir(alpha * 1_C)``
    (over the classes that still have samples), filled one after another as
    :class:`SequentialDirichletPartitioner` does. ``alpha`` is the concentration per class:
    FedDAA's "Dirichlet parameter" DP (its Table 5; spec feddaa.md §7.6)."""

    kind: ClassVar[str] = "dirichlet_equal"

    def _draw_q(self, avail: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        support = avail > 0
        q = np.zeros(avail.size)
        q[support] = _safe_dirichlet(rng, np.full(int(support.sum()), self.alpha))
        return q


@PARTITIONERS.register("pathological")
@dataclass(frozen=True)
class PathologicalPartitioner:
    """McMahan-style shards: every client gets ``classes_per_client`` single-label shards.

    The samples are sorted by label (random order within a class) and each class is cut into
    shards; there are ``num_clients * classes_per_client`` shards in all, spread over the
    classes in proportion to their sizes (at least one per class). Shards never straddle two
    classes, so a client holds at most ``classes_per_client`` distinct labels. Shards are dealt
    to clients at random. All samples are used, except when there are fewer shards than
    distinct labels: then only the largest ``num_clients * classes_per_client`` classes are
    used (one shard each).
    """

    classes_per_client: int

    def __post_init__(self) -> None:
        k = _check_int("pathological", "classes_per_client", self.classes_per_client, 1)
        object.__setattr__(self, "classes_per_client", k)

    @staticmethod
    def _allocate(counts: np.ndarray, total: int) -> np.ndarray:
        """Shards per class: ``total`` in all, proportional to ``counts``, 1..count each."""
        n, c = int(counts.sum()), counts.size
        if total < c:  # too few shards: keep the largest classes (ties: lower label)
            alloc = np.zeros(c, dtype=np.int64)
            alloc[np.argsort(-counts, kind="stable")[:total]] = 1
            return alloc
        quota = total * counts / n
        alloc = np.maximum(np.floor(quota).astype(np.int64), 1)  # <= counts since total <= n
        while alloc.sum() < total:  # at most c steps
            alloc[int(np.argmax(np.where(alloc < counts, quota - alloc, -np.inf)))] += 1
        while alloc.sum() > total:  # at most c steps
            alloc[int(np.argmax(np.where(alloc > 1, alloc - quota, -np.inf)))] -= 1
        return alloc

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients; see the class docstring."""
        owner = "pathological"
        y = _as_labels(labels)
        m = _check_clients(owner, num_clients, y.size)
        classes, members = _by_class(y)
        k = self.classes_per_client
        if k > classes.size:
            raise ConfigError(
                f"{owner}: classes_per_client must be in 1..{classes.size} (the number of "
                f"distinct labels), got {k}"
            )
        total = m * k
        if total > y.size:
            raise ConfigError(
                f"{owner}: num_clients * classes_per_client must be <= {y.size} (the number of "
                f"samples), got {m} * {k} = {total}"
            )
        alloc = self._allocate(np.array([a.size for a in members]), total)
        shards: list[np.ndarray] = []
        for idx, a in zip(members, alloc, strict=True):
            if a:
                shards.extend(np.array_split(rng.permutation(idx), a))
        deal = rng.permutation(total).reshape(m, k)
        return [np.sort(np.concatenate([shards[s] for s in row])).astype(np.int64) for row in deal]


@PARTITIONERS.register("quantity")
@dataclass(frozen=True)
class QuantitySkewPartitioner:
    """Label-agnostic split with client sizes following Dir(alpha) proportions.

    Each client first gets ``min_size`` samples; the remaining ``n - M * min_size`` are divided
    in proportion to ``p ~ Dir(alpha * 1_M)`` (largest-remainder rounding). Samples are assigned
    at random; all samples are used. Smaller ``alpha`` means more unequal sizes.
    """

    alpha: float
    min_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_alpha("quantity", self.alpha))
        object.__setattr__(self, "min_size", _check_int("quantity", "min_size", self.min_size, 1))

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients; see the class docstring."""
        y = _as_labels(labels)
        m = _check_clients("quantity", num_clients, y.size, self.min_size)
        p = _safe_dirichlet(rng, np.full(m, self.alpha))
        sizes = self.min_size + _largest_remainder(y.size - m * self.min_size, p)
        perm = rng.permutation(y.size)
        return [np.sort(a).astype(np.int64) for a in np.split(perm, np.cumsum(sizes)[:-1])]


@PARTITIONERS.register("dirichlet_capped")
@dataclass(frozen=True)
class CappedDirichletPartitioner:
    """Per-class Dirichlet split with a size cap, as the FedNH code (NIID-bench style) does.

    For each class in turn, proportions ``p ~ Dir(alpha * 1_M)`` are drawn, clients that
    already hold ``N / M`` samples get proportion 0 (renormalised), and the class's shuffled
    samples are cut by ``floor(cumsum(p) * n)``. From the third class on, clients with at most
    one class so far swap their chunk with the last chunks (the code's guard against one-class
    clients). A draw is accepted when every client has ``min_size`` samples and ``min_classes``
    classes; after ``max_attempts`` draws the best one is kept and clients below ``min_size``
    are topped up by moving random samples from the largest clients.
    """

    alpha: float
    min_size: int = 10
    min_classes: int = 2
    max_attempts: int = 3

    def __post_init__(self) -> None:
        own = "dirichlet_capped"
        object.__setattr__(self, "alpha", _check_alpha(own, self.alpha))
        object.__setattr__(self, "min_size", _check_int(own, "min_size", self.min_size, 1))
        object.__setattr__(self, "min_classes", _check_int(own, "min_classes", self.min_classes, 1))
        object.__setattr__(
            self, "max_attempts", _check_int(own, "max_attempts", self.max_attempts, 1)
        )

    def _draw(self, members: list[np.ndarray], m: int, n: int, rng: np.random.Generator):
        cap = n / m
        owner = np.full(n, -1, dtype=np.int64)
        sizes = np.zeros(m, dtype=np.int64)
        n_cls = np.zeros(m, dtype=np.int64)
        for c, idx in enumerate(members):
            idx = rng.permutation(idx)
            p = _safe_dirichlet(rng, np.full(m, self.alpha)) * (sizes < cap)
            p = p / p.sum() if p.sum() > 0 else np.full(m, 1.0 / m)
            cuts = (np.cumsum(p) * idx.size).astype(np.int64)[:-1]
            chunks = np.split(idx, cuts)
            if c >= 2 and n_cls.min() <= 1:
                for j, k in enumerate(np.flatnonzero(n_cls <= 1)):
                    other = m - 1 - j
                    if other <= k:
                        break
                    chunks[k], chunks[other] = chunks[other], chunks[k]
            for k, chunk in enumerate(chunks):
                if chunk.size:
                    owner[chunk] = k
                    sizes[k] += chunk.size
                    n_cls[k] += 1
        return owner, sizes, n_cls

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients; see the class docstring."""
        y = _as_labels(labels)
        m = _check_clients("dirichlet_capped", num_clients, y.size, self.min_size)
        _, members = _by_class(y)
        best, best_key = None, None
        for _ in range(self.max_attempts):
            owner, sizes, n_cls = self._draw(members, m, y.size, rng)
            deficit = int(np.maximum(self.min_size - sizes, 0).sum())
            short = int((n_cls < min(self.min_classes, len(members))).sum())
            key = (deficit, short)
            if best_key is None or key < best_key:
                best, best_key = owner, key
            if key == (0, 0):
                break
        parts = _group(best, m)
        return _fill_min_size(parts, self.min_size, rng) if best_key[0] else parts


# --------------------------------------------------------------------------- factory


def make_partitioner(kind: str, **params: Any) -> Partitioner:
    """Build the partitioner registered as ``kind`` (case-insensitive) from keyword parameters."""
    kind = PARTITIONERS.canonical(kind)
    cls = PARTITIONERS.get(kind)
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    allowed = ", ".join(names) or "(none)"
    for key in params:
        if key not in names:
            raise ConfigError(
                f"scenario.label_shift: unexpected parameter {key!r} for {kind!r}; allowed: {allowed}"
            )
    missing = [
        f.name
        for f in fields
        if f.name not in params
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(
            f"scenario.label_shift: missing parameter {', '.join(map(repr, missing))} for {kind!r}"
        )
    return cls(**params)


def label_histogram(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Count of each label ``0..num_classes-1`` (int64, length ``num_classes``)."""
    num_classes = _check_int("label_histogram", "num_classes", num_classes, 1)
    y = np.asarray(labels).reshape(-1)
    if y.size == 0:
        return np.zeros(num_classes, dtype=np.int64)
    if y.dtype.kind not in "iu":
        raise ConfigError(f"labels must be an integer array, got dtype {y.dtype}")
    if y.min() < 0 or y.max() >= num_classes:
        raise ConfigError(
            f"labels must be in 0..{num_classes - 1}, got values in {int(y.min())}..{int(y.max())}"
        )
    return np.bincount(y.astype(np.int64), minlength=num_classes).astype(np.int64)
