"""Attribute-skew scenarios (DFL): colours, factor assignment, splits, the dSprites generator,
the digit domains and the loaders of datasets that are not available offline."""

from __future__ import annotations

import colorsys
import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedshift.config import validate_config
from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError, DatasetNotFoundError, FedshiftError
from fedshift.data.attributes import (
    assign_values,
    client_color,
    client_palette,
    client_pools,
    color_pair,
    factor_pools,
    paint,
    split_pool,
)
from fedshift.data.features import rotate
from fedshift.data.scenario import build_scenario
from fedshift.data.sources import RawDataset, dsprites, load_dataset, lookup

REAL_DATA = os.environ.get("FEDSHIFT_DATA", "").strip() or None
needs_real_data = pytest.mark.skipif(
    REAL_DATA is None and not os.environ.get("CI"),
    reason="FEDSHIFT_DATA is not set (CI sets it, and there these tests must run)",
)


@pytest.fixture
def no_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty data folder and no system/home folders: every file-based lookup misses."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FEDSHIFT_DATA", raising=False)
    monkeypatch.setattr(lookup, "SYSTEM_DATA_DIRS", (tmp_path / "system",))
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def scenario(**att) -> ScenarioConfig:
    over = {k: att.pop(k) for k in ("dataset", "num_clients", "dataset_options") if k in att}
    base = {"dataset": "digits", "num_clients": 5, "attributes": att}
    return ScenarioConfig.model_validate({**base, **over})


def fake_raw(values_train, values_test=(), name="fake") -> RawDataset:
    """A tiny dataset whose only factor is ``f`` (images: their own index as pixel value)."""
    vtr, vte = np.asarray(values_train, np.int64), np.asarray(values_test, np.int64)
    n, m = len(vtr), len(vte)
    x = (np.arange(n + m) % 256).astype(np.uint8)[:, None, None, None] * np.ones(
        (1, 4, 4, 1), np.uint8
    )
    return RawDataset(
        name, x[:n], np.arange(n) % 2, x[n:], np.arange(m) % 2, 2, ("a", "b"), (0.5,), (0.5,),
        "test", factors_train={"f": vtr}, factors_test={"f": vte},
    )  # fmt: skip


# ------------------------------------------------------------------------------ colour


def test_client_colours_follow_hsv_and_are_distinct():
    cols = [client_color(k, 20) for k in range(20)]
    for k, c in enumerate(cols):
        assert np.allclose(c, colorsys.hsv_to_rgb(k / 20, 1.0, 0.8))
    assert len({tuple(np.rint(c * 255).astype(int)) for c in cols}) == 20
    assert np.allclose(client_color(3, 10, 0.5, 1.0), colorsys.hsv_to_rgb(0.3, 0.5, 1.0))


def test_background_and_foreground_pixels():
    img = np.array([0, 255, 128], np.uint8).reshape(1, 1, 3, 1)  # background, digit, half
    c = client_color(7, 20)
    bg = paint(img, *color_pair("background", c))[0, 0]
    assert bg[0].tolist() == np.rint(c * 255).astype(int).tolist()  # the client's colour
    assert bg[1].tolist() == [255, 255, 255]  # white digit
    fg = paint(img, *color_pair("foreground", c))[0, 0]
    assert fg[0].tolist() == [0, 0, 0] and fg[1].tolist() == np.rint(c * 255).astype(int).tolist()
    m = 128 / 255  # x = m c_fg + (1 - m) c_bg
    assert np.allclose(bg[2], np.rint((m + (1 - m) * c) * 255), atol=1)
    assert np.allclose(fg[2], np.rint(m * c * 255), atol=1)


@pytest.mark.parametrize("mode", ["background", "foreground"])
def test_colour_scenario_paints_each_client(mode):
    data = build_scenario(scenario(kind="color", mode=mode, train_ratio=0.4, test_ratio=0.3), 0)
    assert data.input_shape == (3, 8, 8) and len(data.clients) == 5 and not data.test_clients
    for k, c in enumerate(data.clients):
        want = np.rint(client_color(k, 5) * 255).astype(int)
        px = data.x[c.train_idx].permute(0, 2, 3, 1).reshape(-1, 3).numpy().astype(int)
        common = np.unique(px, axis=0, return_counts=True)
        top = common[0][common[1].argmax()]  # the most common pixel: background
        assert top.tolist() == (want.tolist() if mode == "background" else [0, 0, 0])
        assert c.style.label() == f"{'bg' if mode == 'background' else 'fg'} hue {k / 5:.3g}"
        assert c.concept == 0 and c.label_map.kind == "identity"
    assert data.mean.shape == (1, 3, 1, 1)


