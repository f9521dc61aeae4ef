"""Label noise (scenario.label_noise): flip rates, the pair and symmetric conventions, clean
clients and test splits untouched, its own random stream, the recorded truth, the hash, errors
and the clustering diagnostic against noisy/clean."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from rich.console import Console

from fedshift.config import validate_config
from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError
from fedshift.data.federated import FederatedData
from fedshift.data.scenario import build_scenario
from fedshift.data.truth import noise_truth
from fedshift.engine.metrics import clustering_diagnostics
from fedshift.reporting.tables import noise_table, scenario_table
from tests.conftest import tiny_config

CONCEPTS = ["identity", "reverse", "shift:1"]


def scenario(noise: dict | None = None, **over) -> ScenarioConfig:
    """Digits, 12 clients, three concepts (alternated), a few styled clients."""
    base = {
        "dataset": "digits",
        "num_clients": 12,
        "label_shift": {"kind": "dirichlet", "alpha": 1.0},
        "concepts": CONCEPTS,
        "feature_shift": {"styles": ["gaussian_noise", "rotate:90"], "severities": [2]},
        "mix": {
            "types": [
                {"fraction": 0.75, "concepts": [0, 1, 2]},
                {"fraction": 0.25, "concepts": [0, 1, 2], "feature": True},
            ]
        },
    }
    if noise is not None:
        base["label_noise"] = noise
    base.update(over)
    return ScenarioConfig.model_validate(base)


def big_client(noise: dict) -> FederatedData:
    """One client holding 18,000 training samples of 10 classes (synthetic), concept shift+1."""
    cfg = ScenarioConfig.model_validate(
        {
            "dataset": "synthetic",
            "dataset_options": {"n_train": 20000, "n_test": 200, "dim": 4, "num_classes": 10},
            "num_clients": 1,
            "label_shift": {"kind": "iid"},
            "concepts": ["shift:1"],
            "label_noise": noise,
        }
    )
    return build_scenario(cfg, seed=0)


def same_arrays(a, b) -> bool:
    """Two clients' index and label arrays are equal."""
    names = ("train_idx", "test_idx", "y_train", "y_test")
    return all(torch.equal(getattr(a, n), getattr(b, n)) for n in names)


def binomial_tolerance(n: int, p: float, sigmas: float = 5.0) -> float:
    """``sigmas`` standard deviations of a binomial share k/n (5: a false alarm about once in
    3.5 million draws; the seeds are fixed, so a test either always passes or always fails)."""
    return sigmas * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("kind", ["pair", "symmetric"])
def test_flip_share_is_close_to_the_rate_on_a_large_client(kind):
    rate = 0.2
    data = big_client({"kind": kind, "rate": rate})
    (c,) = data.clients
    n = c.num_train
    assert n > 15000
    share = len(c.noise) / n
    # k ~ Binomial(n, rate): |k/n - rate| <= 5 sd = 5 sqrt(rate (1 - rate) / n) ~ 0.015
    assert abs(share - rate) <= binomial_tolerance(n, rate)
    assert data.meta["label_noise"]["flipped_share"] == pytest.approx(share)


def test_pair_flips_map_y_to_y_plus_one_on_the_recorded_samples_only():
    noisy = build_scenario(scenario({"kind": "pair", "rate": 0.3}), seed=0)
    clean = build_scenario(scenario(), seed=0)
    C = noisy.num_classes
    total = 0
    for a, b in zip(clean.clients, noisy.clients, strict=True):
        assert b.noisy and b.noise is not None
        assert torch.equal(a.train_idx, b.train_idx)  # same samples, only labels differ
        changed = (a.y_train != b.y_train).numpy()
        idx = b.train_idx.numpy()
        assert np.array_equal(np.sort(idx[changed]), b.noise.idx)
        pos = np.searchsorted(idx, b.noise.idx, sorter=np.argsort(idx))
        order = np.argsort(idx)[pos]
        assert np.array_equal(a.y_train.numpy()[order], b.noise.original)  # clean labels
        assert np.array_equal(b.y_train.numpy()[order], b.noise.noisy)
        assert np.array_equal(b.noise.noisy, (b.noise.original + 1) % C)
        assert np.array_equal(b.label_hist, np.bincount(b.y_train.numpy(), minlength=C))
        total += len(b.noise)
    assert total > 0


def test_symmetric_never_keeps_the_class_and_spreads_over_the_others():
    rate = 0.5
    data = big_client({"kind": "symmetric", "rate": rate})
    (c,) = data.clients
    C = data.num_classes
    assert c.noise is not None
    assert not np.any(c.noise.noisy == c.noise.original)
    offsets = (c.noise.noisy - c.noise.original) % C  # 1..C-1, uniform
    counts = np.bincount(offsets, minlength=C)
    assert counts[0] == 0
    k = len(offsets)
    p = 1 / (C - 1)
    for m in counts[1:]:  # each offset's share ~ Binomial(k, 1/(C-1)) / k
        assert abs(m / k - p) <= binomial_tolerance(k, p)
    # the noisy labels cover every class of the client's own labels
    assert set(c.noise.noisy.tolist()) == set(range(C))


