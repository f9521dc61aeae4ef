"""The scenario generator: client types, label maps, no leakage, test-only clients, cache."""

import os

import numpy as np
import pytest
import torch

from fedshift.config.scenario import ScenarioConfig, fedrc_mix
from fedshift.data.scenario import build_scenario


def digits_scenario(**over) -> ScenarioConfig:
    base = {
        "dataset": "digits",
        "num_clients": 20,
        "label_shift": {"kind": "dirichlet", "alpha": 1.0},
        "concepts": ["identity", "reverse", "shift:1"],
        "feature_shift": {"styles": ["gaussian_noise", "fog", "rotate:90"]},
        "mix": fedrc_mix().model_dump(),
    }
    base.update(over)
    return ScenarioConfig.model_validate(base)


def test_fedrc_mix_fractions_and_label_maps():
    data = build_scenario(digits_scenario(), seed=0)
    concepts = np.array([c.concept for c in data.clients])
    styled = np.array([c.style.kind != "clean" for c in data.clients])
    assert (concepts == 0).sum() == 10  # 30% + 20%
    assert ((concepts == 0) & styled).sum() == 4  # 20%
    assert ((concepts > 0) & ~styled).sum() == 8  # 40%, alternating the two maps
    assert ((concepts > 0) & styled).sum() == 2  # 10%
    assert (concepts == 1).sum() == (concepts == 2).sum() == 5
    for c in data.clients:
        assert c.label_map is data.concepts[c.concept]
        assert c.y_train.max() < data.num_classes


def test_labels_follow_the_client_label_map():
    cfg = digits_scenario(
        mix={"types": [{"fraction": 1.0, "concepts": [1]}]}, concepts=["identity", "reverse"]
    )
    data_rev = build_scenario(cfg, seed=3)
    cfg_id = digits_scenario(
        mix={"types": [{"fraction": 1.0, "concepts": [0]}]}, concepts=["identity", "reverse"]
    )
    data_id = build_scenario(cfg_id, seed=3)
    for a, b in zip(data_id.clients, data_rev.clients, strict=True):
        assert torch.equal(a.train_idx, b.train_idx)
        assert torch.equal(b.y_train, 9 - a.y_train)


def test_no_train_test_leakage_and_no_shared_samples():
    data = build_scenario(digits_scenario(), seed=1)
    seen: set[int] = set()
    for c in data.clients:
        tr, te = set(c.train_idx.tolist()), set(c.test_idx.tolist())
        assert not tr & te, f"client {c.cid} leaks test samples into train"
        assert not (tr | te) & seen, f"client {c.cid} shares samples with another client"
        seen |= tr | te
        assert c.num_test >= 1 and c.num_train >= 1
    for t in data.test_clients:
        assert not set(t.train_idx.tolist()) & set(t.test_idx.tolist())
        assert not set(t.test_idx.tolist()) & seen  # from the official test set only


def test_test_only_clients_one_per_concept_balanced():
    data = build_scenario(digits_scenario(), seed=0)
    assert [t.concept for t in data.test_clients] == [0, 1, 2]
    assert len({tuple(t.test_idx.tolist()) for t in data.test_clients}) == 1  # same images
    t0 = data.test_clients[0]
    hist = np.bincount(torch.cat([t0.y_train, t0.y_test]).numpy(), minlength=10)
    assert hist.min() == hist.max(), "test-only clients must have balanced labels"
    assert all(t.style.kind == "clean" and t.test_only for t in data.test_clients)
    assert torch.equal(data.test_clients[1].y_test, 9 - data.test_clients[0].y_test)