# ------------------------------------------------------------------------------ factors


def test_assignment_n_equals_v():
    assert assign_values(40, 40) == [((k,), 0, 1) for k in range(40)]


def test_assignment_n_below_v_is_round_robin():
    got = assign_values(10, 4)
    assert [a[0] for a in got] == [(0, 4, 8), (1, 5, 9), (2, 6), (3, 7)]
    assert sorted(v for vals, _, _ in got for v in vals) == list(range(10))


def test_assignment_n_above_v_shares_values_disjointly():
    got = assign_values(8, 10)  # 3Dshapes scale skew: 8 scales over 10 clients
    assert [a[0][0] for a in got] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    assert got[0] == ((0,), 0, 2) and got[8] == ((0,), 1, 2) and got[2] == ((2,), 0, 1)
    values = np.repeat(np.arange(8), 25)
    pools = factor_pools(values, np.arange(8), got, seed=1, stream=0)
    flat = np.concatenate(pools)
    assert len(flat) == len(set(flat.tolist())) == 200  # disjoint and covering
    assert abs(len(pools[0]) - len(pools[8])) <= 1 and set(values[pools[8]]) == {0}


@pytest.mark.parametrize("n", [3, 6, 2])
def test_factor_clients_get_their_values(n):
    raw = fake_raw(np.repeat([5, 7, 9], 40))
    data = build_attribute(raw, n, train_ratio=0.5, test_ratio=0.5)
    owned = [set(assign_values(3, n)[k][0]) for k in range(n)]
    for k, c in enumerate(data.clients):
        idx = np.concatenate([c.train_idx.numpy(), c.test_idx.numpy()])
        src = data.x[idx, 0, 0, 0].numpy()  # the pixel is the source index
        assert {[5, 7, 9].index(int(v)) for v in raw.factors_train["f"][src]} == owned[k]
    assert sum(c.num_train + c.num_test for c in data.clients) == 120


def build_attribute(raw, n, **att):
    cfg = ScenarioConfig.model_validate(
        {
            "dataset": "digits",
            "num_clients": n,
            "attributes": {"kind": "factor", "factor": "f", **att},
        }
    )
    return build_scenario(cfg, 0, raw=raw)


def test_ratios_are_respected_and_splits_disjoint():
    tr, te = split_pool(np.arange(100), 0.2, 0.5, np.random.default_rng(0))
    assert len(tr) == 20 and len(te) == 50 and not set(tr) & set(te)
    raw = fake_raw(np.repeat([0, 1], 100))
    att = scenario(kind="factor", factor="f", train_ratio=0.2, test_ratio=0.5).attributes
    for a, b in client_pools(att, raw, 2, seed=0):
        assert len(a) == 20 and len(b) == 50 and not set(a) & set(b)


def test_split_pool_draws_train_from_train_and_test_from_test():
    raw = fake_raw(np.repeat([0, 1], 50), np.repeat([0, 1], 20))
    att = scenario(kind="factor", factor="f", train_ratio=0.6, test_ratio=1.0, pool="split")
    for k, (a, b) in enumerate(client_pools(att.attributes, raw, 2, seed=0)):
        assert len(a) == 30 and (a < 100).all() and len(b) == 20 and (b >= 100).all()
        assert set(raw.factors_train["f"][a]) == {k} and set(raw.factors_test["f"][b - 100]) == {k}


def test_deterministic_per_seed():
    cfg = scenario(kind="color", num_clients=4)
    a, b, c = build_scenario(cfg, 3), build_scenario(cfg, 3), build_scenario(cfg, 4)
    assert bool((a.x == b.x).all())
    for x, y in zip(a.clients, b.clients, strict=True):
        assert x.train_idx.equal(y.train_idx) and x.y_train.equal(y.y_train)
    assert not all(x.y_train.equal(y.y_train) for x, y in zip(a.clients, c.clients, strict=True))


# ------------------------------------------------------------------------------ colours inside a client


