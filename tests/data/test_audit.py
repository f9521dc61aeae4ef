"""The leakage audit and the single-model bound (fedshift.data.audit): the math by hand, and on
timelines: the fixed split never puts a trained image in a test split, the authors' re-split
does (as much as the audit says), pieces keep their concept, Dirichlet label drift."""

from __future__ import annotations

import numpy as np
import pytest

from fedshift.data.audit import leak_share, single_model_bound
from fedshift.data.partition import make_partitioner
from fedshift.data.scenario import build_scenario
from tests.conftest import timeline_config


def test_leak_share_counts_same_item_with_same_label_only():
    trained = [(np.array([1, 2, 3]), np.array([0, 1, 2]))]
    # item 1 label 0: seen; item 2 with another label: not; item 9: not; item 3 label 2: seen
    tested = [(np.array([1, 2]), np.array([0, 0])), (np.array([9, 3]), np.array([1, 2]))]
    assert leak_share(trained, tested, 4) == pytest.approx(50.0)
    assert leak_share(trained, [(np.array([5]), np.array([1]))], 4) == 0.0
    assert np.isnan(leak_share(trained, [], 4))


def test_single_model_bound_by_hand():
    # style 0, class 0: labels {0, 0, 1} -> 2 right at best; class 1: {1, 2} -> 1
    # style 1, class 0: {1} -> 1 (the model sees the style, so it may answer differently)
    styles = np.array([0, 0, 0, 0, 0, 1])
    classes = np.array([0, 0, 0, 1, 1, 0])
    labels = np.array([0, 0, 1, 1, 2, 1])
    assert single_model_bound(styles, classes, labels) == pytest.approx(100 * 4 / 6)
    # two contradicting concepts in equal shares: 50%
    assert single_model_bound(np.zeros(4), np.array([3, 3, 5, 5]), np.array([3, 6, 5, 4])) == 50


def timeline(tmp_path, split="fixed", label_shift=None, steps=None):
    """test_drift's timeline scenario, one round per step, 12 pieces, no test-only clients."""
    steps = steps or [
        {"concepts": [0, 1]},
        {"concepts": [0, 1, 2], "style": "rotate:90"},
        {"concepts": [0, 1, 2]},
    ]
    return timeline_config(
        tmp_path,
        scenario__label_shift=label_shift or {"kind": "iid"},
        scenario__test_clients={"enabled": False},
        scenario__timeline={"rounds_per_step": 1, "pieces": 12, "split": split, "steps": steps},
        train__rounds=len(steps),
    ).scenario


def _pairs(data, clients, split):
    """(source id, label) pairs of the clients' train or test splits."""
    out = set()
    for c in clients:
        idx = getattr(c, f"{split}_idx").numpy()
        y = getattr(c, f"y_{split}").numpy()
        out |= set(zip(data.origin[idx].tolist(), y.tolist(), strict=True))
    return out


def test_fixed_split_never_tests_a_trained_image_and_the_resplit_does(tmp_path):
    fixed = build_scenario(timeline(tmp_path), 0)
    assert [a["test_leak"] for a in fixed.meta["audit"]] == [0.0, 0.0, 0.0]
    trained_ever = set().union(*(_pairs(fixed, st, "train") for st in fixed.steps))
    tested_ever = set().union(*(_pairs(fixed, st, "test") for st in fixed.steps))
    assert {s for s, _ in trained_ever}.isdisjoint({s for s, _ in tested_ever})
    resplit = build_scenario(timeline(tmp_path, "per_load"), 0)
    audit = resplit.meta["audit"]
    assert all(a["test_leak"] > 20 for a in audit[1:])  # earlier steps' training images
    # the audit's figure, recomputed directly at step 3
    seen = set().union(*(_pairs(resplit, st, "train") for st in resplit.steps))
    tests = [
        (s, y)
        for c in resplit.steps[2]
        for s, y in zip(resplit.origin[c.test_idx.numpy()].tolist(), c.y_test.tolist(), strict=True)
    ]
    direct = 100 * sum(p in seen for p in tests) / len(tests)
    assert audit[2]["test_leak"] == pytest.approx(direct)
    # step 2 is rotated: no test input is the exact input of an earlier training sample
    # except through pieces dealt twice at that step
    assert audit[1]["test_leak_exact"] < audit[1]["test_leak"]


def test_pieces_keep_their_concept_across_steps(tmp_path):
    data = build_scenario(timeline(tmp_path, "per_load"), 0)
    concept_of: dict[int, int] = {}
    for st in data.steps:
        for c in st:
            for s in data.origin[c.train_idx.numpy()].tolist():
                assert concept_of.setdefault(s, c.concept) == c.concept


def test_the_single_model_bound_of_the_feddaa_concepts(tmp_path):
    data = build_scenario(timeline(tmp_path), 0)
    bounds = [a["single_model_bound"] for a in data.meta["audit"]]
    # 2 contradicting concepts: the larger group of each class, at least 1/2 (about 1/2 in
    # expectation); 3 concepts (y, 9-y, y+1 agree on 2 of 10 classes): about 0.4
    assert 50 <= bounds[0] < 70 and bounds[2] < bounds[0]
    rotated = build_scenario(timeline(tmp_path, steps=[{"concepts": [0]}, {"concepts": [0, 1]}]), 0)
    assert rotated.meta["audit"][0]["single_model_bound"] == 100  # one concept: no conflict


def test_label_shift_makes_the_pieces_under_a_timeline(tmp_path):
    iid = build_scenario(timeline(tmp_path), 0)
    dp = {"kind": "dirichlet_equal", "alpha": 0.3}
    skewed = build_scenario(timeline(tmp_path, label_shift=dp), 0)

    def spread(data):  # mean total-variation distance of the clients' P(y) from uniform
        h = np.stack([c.label_hist / c.label_hist.sum() for c in data.steps[0]])
        return float(np.abs(h - 0.1).sum(1).mean() / 2)

    assert spread(skewed) > spread(iid) + 0.2

    # a client's P(y) changes with its piece at every step (label drift)
    def change(data):  # mean over clients of the TV distance of P(y) from step 1 to 2
        h = [np.stack([c.label_hist / c.label_hist.sum() for c in st]) for st in data.steps]
        return float(np.abs(h[0] - h[1]).sum(1).mean() / 2)

    assert change(skewed) > change(iid) + 0.2


def test_dirichlet_equal_gives_equal_sizes_and_the_asked_skew():
    y = np.repeat(np.arange(10), 600)
    rng = np.random.default_rng(0)
    for alpha, lo, hi in ((0.5, 0.45, 0.8), (5.0, 0.05, 0.3)):
        parts = make_partitioner("dirichlet_equal", alpha=alpha).split(y, 20, rng)
        assert {len(p) for p in parts} == {300}
        assert len(np.unique(np.concatenate(parts))) == 6000  # disjoint
        tv = np.mean(
            [np.abs(np.bincount(y[p], minlength=10) / len(p) - 0.1).sum() / 2 for p in parts]
        )
        assert lo < tv < hi, (alpha, tv)
