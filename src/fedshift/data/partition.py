"""Label shift and quantity skew: split a labelled training set over clients.

Every partitioner is a small frozen dataclass with a ``split(labels, num_clients, rng)`` method
that returns one int64 index array per client (indices into ``labels``, each array sorted in
ascending order). All partitioners guarantee that

* no index is given to two clients, and every index is valid;
* every client gets at least one sample;
* the split always terminates (no unbounded retry loops);
* impossible inputs raise :class:`~fedshift.core.errors.ConfigError` naming the parameter and the
  allowed range.

The split is a deterministic function of ``labels``, ``num_clients`` and the state of ``rng``.
Kind ``flwr`` (:mod:`~fedshift.data.flwr_partition`) runs a flwr-datasets partitioner.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedshift.core.errors import ConfigError
from fedshift.data.dirichlet import (
    CappedDirichletPartitioner,
    DirichletPartitioner,
    EqualDirichletPartitioner,
    SequentialDirichletPartitioner,
)
from fedshift.data.flwr_partition import FlwrPartitioner
from fedshift.data.partition_base import (
    PARTITIONERS,
    Partitioner,
    as_labels,
    by_class,
    check_alpha,
    check_clients,
    check_int,
    largest_remainder,
    safe_dirichlet,
)

__all__ = [
    "PARTITIONERS",
    "CappedDirichletPartitioner",
    "DirichletPartitioner",
    "EqualDirichletPartitioner",
    "FlwrPartitioner",
    "IIDPartitioner",
    "Partitioner",
    "PathologicalPartitioner",
    "QuantitySkewPartitioner",
    "SequentialDirichletPartitioner",
    "label_histogram",
    "make_partitioner",
]


@PARTITIONERS.register("iid")
@dataclass(frozen=True)
class IIDPartitioner:
    """Random equal-size split: client sizes differ by at most one; uses all samples."""

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Shuffle all indices and cut them into ``num_clients`` near-equal parts."""
        y = as_labels(labels)
        m = check_clients("iid", num_clients, y.size)
        perm = rng.permutation(y.size)
        return [np.sort(a).astype(np.int64) for a in np.array_split(perm, m)]


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
        k = check_int("pathological", "classes_per_client", self.classes_per_client, 1)
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
        y = as_labels(labels)
        m = check_clients(owner, num_clients, y.size)
        classes, members = by_class(y)
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
        object.__setattr__(self, "alpha", check_alpha("quantity", self.alpha))
        object.__setattr__(self, "min_size", check_int("quantity", "min_size", self.min_size, 1))

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients; see the class docstring."""
        y = as_labels(labels)
        m = check_clients("quantity", num_clients, y.size, self.min_size)
        p = safe_dirichlet(rng, np.full(m, self.alpha))
        sizes = self.min_size + largest_remainder(y.size - m * self.min_size, p)
        perm = rng.permutation(y.size)
        return [np.sort(a).astype(np.int64) for a in np.split(perm, np.cumsum(sizes)[:-1])]


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
    num_classes = check_int("label_histogram", "num_classes", num_classes, 1)
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
