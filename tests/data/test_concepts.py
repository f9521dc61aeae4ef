"""Tests for fedshift.data.concepts (concept shift as label maps)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedshift.core.errors import ConfigError, UnknownNameError
from fedshift.data.concepts import (
    LabelMap,
    fedrc_concepts,
    identity_map,
    make_label_map,
    permutation_map,
    random_permutation_map,
    reverse_map,
    shift_map,
)

C = 10
ALL = np.arange(C)


def is_permutation(lm: LabelMap, c: int) -> bool:
    out = lm.apply(np.arange(c))
    return sorted(out.tolist()) == list(range(c))


def test_identity() -> None:
    lm = identity_map(C)
    assert lm.kind == "identity" and lm.name == "identity"
    assert lm.apply(ALL).tolist() == ALL.tolist()


def test_reverse() -> None:
    lm = reverse_map(C)
    assert lm.name == "reverse (C-1-y)"
    out = lm.apply(ALL)
    assert out.tolist() == (C - 1 - ALL).tolist()
    assert out[0] == 9 and out[9] == 0


@pytest.mark.parametrize("k", [0, 1, 3, 9, 10, 13, -1])
def test_shift(k: int) -> None:
    lm = shift_map(C, k)
    assert lm.apply(ALL).tolist() == ((ALL + k) % C).tolist()
    assert lm.name == f"shift+{k % C}"


def test_shift_concrete() -> None:
    lm = shift_map(C, 1)
    assert lm.name == "shift+1"
    assert lm.apply(np.array([0, 9, 4])).tolist() == [1, 0, 5]


def test_apply_keeps_shape_and_dtype() -> None:
    y = np.array([[0, 1], [8, 9]], dtype=np.int32)
    out = reverse_map(C).apply(y)
    assert out.dtype == np.int64 and out.shape == (2, 2)
    assert out.tolist() == [[9, 8], [1, 0]]
    assert reverse_map(C).apply(np.array([], dtype=int)).shape == (0,)


def test_apply_rejects_out_of_range() -> None:
    with pytest.raises(ConfigError, match=r"0\.\.9"):
        identity_map(C).apply(np.array([0, 10]))
    with pytest.raises(ConfigError, match=r"0\.\.9"):
        identity_map(C).apply(np.array([-1, 3]))  # negative indices must not wrap
    with pytest.raises(ConfigError, match="integer"):
        identity_map(C).apply(np.array([0.0, 1.0]))


def test_as_array_is_a_copy() -> None:
    lm = shift_map(C, 2)
    a = lm.as_array()
    assert a.dtype == np.int64 and a.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    a[0] = 99
    assert lm.as_array()[0] == 2


@pytest.mark.parametrize("c", [1, 2, 3, 10, 100])
def test_all_maps_are_bijective(c: int) -> None:
    rng = np.random.default_rng(0)
    for lm in [
        identity_map(c),
        reverse_map(c),
        shift_map(c, 1),
        shift_map(c, 7),
        random_permutation_map(c, rng),
        permutation_map(list(range(c))[::-1]),
    ]:
        assert lm.num_classes == c
        assert is_permutation(lm, c)


def test_permutation_map_and_name() -> None:
    lm = permutation_map([2, 0, 1])
    assert lm.kind == "permutation"
    assert lm.apply(np.array([0, 1, 2])).tolist() == [2, 0, 1]
    assert lm.name == "perm[2,0,1]"
    long = permutation_map(list(range(12))[::-1])
    assert long.name == "perm[11,10,9,8,7,6,5,4,...]"
    assert permutation_map(np.array([1, 0])).mapping == (1, 0)


@pytest.mark.parametrize(
    ("perm", "match"),
    [
        ([0, 1, 1], "appears more than once and 2 is missing"),
        ([0, 1, 3], "value 3 is out of range"),
        ([0, -1, 1], "value -1 is out of range"),
        ([], "empty"),
        ([0, 1.5], "integers only"),
        ([0, True], "integers only"),
        ("012", "list of integers"),
        (5, "list of integers"),
        (np.zeros((2, 2), dtype=int), "1-D"),
    ],
)
def test_permutation_validation(perm, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        permutation_map(perm)


def test_label_map_is_frozen_and_validated() -> None:
    lm = identity_map(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lm.kind = "reverse"  # type: ignore[misc]
    with pytest.raises(ConfigError):
        LabelMap("permutation", (0, 0, 1))
    with pytest.raises(UnknownNameError):
        LabelMap("flip", (0, 1))
    assert LabelMap("permutation", [1, 0]).mapping == (1, 0)  # type: ignore[arg-type]


def test_random_permutation_map() -> None:
    a = random_permutation_map(C, np.random.default_rng(5))
    b = random_permutation_map(C, np.random.default_rng(5))
    assert a == b and a.kind == "random" and is_permutation(a, C)
    assert a.name.startswith("random perm[")


def test_make_label_map_string_forms() -> None:
    assert make_label_map("identity", C) == identity_map(C)
    assert make_label_map("reverse", C) == reverse_map(C)
    assert make_label_map("shift:1", C) == shift_map(C, 1)
    assert make_label_map("shift:3", C) == shift_map(C, 3)
    assert make_label_map("shift", C) == shift_map(C, 1)
    assert make_label_map(" Reverse ", C) == reverse_map(C)
    assert make_label_map("random:3", C) == make_label_map({"kind": "random", "seed": 3}, C)
    r = make_label_map("random", C, np.random.default_rng(0))
    assert r == random_permutation_map(C, np.random.default_rng(0))


def test_make_label_map_dict_forms() -> None:
    assert make_label_map({"kind": "identity"}, C) == identity_map(C)
    assert make_label_map({"kind": "shift", "k": 2}, C) == shift_map(C, 2)
    assert make_label_map({"kind": "permutation", "perm": [1, 2, 0]}, 3).mapping == (1, 2, 0)
    a = make_label_map({"kind": "random", "seed": 3}, C)
    b = make_label_map({"kind": "random", "seed": 3}, C, np.random.default_rng(99))
    assert a == b and is_permutation(a, C)
    assert make_label_map({"kind": "random", "seed": 4}, C) != a
    lm = reverse_map(C)
    assert make_label_map(lm, C) is lm


@pytest.mark.parametrize(
    ("spec", "exc", "match"),
    [
        ("flip", UnknownNameError, "unknown concept 'flip'; allowed: identity, permutation"),
        ({"kind": "flip"}, UnknownNameError, "unknown concept 'flip'"),
        ("flip:2", UnknownNameError, "unknown concept 'flip'"),
        ("shift:x", ConfigError, "needs an integer"),
        ("reverse:2", ConfigError, "takes no argument"),
        ({"kind": "shift", "k": 1.5}, ConfigError, "k must be an integer"),
        (
            {"kind": "shift", "n": 1},
            ConfigError,
            "unexpected parameter 'n' for 'shift'; allowed: k",
        ),
        ({"kind": "reverse", "k": 1}, ConfigError, r"allowed: \(none\)"),
        ({"k": 1}, ConfigError, "needs a string 'kind'"),
        ({"kind": "permutation"}, ConfigError, "needs a 'perm'"),
        ({"kind": "permutation", "perm": [1, 0]}, ConfigError, "length 2 but the dataset has 10"),
        ({"kind": "permutation", "perm": [1, 1, 0]}, ConfigError, "more than once"),
        ("random", ConfigError, "needs a 'seed'"),
        ({"kind": "random", "seed": -1}, ConfigError, "seed must be an integer >= 0"),
        (3, ConfigError, "must be a string"),
    ],
)
def test_make_label_map_errors(spec, exc, match: str) -> None:
    with pytest.raises(exc, match=match):
        make_label_map(spec, C)


def test_make_label_map_bad_num_classes() -> None:
    with pytest.raises(ConfigError, match="num_classes"):
        make_label_map("identity", 0)
    with pytest.raises(ConfigError, match="has 10 classes, not 5"):
        make_label_map(identity_map(10), 5)


def test_fedrc_concepts() -> None:
    maps = fedrc_concepts(C)
    assert [m.name for m in maps] == ["identity", "reverse (C-1-y)", "shift+1"]
    ident, rev, shift = (m.apply(ALL) for m in maps)
    assert ident.tolist() == ALL.tolist()
    assert rev.tolist() == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    assert shift.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]
    for m in maps:
        assert is_permutation(m, C)
    # neither shifted concept keeps any label of the identity for C = 10
    assert np.all(rev != ident) and np.all(shift != ident)