def data_digest(data) -> str:
    """A digest of a scenario's images, splits, labels and normalisation."""
    h = hashlib.sha256(data.x.numpy().tobytes())
    for c in data.clients:
        for t in (c.train_idx, c.test_idx, c.y_train, c.y_test):
            h.update(t.numpy().tobytes())
    h.update(data.mean.numpy().tobytes() + data.std.numpy().tobytes())
    return h.hexdigest()[:16]


def background_of(data, idx) -> np.ndarray:
    """The most common pixel of each image (a digit's background), as ints [N, 3]."""
    px = data.x[idx].permute(0, 2, 3, 1).reshape(len(idx), -1, 3).numpy().astype(int)
    out = []
    for img in px:
        values, counts = np.unique(img, axis=0, return_counts=True)
        out.append(values[counts.argmax()])
    return np.asarray(out)


def rgb255(hue: float, saturation: float = 1.0, value: float = 0.8) -> np.ndarray:
    return np.rint(np.asarray(colorsys.hsv_to_rgb(hue, saturation, value), np.float32) * 255)


def test_client_palettes_spread_round_the_hue_circle():
    assert client_palette(3, 20).tolist() == [3]
    assert client_palette(3, 20, 2).tolist() == [3, 13]
    assert client_palette(15, 20, 2).tolist() == [5, 15]  # the same pair as client 5
    assert client_palette(1, 10, 3).tolist() == [1, 4, 7]
    assert client_palette(2, 5, 5).tolist() == [0, 1, 2, 3, 4]


def test_one_colour_per_client_is_the_data_of_before():
    """The defaults (one colour, no jitter) build the very images, splits, labels and scenario
    hash that the builder made before the options existed (digests of that version)."""
    for extra in ({}, {"colors_per_client": 1, "hue_jitter": 0.0}):
        cfg = scenario(kind="color", num_clients=5, **extra)
        data = build_scenario(cfg, 3)
        assert data_digest(data) == "95f0b4e761f40931" and cfg.hash(3) == "3931c43e6657e642"
    fg = scenario(kind="color", num_clients=4, mode="foreground", saturation=0.5)
    assert data_digest(build_scenario(fg, 3)) == "9336cdbec078222d"
    att = data.meta["attributes"]
    for k, c in enumerate(data.clients):
        idx = np.concatenate([c.train_idx.numpy(), c.test_idx.numpy()])
        assert (att["color"][idx] == k).all() and np.allclose(att["hue"][idx], k / 5)
    assert len(att["color"]) == len(att["hue"]) == len(data.x)


def test_two_colours_per_client_in_equal_shares_as_recorded():
    cfg = scenario(kind="color", num_clients=4, colors_per_client=2)
    data = build_scenario(cfg, 0)
    att = data.meta["attributes"]
    for k, c in enumerate(data.clients):
        assert c.style.label() == f"bg hues {k % 2 / 4:.3g},{(k % 2 + 2) / 4:.3g}"
        for idx in (c.train_idx.numpy(), c.test_idx.numpy()):
            colors, counts = np.unique(att["color"][idx], return_counts=True)
            assert colors.tolist() == client_palette(k, 4, 2).tolist()
            assert counts.max() - counts.min() <= 1  # equal shares, to one sample
            want = np.stack([rgb255(j / 4) for j in att["color"][idx]])
            assert (background_of(data, idx) == want).all()  # the recorded colour is painted
            assert np.allclose(att["hue"][idx], att["color"][idx] / 4)
    again = build_scenario(cfg, 0)
    assert (again.x == data.x).all() and (again.meta["attributes"]["color"] == att["color"]).all()
    other = build_scenario(cfg, 1).meta["attributes"]["color"]
    assert not (other == att["color"]).all()


@pytest.mark.parametrize("m", [1, 2])
def test_hue_jitter_moves_hues_within_bounds(m):
    cfg = scenario(kind="color", num_clients=5, colors_per_client=m, hue_jitter=0.04)
    data = build_scenario(cfg, 0)
    att = data.meta["attributes"]
    for k, c in enumerate(data.clients):
        idx = c.train_idx.numpy()
        base, hue = att["color"][idx] / 5, att["hue"][idx]
        gap = np.abs((hue - base + 0.5) % 1.0 - 0.5)  # distance on the hue circle
        assert gap.max() <= 0.04 + 1e-9 and np.unique(hue).size > len(idx) // 2
        assert set(att["color"][idx].tolist()) == set(client_palette(k, 5, m).tolist())
        want = np.stack([rgb255(h) for h in hue])
        assert (background_of(data, idx) == want).all()
        assert c.style.label().endswith(" ±0.04")


