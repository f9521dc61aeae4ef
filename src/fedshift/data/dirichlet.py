"""The Dirichlet family of label-shift partitioners: per-class Dirichlet over clients
(``dirichlet``, with a ``min_size``), the FedRC code's sequential per-client Dirichlet over
classes (``dirichlet_seq``) and its equal-size variant (``dirichlet_equal``), and the FedNH
code's Dirichlet with a size cap and a minimum number of classes (``dirichlet_capped``).
Registered in :data:`~fedshift.data.partition_base.PARTITIONERS`; see
:mod:`fedshift.data.partition` for the guarantees every partitioner keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedshift.core.errors import ConfigError
from fedshift.data.partition_base import (
    MAX_ATTEMPTS,
    PARTITIONERS,
    as_labels,
    by_class,
    check_alpha,
    check_clients,
    check_int,
    fill_min_size,
    group_by_owner,
    safe_dirichlet,
)


@PARTITIONERS.register("dirichlet")
@dataclass(frozen=True)
class DirichletPartitioner:
    """Per-class Dirichlet split (Hsu et al. 2019); uses all samples.

    For each class ``c`` a proportion vector ``p_c ~ Dir(alpha * 1_M)`` over the ``M`` clients
    is drawn and the class's (shuffled) samples are cut accordingly. Smaller ``alpha`` means
    more label skew. If a client ends up with fewer than ``min_size`` samples the whole draw is
    repeated, at most ``MAX_ATTEMPTS`` times; after that the best draw is fixed up by moving
    random samples from the largest clients to the small ones.
    """

    alpha: float
    min_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", check_alpha("dirichlet", self.alpha))
        object.__setattr__(self, "min_size", check_int("dirichlet", "min_size", self.min_size, 1))

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Split ``labels`` over ``num_clients`` clients; see the class docstring."""
        y = as_labels(labels)
        m = check_clients("dirichlet", num_clients, y.size, self.min_size)
        _, members = by_class(y)
        conc = np.full(m, self.alpha)
        best: np.ndarray | None = None
        best_deficit = math.inf
        for _ in range(MAX_ATTEMPTS):
            owner = np.empty(y.size, dtype=np.int64)
            for idx in members:
                p = safe_dirichlet(rng, conc)
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
        parts = group_by_owner(best, m)
        return fill_min_size(parts, self.min_size, rng) if best_deficit else parts


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
        object.__setattr__(self, "alpha", check_alpha(owner, self.alpha))
        if self.samples_per_client is not None:
            spc = check_int(owner, "samples_per_client", self.samples_per_client, 1)
            object.__setattr__(self, "samples_per_client", spc)
        if self.redraw_every is not None:
            every = check_int(owner, "redraw_every", self.redraw_every, 1)
            object.__setattr__(self, "redraw_every", every)

    def _draw_q(self, avail: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """q ~ Dir(alpha * p_remaining) over the classes that still have samples."""
        support = avail > 0
        p = avail[support] / avail.sum()
        q = np.zeros(avail.size)
        q[support] = safe_dirichlet(rng, self.alpha * p)
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
        y = as_labels(labels)
        m = check_clients(owner, num_clients, y.size)
        spc = self.samples_per_client if self.samples_per_client is not None else y.size // m
        if spc * m > y.size:
            raise ConfigError(
                f"{owner}: samples_per_client * num_clients must be <= {y.size} (the number of "
                f"samples), got {spc} * {m} = {spc * m}; samples_per_client must be in "
                f"1..{y.size // m}"
            )
        _, members = by_class(y)
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
        q[support] = safe_dirichlet(rng, np.full(int(support.sum()), self.alpha))
        return q


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
        object.__setattr__(self, "alpha", check_alpha(own, self.alpha))
        object.__setattr__(self, "min_size", check_int(own, "min_size", self.min_size, 1))
        object.__setattr__(self, "min_classes", check_int(own, "min_classes", self.min_classes, 1))
        object.__setattr__(
            self, "max_attempts", check_int(own, "max_attempts", self.max_attempts, 1)
        )

    def _draw(self, members: list[np.ndarray], m: int, n: int, rng: np.random.Generator):
        cap = n / m
        owner = np.full(n, -1, dtype=np.int64)
        sizes = np.zeros(m, dtype=np.int64)
        n_cls = np.zeros(m, dtype=np.int64)
        for c, idx in enumerate(members):
            idx = rng.permutation(idx)
            p = safe_dirichlet(rng, np.full(m, self.alpha)) * (sizes < cap)
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
        y = as_labels(labels)
        m = check_clients("dirichlet_capped", num_clients, y.size, self.min_size)
        _, members = by_class(y)
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
        parts = group_by_owner(best, m)
        return fill_min_size(parts, self.min_size, rng) if best_key[0] else parts