def test_clean_clients_and_test_splits_are_untouched():
    cfg = scenario({"kind": "symmetric", "rate": 0.4, "clients": 0.5})
    noisy = build_scenario(cfg, seed=1)
    clean = build_scenario(scenario(), seed=1)
    flags = noise_truth(noisy)
    assert flags.sum() == 6  # floor(0.5 x 12 + 0.5)
    assert noisy.meta["label_noise"]["noisy_clients"] == np.flatnonzero(flags).tolist()
    for a, b, flag in zip(clean.clients, noisy.clients, flags, strict=True):
        assert b.noisy == flag
        assert torch.equal(a.test_idx, b.test_idx) and torch.equal(a.y_test, b.y_test)
        assert b.style == a.style and b.concept == a.concept
        if not flag:
            assert b.noise is None and same_arrays(a, b)
            assert np.array_equal(a.label_hist, b.label_hist)
    for a, b in zip(clean.test_clients, noisy.test_clients, strict=True):
        assert same_arrays(a, b) and not b.noisy
    assert torch.equal(clean.x, noisy.x)


def test_validation_split_of_a_noisy_client_keeps_its_noisy_labels():
    data = build_scenario(scenario({"kind": "pair", "rate": 0.5}, validation_fraction=0.3), seed=0)
    C = data.num_classes
    in_val = 0
    for c in data.clients:
        assert c.noise is not None and c.val_idx is not None
        noisy_of = dict(zip(c.noise.idx.tolist(), c.noise.noisy.tolist(), strict=True))
        for i, y in zip(c.val_idx.tolist(), c.y_val.tolist(), strict=True):
            if i in noisy_of:
                assert y == noisy_of[i]
                in_val += 1
        assert np.array_equal(c.noise.noisy, (c.noise.original + 1) % C)
    assert in_val > 0


def test_rate_zero_is_array_identical_to_no_label_noise():
    base = build_scenario(scenario(), seed=2)
    zero = build_scenario(scenario({"kind": "symmetric", "rate": 0.0}), seed=2)
    assert torch.equal(base.x, zero.x)
    for a, b in zip([*base.clients, *base.test_clients], [*zero.clients, *zero.test_clients],
                    strict=True):  # fmt: skip
        assert same_arrays(a, b)
        assert np.array_equal(a.label_hist, b.label_hist)
    assert all(c.noise is not None and len(c.noise) == 0 for c in zero.clients)
    assert "label_noise" not in base.meta


def test_label_noise_moves_no_other_draw():
    """The samples, styles, concepts and test splits of a noisy scenario are those of the same
    scenario without noise (its draws come from a stream of their own)."""
    base = build_scenario(scenario(), seed=3)
    noisy = build_scenario(scenario({"kind": "pair", "rate": 0.2, "clients": 0.4}), seed=3)
    for a, b in zip(base.clients, noisy.clients, strict=True):
        assert torch.equal(a.train_idx, b.train_idx) and torch.equal(a.test_idx, b.test_idx)
        assert (a.concept, a.style) == (b.concept, b.style)


def test_deterministic_from_the_scenario_seed():
    cfg = scenario({"kind": "symmetric", "rate": 0.3, "clients": 0.5})
    a, b = build_scenario(cfg, seed=4), build_scenario(cfg, seed=4)
    for x, y in zip(a.clients, b.clients, strict=True):
        assert same_arrays(x, y) and x.noisy == y.noisy
        if x.noise is not None:
            assert np.array_equal(x.noise.idx, y.noise.idx)
            assert np.array_equal(x.noise.noisy, y.noise.noisy)
    other = build_scenario(cfg, seed=5)
    assert [c.noisy for c in other.clients] != [c.noisy for c in a.clients] or any(
        not torch.equal(x.y_train, y.y_train) for x, y in zip(a.clients, other.clients, strict=True)
    )
    # the scenario's own seed wins over the run's
    pinned = cfg.model_copy(update={"seed": 9})
    p1, p2 = build_scenario(pinned, seed=0), build_scenario(pinned, seed=1)
    assert all(same_arrays(x, y) for x, y in zip(p1.clients, p2.clients, strict=True))


def test_the_keys_enter_the_scenario_hash():
    hashes = {
        scenario().hash(0),
        scenario({"kind": "pair", "rate": 0.2}).hash(0),
        scenario({"kind": "symmetric", "rate": 0.2}).hash(0),
        scenario({"kind": "pair", "rate": 0.3}).hash(0),
        scenario({"kind": "pair", "rate": 0.2, "clients": 0.5}).hash(0),
        scenario({"kind": "pair", "rate": 0.0}).hash(0),
    }
    assert len(hashes) == 6
    # a scenario without label_noise keeps the hash it had before the key existed
    dump = scenario().model_dump(mode="json")
    del dump["label_noise"]
    assert scenario().hash(0) == ScenarioConfig.model_validate(dump).hash(0)
    assert build_scenario(scenario({"kind": "pair", "rate": 0.2}), seed=0).meta[
        "scenario_hash"
    ] == scenario({"kind": "pair", "rate": 0.2}).hash(0)