# ------------------------------------------------------------------------------ dSprites


def test_dsprites_square_area_and_scale():
    for s, scale in enumerate(dsprites.SCALES):
        assert abs(int(dsprites.sprite(0, s, 0).sum()) - (scale * dsprites.SIDE) ** 2) <= 1e-6
    for shape in range(3):
        areas = [int(dsprites.sprite(shape, s, 7).sum()) for s in range(6)]
        assert areas == sorted(areas) and areas[0] < areas[-1] * 0.4  # grows ~ scale^2
    a, b, c = (dsprites.sprite(shape, 5, 0) for shape in range(3))
    assert (a != b).sum() > 50 and (a != c).sum() > 50 and (b != c).sum() > 50
    assert b.sum() < c.sum() < a.sum()  # ellipse < heart < square


@pytest.mark.parametrize("shape", dsprites.SHAPES)
@pytest.mark.parametrize("o", [3, 10, 17])
def test_dsprites_orientation_rotates_the_sprite(shape, o):
    theta = dsprites.ORIENTATIONS[o]
    upright = dsprites.render(shape, 1.0, 0.0, (32, 32))
    turned = dsprites.render(shape, 1.0, theta, (32, 32))
    expect = rotate(upright[None, ..., None] * 255, math.degrees(theta))[0, ..., 0] >= 128
    assert (turned != expect).sum() <= 0.08 * upright.sum()  # rasterisation error at the edge
    if shape == "heart":  # (the square and ellipse are symmetric: some angles look alike)
        assert (turned != upright).sum() > 0.1 * upright.sum()


