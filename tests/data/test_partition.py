"""Tests for fedshift.data.partition (label shift and quantity skew)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedshift.core.errors import ConfigError, UnknownNameError
from fedshift.data.partition import (
    PARTITIONERS,
    CappedDirichletPartitioner,
    DirichletPartitioner,
    EqualDirichletPartitioner,
    IIDPartitioner,
    PathologicalPartitioner,
    QuantitySkewPartitioner,
    SequentialDirichletPartitioner,
    label_histogram,
    make_partitioner,
)

NUM_CLASSES = 10
N = 2000


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, NUM_CLASSES, size=N)


# (partitioner, uses every sample)
CASES = [
    (IIDPartitioner(), True),
    (DirichletPartitioner(alpha=0.5), True),
    (DirichletPartitioner(alpha=0.05, min_size=10), True),
    (SequentialDirichletPartitioner(alpha=0.5), False),
    (SequentialDirichletPartitioner(alpha=0.1, samples_per_client=15, redraw_every=4), False),
    (EqualDirichletPartitioner(alpha=0.5), False),
    (PathologicalPartitioner(classes_per_client=2), True),
    (QuantitySkewPartitioner(alpha=0.5), True),
    (QuantitySkewPartitioner(alpha=0.1, min_size=5), True),
    (CappedDirichletPartitioner(alpha=0.3, min_size=1), True),
    (CappedDirichletPartitioner(alpha=1.0, min_size=5), True),
]
CASE_IDS = [repr(p) for p, _ in CASES]


def check_valid(parts: list[np.ndarray], n: int, num_clients: int, uses_all: bool) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert isinstance(p, np.ndarray) and p.dtype == np.int64 and p.ndim == 1
        assert p.size > 0
        assert np.all(np.diff(p) > 0)  # sorted, no duplicates inside a client
    union = np.concatenate(parts)
    assert union.min() >= 0 and union.max() < n
    assert np.unique(union).size == union.size  # no sample in two clients
    if uses_all:
        assert union.size == n
    else:
        assert union.size <= n


def mean_entropy(parts: list[np.ndarray], labels: np.ndarray) -> float:
    ents = []
    for p in parts:
        h = label_histogram(labels[p], NUM_CLASSES) / p.size
        h = h[h > 0]
        ents.append(float(-(h * np.log(h)).sum()))
    return float(np.mean(ents))


def size_cv(parts: list[np.ndarray]) -> float:
    sizes = np.array([p.size for p in parts], dtype=float)
    return float(sizes.std() / sizes.mean())


@pytest.mark.parametrize(("part", "uses_all"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("num_clients", [1, 3, 20, 100])
def test_valid_split(labels: np.ndarray, part, uses_all: bool, num_clients: int) -> None:
    parts = part.split(labels, num_clients, np.random.default_rng(1))
    if isinstance(part, PathologicalPartitioner):  # fewer shards than labels: some left out
        uses_all = num_clients * part.classes_per_client >= NUM_CLASSES
    check_valid(parts, labels.size, num_clients, uses_all)


@pytest.mark.parametrize(("part", "uses_all"), CASES, ids=CASE_IDS)
def test_deterministic(labels: np.ndarray, part, uses_all: bool) -> None:
    a = part.split(labels, 20, np.random.default_rng(7))
    b = part.split(labels, 20, np.random.default_rng(7))
    c = part.split(labels, 20, np.random.default_rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_equal_sizes(labels: np.ndarray) -> None:
    parts = IIDPartitioner().split(labels, 7, np.random.default_rng(0))
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == N


def test_dirichlet_alpha_controls_skew(labels: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    low = mean_entropy(DirichletPartitioner(alpha=0.1).split(labels, 20, rng), labels)
    high = mean_entropy(DirichletPartitioner(alpha=100.0).split(labels, 20, rng), labels)
    assert high > low + 0.5
    assert high > 0.9 * np.log(NUM_CLASSES)  # near-uniform labels per client


def test_dirichlet_min_size(labels: np.ndarray) -> None:
    parts = DirichletPartitioner(alpha=0.01, min_size=50).split(
        labels, 30, np.random.default_rng(3)
    )
    check_valid(parts, N, 30, True)
    assert min(p.size for p in parts) >= 50


def test_sequential_same_sizes_and_skew(labels: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    low_parts = SequentialDirichletPartitioner(alpha=0.1).split(labels, 20, rng)
    high_parts = SequentialDirichletPartitioner(alpha=100.0).split(labels, 20, rng)
    assert {p.size for p in low_parts} == {N // 20}
    assert {p.size for p in high_parts} == {N // 20}
    assert mean_entropy(high_parts, labels) > mean_entropy(low_parts, labels) + 0.5


def test_sequential_remainder_left_out(labels: np.ndarray) -> None:
    parts = SequentialDirichletPartitioner(alpha=1.0).split(labels, 7, np.random.default_rng(0))
    assert {p.size for p in parts} == {N // 7}
    assert sum(p.size for p in parts) == 7 * (N // 7)


def test_sequential_exhausts_whole_pool() -> None:
    # samples_per_client * num_clients == n: the last clients must take whatever is left,
    # which forces many class exhaustions and q re-draws.
    y = np.repeat(np.arange(5), [1, 2, 3, 100, 94])
    parts = SequentialDirichletPartitioner(alpha=0.01, samples_per_client=10).split(
        y, 20, np.random.default_rng(0)
    )
    check_valid(parts, y.size, 20, True)
    assert {p.size for p in parts} == {10}


def test_sequential_redraw_every(labels: np.ndarray) -> None:
    # re-drawing q every few samples mixes classes within a client: more entropy
    rng = np.random.default_rng(0)
    once = SequentialDirichletPartitioner(alpha=0.05).split(labels, 10, rng)
    often = SequentialDirichletPartitioner(alpha=0.05, redraw_every=5).split(labels, 10, rng)
    assert mean_entropy(often, labels) > mean_entropy(once, labels)


@pytest.mark.parametrize("k", [1, 2, 3, 10])
@pytest.mark.parametrize("num_clients", [2, 5, 20, 100])
def test_pathological_at_most_k_labels(labels: np.ndarray, k: int, num_clients: int) -> None:
    parts = PathologicalPartitioner(classes_per_client=k).split(
        labels, num_clients, np.random.default_rng(0)
    )
    uses_all = num_clients * k >= NUM_CLASSES
    check_valid(parts, N, num_clients, uses_all)
    for p in parts:
        assert np.unique(labels[p]).size <= k


def test_pathological_classic_shards() -> None:
    # McMahan et al.: sorted labels, 2 shards per client, equal class sizes -> equal shards
    y = np.repeat(np.arange(10), 60)
    parts = PathologicalPartitioner(classes_per_client=2).split(y, 30, np.random.default_rng(0))
    check_valid(parts, y.size, 30, True)
    assert {p.size for p in parts} == {20}
    assert max(np.unique(y[p]).size for p in parts) == 2


def test_quantity_skew_alpha_controls_sizes(labels: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    low = size_cv(QuantitySkewPartitioner(alpha=0.1).split(labels, 20, rng))
    high = size_cv(QuantitySkewPartitioner(alpha=100.0).split(labels, 20, rng))
    assert low > high
    assert high < 0.2


def test_quantity_skew_min_size(labels: np.ndarray) -> None:
    parts = QuantitySkewPartitioner(alpha=0.01, min_size=40).split(
        labels, 40, np.random.default_rng(0)
    )
    check_valid(parts, N, 40, True)
    assert min(p.size for p in parts) >= 40


def test_adversarial_cases_terminate_fast() -> None:
    # 1000 clients, 1000 samples, highly imbalanced labels
    y = np.zeros(1000, dtype=np.int64)
    y[:5] = np.arange(1, 6)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for part in [
        DirichletPartitioner(alpha=0.01, min_size=1),
        DirichletPartitioner(alpha=100.0, min_size=1),
        QuantitySkewPartitioner(alpha=0.01, min_size=1),
        SequentialDirichletPartitioner(alpha=0.01),
        PathologicalPartitioner(classes_per_client=1),
        IIDPartitioner(),
    ]:
        parts = part.split(y, 1000, rng)
        check_valid(parts, 1000, 1000, True)
        assert {p.size for p in parts} == {1}
    assert time.perf_counter() - start < 1.0


def test_tiny_alpha_no_nan() -> None:
    y = np.random.default_rng(0).integers(0, 100, size=3000)
    for part in [DirichletPartitioner(alpha=1e-6), SequentialDirichletPartitioner(alpha=1e-6)]:
        check_valid(part.split(y, 30, np.random.default_rng(0)), y.size, 30, True)


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), "1", True])
@pytest.mark.parametrize(
    "cls",
    [
        DirichletPartitioner,
        SequentialDirichletPartitioner,
        EqualDirichletPartitioner,
        QuantitySkewPartitioner,
    ],
)
def test_bad_alpha(cls, alpha) -> None:
    with pytest.raises(ConfigError, match="alpha must be a finite number > 0"):
        cls(alpha=alpha)


@pytest.mark.parametrize("part", [p for p, _ in CASES], ids=CASE_IDS)
def test_too_many_clients(part) -> None:
    y = np.arange(10) % 3
    with pytest.raises(ConfigError, match="num_clients"):
        part.split(y, 11, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="num_clients"):
        part.split(y, 0, np.random.default_rng(0))


def test_min_size_errors() -> None:
    with pytest.raises(ConfigError, match="min_size must be an integer >= 1"):
        DirichletPartitioner(alpha=1.0, min_size=0)
    with pytest.raises(ConfigError, match=r"num_clients \* min_size must be <= 100"):
        DirichletPartitioner(alpha=1.0, min_size=11).split(
            np.zeros(100, dtype=int), 10, np.random.default_rng(0)
        )
    with pytest.raises(ConfigError, match=r"num_clients \* min_size"):
        QuantitySkewPartitioner(alpha=1.0, min_size=6).split(
            np.zeros(100, dtype=int), 20, np.random.default_rng(0)
        )


def test_sequential_errors() -> None:
    with pytest.raises(ConfigError, match="samples_per_client must be an integer >= 1"):
        SequentialDirichletPartitioner(alpha=1.0, samples_per_client=0)
    with pytest.raises(ConfigError, match="redraw_every must be an integer >= 1"):
        SequentialDirichletPartitioner(alpha=1.0, redraw_every=0)
    with pytest.raises(ConfigError, match=r"samples_per_client must be in 1\.\.10"):
        SequentialDirichletPartitioner(alpha=1.0, samples_per_client=11).split(
            np.zeros(100, dtype=int), 10, np.random.default_rng(0)
        )


def test_pathological_errors(labels: np.ndarray) -> None:
    with pytest.raises(ConfigError, match="classes_per_client must be an integer >= 1"):
        PathologicalPartitioner(classes_per_client=0)
    with pytest.raises(ConfigError, match=r"classes_per_client must be in 1\.\.10"):
        PathologicalPartitioner(classes_per_client=11).split(labels, 5, np.random.default_rng(0))
    with pytest.raises(ConfigError, match=r"num_clients \* classes_per_client"):
        PathologicalPartitioner(classes_per_client=3).split(
            np.arange(10) % 5, 4, np.random.default_rng(0)
        )


def test_bad_labels() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="empty"):
        IIDPartitioner().split(np.array([], dtype=int), 1, rng)
    with pytest.raises(ConfigError, match="integer"):
        IIDPartitioner().split(np.array([0.5, 1.0]), 1, rng)
    with pytest.raises(ConfigError, match="1-D"):
        IIDPartitioner().split(np.zeros((2, 2), dtype=int), 1, rng)
    with pytest.raises(ConfigError, match=">= 0"):
        IIDPartitioner().split(np.array([0, -1]), 1, rng)


def test_registry_and_factory() -> None:
    assert set(PARTITIONERS) == {
        "iid",
        "dirichlet",
        "dirichlet_capped",
        "dirichlet_equal",
        "dirichlet_seq",
        "flwr",
        "pathological",
        "quantity",
    }
    assert make_partitioner("iid") == IIDPartitioner()
    assert make_partitioner("dirichlet", alpha=0.3) == DirichletPartitioner(alpha=0.3)
    p = make_partitioner("dirichlet_seq", alpha=1, samples_per_client=5, redraw_every=2)
    assert p == SequentialDirichletPartitioner(1.0, 5, 2)
    assert isinstance(p.alpha, float)
    assert make_partitioner("pathological", classes_per_client=2) == PathologicalPartitioner(2)
    assert make_partitioner("quantity", alpha=2.0, min_size=3) == QuantitySkewPartitioner(2.0, 3)


def test_factory_errors() -> None:
    with pytest.raises(UnknownNameError, match="unknown label shift 'nope'; allowed: dirichlet"):
        make_partitioner("nope")
    with pytest.raises(
        ConfigError,
        match=r"label_shift: unexpected parameter 'beta' for 'dirichlet'; allowed: alpha, min_size",
    ):
        make_partitioner("dirichlet", alpha=1.0, beta=2)
    with pytest.raises(
        ConfigError, match=r"unexpected parameter 'alpha' for 'iid'; allowed: \(none"
    ):
        make_partitioner("iid", alpha=1.0)
    with pytest.raises(ConfigError, match="missing parameter 'alpha' for 'dirichlet'"):
        make_partitioner("dirichlet")
    with pytest.raises(ConfigError, match="alpha"):
        make_partitioner("quantity", alpha=-2)


def test_label_histogram() -> None:
    h = label_histogram(np.array([0, 2, 2, 4]), 6)
    assert h.dtype == np.int64
    assert h.tolist() == [1, 0, 2, 0, 1, 0]
    assert label_histogram(np.array([], dtype=int), 3).tolist() == [0, 0, 0]
    with pytest.raises(ConfigError, match=r"labels must be in 0\.\.2"):
        label_histogram(np.array([0, 3]), 3)


def test_capped_dirichlet_two_classes_min_size_and_skew(labels: np.ndarray) -> None:
    # the FedNH setting: 100 clients, Dir(0.3), >= 10 samples and >= 2 classes per client
    parts = CappedDirichletPartitioner(alpha=0.3).split(labels, 100, np.random.default_rng(1))
    check_valid(parts, N, 100, True)
    assert min(p.size for p in parts) >= 10
    assert min(int((label_histogram(labels[p], NUM_CLASSES) > 0).sum()) for p in parts) >= 2
    # smaller alpha -> more label skew (lower label entropy per client)
    rng = np.random.default_rng(2)
    skewed = CappedDirichletPartitioner(alpha=0.1, min_size=1).split(labels, 20, rng)
    flat = CappedDirichletPartitioner(alpha=10.0, min_size=1).split(labels, 20, rng)
    assert mean_entropy(skewed, labels) < mean_entropy(flat, labels) - 0.5
    # the cap N/K: a client stops receiving classes once it holds N/K samples, so no client
    # exceeds the cap by more than one class's worth of samples
    per_class = max(np.bincount(labels))
    assert max(p.size for p in skewed) <= N / 20 + per_class