def test_styles_are_applied_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path))
    cfg = digits_scenario()
    a = build_scenario(cfg, seed=0)
    files = list((tmp_path / "scenarios").glob("*.npz"))
    assert len(files) == 1
    mtime = os.path.getmtime(files[0])
    b = build_scenario(cfg, seed=0)
    assert os.path.getmtime(files[0]) == mtime  # reused, not recomputed
    assert torch.equal(a.x, b.x)
    styled = next(c for c in a.clients if c.style.kind == "corruption")
    clean_twin = build_scenario(
        digits_scenario(mix={"types": [{"fraction": 1.0, "concepts": [0]}]}), seed=0
    )
    twin = clean_twin.clients[styled.cid]
    assert styled.num_train == twin.num_train
    assert not torch.equal(a.x[styled.train_idx], clean_twin.x[twin.train_idx])


def test_deterministic_and_seed_dependent():
    cfg = digits_scenario()
    a, b, c = (build_scenario(cfg, seed=s) for s in (0, 0, 1))
    assert all(
        torch.equal(x.train_idx, y.train_idx) for x, y in zip(a.clients, b.clients, strict=True)
    )
    assert any(
        not torch.equal(x.train_idx, y.train_idx) for x, y in zip(a.clients, c.clients, strict=True)
    )


def test_explicit_client_list_and_colour_on_grayscale():
    cfg = digits_scenario(
        num_clients=3,
        mix={
            "clients": [
                {"concept": 0, "style": "clean"},
                {"concept": 1, "style": "color:red"},
                {"concept": 2, "style": "fog/5"},
            ]
        },
    )
    data = build_scenario(cfg, seed=0)
    assert data.input_shape[0] == 3  # the pool became RGB
    assert [c.style.label() for c in data.clients][0] == "clean"
    assert data.clients[2].style.severity == 5
    red = data.x[data.clients[1].train_idx]
    assert red[:, 1:].sum() == 0 and red[:, 0].sum() > 0


@pytest.mark.skipif(
    not os.environ.get("FEDSHIFT_DATA") and not os.environ.get("CI"),
    reason="set FEDSHIFT_DATA to the folder holding fashion-mnist/",
)
def test_fmnist_fedrc_scenario_real_data():
    cfg = ScenarioConfig.model_validate(
        {
            "dataset": "fmnist",
            "num_clients": 30,
            "train_fraction_of_dataset": 0.1,
            "label_shift": {"kind": "dirichlet_seq", "alpha": 1.0},
            "concepts": ["identity", "reverse", "shift:1"],
            "feature_shift": {"styles": ["shot_noise", "motion_blur"]},
            "mix": fedrc_mix().model_dump(),
        }
    )
    data = build_scenario(cfg, seed=0)
    assert data.input_shape == (1, 28, 28)
    assert sum(c.num_train + c.num_test for c in data.clients) == 6000
    assert len(data.test_clients) == 3
    assert data.test_clients[0].num_train + data.test_clients[0].num_test == 10000


def test_long_tail_keeps_a_geometric_share_of_each_class_and_leaves_the_test_set():
    """Class c keeps IF^(-c/(C-1)) of its training images (class 0 all, the last 1/IF); the
    test-only clients' official test set stays balanced; the cache key tells the two apart."""
    plain = ScenarioConfig.model_validate({"dataset": "digits", "num_clients": 10})
    tailed = plain.model_copy(update={"long_tail": 10.0})
    counts = []
    for cfg in (plain, tailed):
        data = build_scenario(cfg, seed=0)
        ys = torch.cat([torch.cat([c.y_train, c.y_test]) for c in data.clients])
        counts.append(torch.bincount(ys, minlength=10).double())
        test_y = data.test_clients[0].y_train.tolist() + data.test_clients[0].y_test.tolist()
        assert np.bincount(test_y).min() >= 0.9 * np.bincount(test_y).max()
    share = (counts[1] / counts[0]).numpy()
    assert np.allclose(share, 10.0 ** (-np.arange(10) / 9), atol=0.01)
    assert plain.hash(0) != tailed.hash(0)


def test_long_tail_cannot_be_combined_with_attribute_skew():
    attrs = {"kind": "color", "mode": "background"}
    with pytest.raises(ValueError, match="long_tail cannot be combined with attributes"):
        ScenarioConfig.model_validate({"dataset": "digits", "attributes": attrs, "long_tail": 10})