def test_dsprites_generator_places_and_is_deterministic():
    idx = np.arange(0, dsprites.TOTAL, 4999)
    classes = dsprites.factor_classes(idx)
    x = dsprites.generate(classes)
    assert (x == dsprites.generate(classes)).all() and set(np.unique(x)) <= {0, 1}
    for i in range(0, len(idx), 10):
        sh, sc, o, px, py = classes[i]
        centre = (dsprites.FIRST_CENTRE + px, dsprites.FIRST_CENTRE + py)
        ref = dsprites.render(
            dsprites.SHAPES[sh], dsprites.SCALES[sc], dsprites.ORIENTATIONS[o], centre
        )
        assert (ref == x[i]).all()
    # an image does not depend on the others of its batch: one alone is the same image
    for i in (0, len(idx) // 2, len(idx) - 1):
        assert (dsprites.generate(classes[i : i + 1])[0] == x[i]).all()


def test_dsprites_source_subset_factors_and_size(no_data):
    ds = load_dataset("dsprites", no_data, fraction=0.002, size=32, label="shape", seed=1)
    assert ds.x_train.shape == (720 * 2, 32, 32, 1) and len(ds.x_test) == 0
    assert set(np.unique(ds.x_train)) == {0, 255} and ds.num_classes == 3
    f = ds.factors_train
    assert set(f) == {"shape", "scale", "orientation", "pos_x", "pos_y"}
    groups = f["shape"] * 240 + f["scale"] * 40 + f["orientation"]
    assert np.bincount(groups).tolist() == [2] * 720  # stratified
    assert (ds.y_train == f["shape"]).all() and "generated" in ds.source
    again = load_dataset("dsprites", no_data, fraction=0.002, size=32, label="shape", seed=1)
    assert (again.x_train == ds.x_train).all()
    other = load_dataset("dsprites", no_data, fraction=0.002, size=32, seed=2)
    assert not (other.factors_train["pos_x"] == f["pos_x"]).all()
    assert other.num_classes == 6 and (other.y_train == other.factors_train["scale"]).all()


def test_dsprites_orientation_skew_scenario(no_data):
    cfg = ScenarioConfig.model_validate(
        {
            "dataset": "dsprites",
            "dataset_options": {"fraction": 0.002, "size": 32},
            "num_clients": 40,
            "attributes": {"kind": "factor", "factor": "orientation", "train_ratio": 0.2, "test_ratio": 0.5},
        }
    )  # fmt: skip
    data = build_scenario(cfg, 0, data_dir=str(no_data))
    assert [c.style.label() for c in data.clients[:2]] == ["orientation 0", "orientation 1"]
    assert all(c.num_train == 7 and c.num_test == 18 for c in data.clients)  # of 36 each
    assert data.num_classes == 6 and data.input_shape == (1, 32, 32)


# ------------------------------------------------------------------------------ config errors


@pytest.mark.parametrize(
    ("scen", "match"),
    [
        ({"attributes": {"kind": "factor"}}, "kind=factor needs a factor"),
        ({"attributes": {"kind": "color", "factor": "x"}}, "factor is for kind=factor"),
        ({"attributes": {"kind": "factor", "factor": "x", "mode": "foreground"}}, "mode is for"),
        ({"attributes": {"kind": "color", "train_ratio": 0.6}}, "train_ratio \\+ test_ratio"),
        ({"attributes": {"kind": "color"}, "label_shift": {"kind": "iid"}}, "label_shift cannot"),
        ({"attributes": {"kind": "color"}, "timeline": {"rounds_per_step": 1, "steps": [{"concepts": [0]}]}}, "timeline cannot"),
        ({"attributes": {"kind": "color"}, "test_clients": {"enabled": False}}, "test_clients cannot"),
        ({"attributes": {"kind": "color"}, "concepts": ["identity", "reverse"]}, "concepts cannot"),
        ({"attributes": {"kind": "colour"}}, "scenario.attributes.kind"),
        ({"attributes": {"kind": "color", "colors_per_client": 0}}, "colors_per_client=0: it must be at least 1"),
        ({"num_clients": 4, "attributes": {"kind": "color", "colors_per_client": 5}}, "colors_per_client=5 > num_clients=4"),
        ({"attributes": {"kind": "color", "hue_jitter": 0.6}}, "hue_jitter=0.6: it must lie in \\[0, 0.5\\]"),
        ({"attributes": {"kind": "color", "hue_jitter": -0.1}}, "hue_jitter=-0.1: it must lie"),
        ({"attributes": {"kind": "factor", "factor": "x", "colors_per_client": 2}}, "colors_per_client is for kind=color"),
        ({"attributes": {"kind": "factor", "factor": "x", "hue_jitter": 0.1}}, "hue_jitter is for kind=color"),
    ],
)  # fmt: skip
def test_config_errors(scen, match):
    with pytest.raises(ConfigError, match=match) as err:
        validate_config({"scenario": {"dataset": "digits", **scen}})
    assert "\n" not in str(err.value)


def test_a_factor_config_validates_again_after_a_dump():
    """A dumped config writes the colour defaults out; validating it again must not read them as
    colour keys set on a factor scenario (every reproduction row is built this way)."""
    att = {"kind": "factor", "factor": "orientation", "train_ratio": 0.2}
    cfg = validate_config({"scenario": {"dataset": "dsprites", "attributes": att}})
    again = validate_config(cfg.model_dump(mode="json"))
    assert again.scenario.attributes == cfg.scenario.attributes


def test_split_pool_allows_whole_sets_and_personal_is_rejected():
    ok = {"attributes": {"kind": "color", "train_ratio": 1.0, "test_ratio": 1.0, "pool": "split"}}
    assert validate_config({"scenario": ok}).scenario.attributes.pool == "split"
    with pytest.raises(ConfigError, match="eval.personal"):
        validate_config({"scenario": ok, "eval": {"personal": "all"}})


def test_build_errors_are_one_line(no_data):
    with pytest.raises(ConfigError, match="has no such factor \\(it has: f\\)") as err:
        build_scenario(scenario(kind="factor", factor="orientation"), 0, raw=fake_raw([0, 1]))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="it has: none"):
        build_scenario(scenario(kind="factor", factor="domain"), 0)  # digits: no factors
    with pytest.raises(ConfigError, match="pool=split needs a test set"):
        build_scenario(scenario(kind="factor", factor="f", pool="split"), 0, raw=fake_raw([0, 1]))
    with pytest.raises(ConfigError, match="client \\d .* no training samples"):
        build_scenario(scenario(kind="color", num_clients=4), 0, raw=fake_raw([0, 1, 0, 1, 0, 1]))


# ------------------------------------------------------------------------------ digit domains