@pytest.mark.parametrize(
    "noise, words",
    [
        ({"kind": "pairflip", "rate": 0.2}, "label_noise.kind"),
        ({"kind": "pair", "rate": 1.5}, "label_noise.rate"),
        ({"kind": "pair", "rate": -0.1}, "label_noise.rate"),
        ({"kind": "pair"}, "label_noise.rate"),
        ({"rate": 0.2}, "label_noise.kind"),
        ({"kind": "pair", "rate": 0.2, "clients": 1.5}, "label_noise.clients"),
        ({"kind": "pair", "rate": 0.2, "sigma": 0.2}, "label_noise.sigma"),
    ],
)
def test_invalid_label_noise_is_a_one_line_config_error(tmp_path, noise, words):
    with pytest.raises(ConfigError) as err:
        validate_config(tiny_config(tmp_path, scenario__label_noise=noise))
    msg = str(err.value)
    assert "\n" not in msg and words in msg, msg


@pytest.mark.parametrize(
    "key, value",
    [
        ("drift", {"rounds": 3, "events": [{"kind": "sudden", "at": 2, "to": 1}]}),
        ("timeline", {"rounds_per_step": 1, "steps": [{"concepts": [0]}, {"concepts": [1]}]}),
    ],
)
def test_label_noise_with_time_is_refused(tmp_path, key, value):
    raw = tiny_config(
        tmp_path,
        scenario__concepts=["identity", "reverse"],
        scenario__label_noise={"kind": "pair", "rate": 0.2},
        **{f"scenario__{key}": value},
    )
    if key == "drift":
        raw["scenario"].pop("mix", None)
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    msg = str(err.value)
    assert "\n" not in msg and f"label_noise is not supported with {key}" in msg, msg


def test_scenario_inspection_shows_the_noise():
    data = build_scenario(scenario({"kind": "pair", "rate": 0.3, "clients": 0.5}), seed=0)
    console = Console(width=200, record=True)
    console.print(scenario_table(data))
    console.print(noise_table(data))
    text = console.export_text()
    assert "label noise (flipped)" in text and "noisy (" in text and "clean" in text
    assert "6 of 12" in text and "pair" in text
    assert noise_table(build_scenario(scenario(), seed=0)) is None


def test_clustering_diagnostics_against_noise():
    out = clustering_diagnostics(
        [0, 0, 1, 1], [0, 0, 1, 1], ["clean"] * 4, [0, 1, 0, 1], noisy=[True, False] * 2
    )
    assert out["ari_concept"] == pytest.approx(1.0)
    assert out["ari_noise"] < 0.1 and "nmi_noise" in out
    split = clustering_diagnostics(
        [0, 1, 0, 1], [0, 0, 0, 0], ["clean"] * 4, [0] * 4, noisy=[True, False] * 2
    )
    assert split["ari_noise"] == pytest.approx(1.0)
    assert "ari_noise" not in clustering_diagnostics([0, 1], [0, 1], ["a", "b"], [0, 1])


def test_a_clustered_run_reports_ari_noise_and_records_the_noise(tmp_path):
    from fedshift.run.experiment import run_experiment

    cfg = validate_config(
        tiny_config(
            tmp_path,
            scenario__concepts=["identity", "reverse"],
            scenario__mix={"types": [{"fraction": 1.0, "concepts": [0, 1]}]},
            scenario__label_noise={"kind": "pair", "rate": 0.3, "clients": 0.5},
            algorithm={"name": "ifca", "params": {"num_clusters": 2}},
            train__rounds=1,
        )
    )
    res = run_experiment(cfg)
    last = res.history[-1]
    assert "ari_noise" in last and "nmi_noise" in last and "ari_concept" in last
    noise = res.summary["label_noise"]  # summary.json records the truth's summary
    assert noise and noise["kind"] == "pair" and len(noise["noisy_clients"]) == 3


def test_the_noise_stream_is_its_own():
    """No scenario builder draws from the label-noise stream id (their ids are literals in
    ``default_rng([seed, <id>, ...])``), and no two stream ids of fedshift.core.seeds agree."""
    import re
    from pathlib import Path

    from fedshift.core import seeds
    from fedshift.core.seeds import LABEL_NOISE_STREAM

    root = Path(seeds.__file__).resolve().parents[1] / "data"
    used = {
        int(m)
        for f in root.rglob("*.py")
        if f.name != "label_noise.py"
        for m in re.findall(r"default_rng\(\[\s*(?:int\()?seed\)?,\s*(\d+)", f.read_text())
    }
    assert used and LABEL_NOISE_STREAM not in used
    ids = [v for k, v in vars(seeds).items() if k.endswith("_STREAM")]
    assert len(ids) == len(set(ids))