@needs_real_data
def test_digit_domains_on_the_real_data():
    if REAL_DATA is None:
        pytest.fail("FEDSHIFT_DATA must point to the shared data folder when CI is set")
    ds = load_dataset("digit-domains", REAL_DATA, download=False, max_per_domain=200, seed=0)
    assert ds.x_train.shape == (600, 28, 28, 3) and ds.x_test.shape == (600, 28, 28, 3)
    assert np.bincount(ds.factors_train["domain"]).tolist() == [200, 200, 200]
    assert set(ds.y_train.tolist()) == set(range(10)) and ds.num_classes == 10
    grey = ds.x_train[ds.factors_train["domain"] < 2]
    assert (grey[..., 0] == grey[..., 2]).all()  # MNIST and USPS: grey repeated
    mm = ds.x_train[ds.factors_train["domain"] == 2]
    assert (mm[..., 0] != mm[..., 2]).any()  # MNIST-M: colour
    sub = load_dataset("digit-domains", REAL_DATA, download=False, domains=["usps"], size=16)
    assert sub.x_train.shape == (7291, 16, 16, 3) and set(sub.factors_test["domain"]) == {1}

    cfg = ScenarioConfig.model_validate(
        {
            "dataset": "digit-domains",
            "dataset_options": {"max_per_domain": 200},
            "num_clients": 6,
            "attributes": {"kind": "factor", "factor": "domain", "pool": "split", "train_ratio": 1.0, "test_ratio": 1.0},
        }
    )  # fmt: skip
    data = build_scenario(cfg, 0, data_dir=REAL_DATA)
    labels = [c.style.label() for c in data.clients]
    assert labels == ["domain mnist", "domain usps", "domain mnist-m"] * 2
    assert all(c.num_train == 100 and c.num_test == 100 for c in data.clients)  # halves


@needs_real_data
def test_two_colours_per_client_on_mnist():
    """The test bed on MNIST: every client's train split holds its two colours in equal shares,
    and the recorded colour is the one behind the digit (MNIST's corners are always blank)."""
    if REAL_DATA is None:
        pytest.fail("FEDSHIFT_DATA must point to the shared data folder when CI is set")
    cfg = ScenarioConfig.model_validate(
        {
            "dataset": "mnist",
            "num_clients": 10,
            "attributes": {"kind": "color", "colors_per_client": 2, "train_ratio": 0.05, "test_ratio": 0.05},
        }
    )  # fmt: skip
    data = build_scenario(cfg, 0, data_dir=REAL_DATA)
    att = data.meta["attributes"]
    for k, c in enumerate(data.clients):
        idx = c.train_idx.numpy()
        colors, counts = np.unique(att["color"][idx], return_counts=True)
        assert colors.tolist() == [k % 5, k % 5 + 5] and counts.tolist() == [175, 175]
        corner = data.x[idx, :, 0, 0].numpy().astype(int)
        assert (corner == np.stack([rgb255(j / 10) for j in att["color"][idx]])).all()


def test_missing_domain_file_is_one_line(no_data):
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("digit-domains", no_data, download=False, domains=["usps"])
    msg = str(err.value)
    assert "\n" not in msg and "usps_16x16.npz" in msg and str(no_data) in msg
    with pytest.raises(FedshiftError, match="domains must be"):
        load_dataset("digit-domains", no_data, domains=["svhn"])


# ------------------------------------------------------------------------------ offline-missing


@pytest.mark.parametrize(
    ("name", "opts", "clue"),
    [
        ("3dshapes", {}, "3dshapes.h5"),
        ("office-caltech10", {}, "amazon"),
        ("domainnet", {}, "clipart"),
        ("dsprites", {"source": "file"}, dsprites.FILE_NAME),
    ],
)
def test_missing_datasets_are_one_line_errors(no_data, name, opts, clue):
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(name, no_data, download=False, **opts)
    msg = str(err.value)
    assert "\n" not in msg and name in msg and str(no_data) in msg and clue in msg


def fake_3dshapes_labels(n: int, rng) -> np.ndarray:
    cols = [
        np.linspace(0, 0.9, 10), np.linspace(0, 0.9, 10), np.linspace(0, 0.9, 10),
        np.linspace(0.75, 1.25, 8), np.arange(4.0), np.linspace(-30, 30, 15),
    ]  # fmt: skip
    return np.stack([c[rng.integers(len(c), size=n)] for c in cols], axis=1)


def test_3dshapes_from_npz_and_h5(no_data):
    rng = np.random.default_rng(0)
    labels = fake_3dshapes_labels(50, rng)
    labels[:10, 3] = np.linspace(0.75, 1.25, 8)[[0, 1, 2, 3, 4, 5, 6, 7, 0, 1]]  # all 8 scales
    labels[:4, 4] = np.arange(4.0)
    images = rng.integers(0, 256, (50, 64, 64, 3), dtype=np.uint8)
    (no_data / "3dshapes").mkdir()
    np.savez(no_data / "3dshapes" / "3dshapes.npz", images=images, labels=labels)
    ds = load_dataset("3dshapes", no_data, size=32)
    assert ds.x_train.shape == (50, 32, 32, 3) and ds.num_classes == 4
    assert ds.classes == ("cube", "cylinder", "sphere", "capsule")
    assert (ds.y_train == labels[:, 4].astype(int)).all()
    assert (
        ds.factors_train["scale"]
        == np.searchsorted(np.linspace(0.75, 1.25, 8), labels[:, 3] - 1e-9)
    ).all()
    fw = ds.factors_train["floor_wall_hue"]
    assert (fw == ds.factors_train["floor_hue"] * 10 + ds.factors_train["wall_hue"]).all()
    assert abs(int(ds.x_train[0, 0, 0, 0]) - images[0, :2, :2, 0].mean()) <= 0.5
    (no_data / "3dshapes" / "3dshapes.npz").unlink()
    h5 = no_data / "3dshapes" / "3dshapes.h5"
    try:
        import h5py
    except ImportError:
        h5.write_bytes(b"not read")
        with pytest.raises(FedshiftError, match="pip install h5py") as err:
            load_dataset("3dshapes", no_data)
        assert "\n" not in str(err.value)
        return
    with h5py.File(h5, "w") as f:
        f["images"], f["labels"] = images, labels
    assert (load_dataset("3dshapes", no_data).x_train == images).all()


def write_domain_folder(root: Path, domains, classes, per: int) -> None:
    for d in domains:
        for c in classes:
            (root / d / c).mkdir(parents=True)
            for i in range(per):
                Image.new("RGB", (20, 12), (i * 20, 50, 100)).save(root / d / c / f"{i}.png")


def test_office_caltech_folders_split_80_20(no_data):
    root = no_data / "office-caltech10"
    write_domain_folder(root, ["amazon", "webcam"], ["mug", "bike"], per=5)
    ds = load_dataset("office-caltech10", no_data, size=16)
    assert ds.classes == ("bike", "mug") and ds.x_train.shape == (16, 16, 16, 3)
    assert len(ds.x_test) == 4 and sorted(set(ds.factors_train["domain"])) == [0, 3]
    assert np.bincount(ds.y_test).tolist() == [2, 2]  # stratified by (domain, class)
    one = load_dataset("office-caltech10", no_data, size=16, domains=["webcam"], classes=["mug"])
    assert len(one.y_train) == 4 and set(one.factors_train["domain"]) == {3}
    with pytest.raises(FedshiftError, match="no domain folder"):
        load_dataset("office-caltech10", no_data, domains=["dslr"])


def test_domainnet_uses_split_files(no_data):
    root = no_data / "domainnet"
    write_domain_folder(root, ["clipart"], ["zebra", "bird"], per=3)
    (root / "clipart_train.txt").write_text("clipart/zebra/0.png 1\nclipart/bird/1.png 0\n")
    (root / "clipart_test.txt").write_text("clipart/bird/2.png 0\n")
    ds = load_dataset("domainnet", no_data, size=8)
    assert ds.y_train.tolist() == [1, 0] and ds.y_test.tolist() == [0]
    assert set(ds.factors_test["domain"]) == {0} and ds.factor_value_name("domain", 4) == "real"


def test_a_run_on_an_attribute_scenario(tiny):
    from fedshift.run.experiment import run_experiment

    cfg = tiny(
        scenario={"dataset": "digits", "num_clients": 4, "attributes": {"kind": "color"}},
        model={"name": "convbn_cnn"},
        train={"rounds": 2, "batch_size": 16, "local_steps": 2, "participation": 0.5},
    )
    last = run_experiment(cfg).history[-1]
    assert "local_acc" in last and "global_acc" not in last
