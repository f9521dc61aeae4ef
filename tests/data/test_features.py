"""Tests for fedshift.data.features (corruptions, rotation, colour tints, feature styles)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from fedshift.core.errors import FedshiftError, UnknownNameError
from fedshift.data.features import (
    COLORS,
    CORRUPTION_POOLS,
    CORRUPTIONS,
    FeatureStyle,
    apply_corruption,
    apply_style,
    colorize,
    corruption_names,
    expand_styles,
    parse_style,
    rotate,
)
from tests.conftest import ALL_CORRUPTIONS

FMNIST_C = (
    "identity",
    "shot_noise",
    "impulse_noise",
    "glass_blur",
    "motion_blur",
    "shear",
    "scale",
    "rotate",
    "brightness",
    "translate",
    "stripe",
    "spatter",
    "dotted_line",
    "zigzag",
    "canny_edges",
)

CIFAR10_C = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
    "speckle_noise",
    "gaussian_blur",
    "spatter",
    "saturate",
)


def smooth_images(n: int, size: int, channels: int, seed: int = 0) -> np.ndarray:
    """Smooth random patterns in [10, 245], uint8 [n, size, size, channels]."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, size, size, channels))
    z = ndimage.gaussian_filter(z, sigma=(0, size / 8, size / 8, 0), mode="wrap")
    lo = z.min(axis=(1, 2, 3), keepdims=True)
    hi = z.max(axis=(1, 2, 3), keepdims=True)
    return np.rint((z - lo) / (hi - lo) * 235 + 10).astype(np.uint8)


BATCHES = {
    "gray28": smooth_images(6, 28, 1, seed=1),
    "rgb32": smooth_images(6, 32, 3, seed=2),
    "rgb16": smooth_images(6, 16, 3, seed=3),
    "rgb64": smooth_images(3, 64, 3, seed=4),
}


def distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


def test_names() -> None:
    assert corruption_names() == ALL_CORRUPTIONS
    assert list(CORRUPTIONS) == ALL_CORRUPTIONS
    assert set(CIFAR10_C) | set(FMNIST_C) == set(ALL_CORRUPTIONS)  # each in a pool


@pytest.mark.parametrize("batch", ["gray28", "rgb32"])
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruption_contract(name: str, batch: str) -> None:
    images = BATCHES[batch]
    before = images.copy()
    for severity in range(1, 6):
        out = apply_corruption(images, name, severity, np.random.default_rng(7))
        assert out.shape == images.shape
        assert out.dtype == np.uint8
        again = apply_corruption(images, name, severity, np.random.default_rng(7))
        np.testing.assert_array_equal(out, again)
        np.testing.assert_array_equal(images, before)  # input untouched


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_severity_monotonic(name: str, batch: str) -> None:
    images = BATCHES[batch]
    dists = [
        distance(apply_corruption(images, name, s, np.random.default_rng(3)), images)
        for s in range(1, 6)
    ]
    for lo, hi in zip(dists, dists[1:], strict=False):
        assert hi >= lo - 0.5, f"{name} on {batch}: {dists}"
    if name == "identity":  # the "no corruption" member: distance 0 by design
        assert dists == [0.0] * 5
        return
    assert dists[-1] > 0.5, f"{name} on {batch} barely changes the images: {dists}"


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_tiny_images(name: str, channels: int) -> None:
    images = smooth_images(3, 8, channels, seed=5)
    for severity in range(1, 6):
        out = apply_corruption(images, name, severity, np.random.default_rng(0))
        assert out.shape == images.shape and out.dtype == np.uint8


def test_empty_batch() -> None:
    images = np.zeros((0, 28, 28, 1), dtype=np.uint8)
    out = apply_corruption(images, "fog", 3, np.random.default_rng(0))
    assert out.shape == images.shape


def test_seed_matters() -> None:
    images = BATCHES["rgb32"]
    a = apply_corruption(images, "gaussian_noise", 3, np.random.default_rng(0))
    b = apply_corruption(images, "gaussian_noise", 3, np.random.default_rng(1))
    assert not np.array_equal(a, b)


def test_corruption_errors() -> None:
    images = BATCHES["gray28"]
    rng = np.random.default_rng(0)
    with pytest.raises(UnknownNameError):
        apply_corruption(images, "not_a_corruption", 1, rng)
    for bad in (0, 6, -1, 2.5, True):
        with pytest.raises(FedshiftError):
            apply_corruption(images, "fog", bad, rng)  # type: ignore[arg-type]
    assert apply_corruption(images, "fog", np.int64(2), rng).shape == images.shape
    with pytest.raises(ValueError):
        apply_corruption(images.astype(np.float32), "fog", 1, rng)
    with pytest.raises(ValueError):
        apply_corruption(images[..., 0], "fog", 1, rng)


def test_saturate_grayscale_is_tone_stretch() -> None:
    images = BATCHES["gray28"]
    out = apply_corruption(images, "saturate", 5, np.random.default_rng(0)).astype(int)
    x = images.astype(int)
    # values move away from mid-grey (or stay clipped at the ends)
    assert np.all(np.abs(out - 127.5) >= np.abs(x - 127.5) - 1)


def test_rotate() -> None:
    for images in (BATCHES["gray28"], BATCHES["rgb32"]):
        np.testing.assert_array_equal(rotate(images, 0), images)
        np.testing.assert_array_equal(rotate(images, 360), images)
        assert distance(rotate(images, 359.9), images) < 2.0
        for angle, k in ((90, 1), (180, 2), (270, 3), (-90, -1)):
            np.testing.assert_array_equal(rotate(images, angle), np.rot90(images, k, axes=(1, 2)))
        out = rotate(images, 45)
        assert out.shape == images.shape and out.dtype == np.uint8
        assert np.all(out[:, 0, 0] == 0)  # corners come from outside: black
        back = rotate(out, -45)
        h = images.shape[1]
        inner = slice(h // 4, 3 * h // 4)
        assert distance(back[:, inner, inner], images[:, inner, inner]) < 3.0


def test_rotate_does_not_modify_input() -> None:
    images = BATCHES["rgb32"]
    before = images.copy()
    rotate(images, 30)
    rotate(images, 0)
    np.testing.assert_array_equal(images, before)


def test_colorize() -> None:
    gray = BATCHES["gray28"]
    red = colorize(gray, "red")
    assert red.shape == (*gray.shape[:3], 3) and red.dtype == np.uint8
    assert red[..., 1:].max() == 0
    np.testing.assert_array_equal(red[..., 0], gray[..., 0])
    np.testing.assert_array_equal(colorize(gray, "white"), np.repeat(gray, 3, axis=-1))
    rgb = BATCHES["rgb32"]
    np.testing.assert_array_equal(colorize(rgb, "white"), rgb)
    blue = colorize(rgb, (0, 0, 255))
    assert blue[..., :2].max() == 0
    np.testing.assert_array_equal(blue[..., 2], rgb[..., 2])
    half = colorize(gray, (128, 128, 128)).astype(int)
    assert np.abs(half[..., 0] - gray[..., 0].astype(int) * 128 / 255).max() <= 0.5
    assert set(COLORS) >= {"red", "green", "blue", "yellow", "cyan", "magenta", "white"}
    with pytest.raises(UnknownNameError):
        colorize(gray, "pink")
    with pytest.raises(FedshiftError):
        colorize(gray, (300, 0, 0))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("clean", FeatureStyle(kind="clean", name="clean")),
        ("fog", FeatureStyle(kind="corruption", name="fog")),
        ("fog/3", FeatureStyle(kind="corruption", name="fog", severity=3)),
        (" Gaussian_Noise/5 ", FeatureStyle(kind="corruption", name="gaussian_noise", severity=5)),
        ("rotate:90", FeatureStyle(kind="rotate", name="rotate", angle=90.0)),
        ("rotate:-22.5", FeatureStyle(kind="rotate", name="rotate", angle=-22.5)),
        ("rotate(45)", FeatureStyle(kind="rotate", name="rotate", angle=45.0)),
        ("rotate", FeatureStyle(kind="corruption", name="rotate")),
        ("rotate/3", FeatureStyle(kind="corruption", name="rotate", severity=3)),
        (" Rotate / 2 ", FeatureStyle(kind="corruption", name="rotate", severity=2)),
        ("color:red", FeatureStyle(kind="color", name="red")),
        ("color(purple)", FeatureStyle(kind="color", name="purple")),
    ],
)
def test_parse_style_round_trip(spec: str, expected: FeatureStyle) -> None:
    style = parse_style(spec)
    assert style == expected
    assert parse_style(style.label()) == style


def test_style_labels() -> None:
    assert parse_style("clean").label() == "clean"
    assert parse_style("fog/3").label() == "fog/3"
    assert parse_style("fog").label() == "fog"
    assert parse_style("rotate:90").label() == "rotate(90)"
    assert parse_style("rotate:22.5").label() == "rotate(22.5)"
    assert parse_style("color:red").label() == "color(red)"
    assert parse_style("rotate").label() == "rotate"
    assert parse_style("rotate/3").label() == "rotate/3"
    assert parse_style("rotate(30)").label() == "rotate(30)"
    for name in CORRUPTIONS:
        assert parse_style(f"{name}/2") == FeatureStyle(kind="corruption", name=name, severity=2)


def test_parse_style_errors() -> None:
    with pytest.raises(UnknownNameError) as err:
        parse_style("sparkle/2")
    assert err.value.kind == "feature style"
    with pytest.raises(UnknownNameError):
        parse_style("sparkle")
    with pytest.raises(UnknownNameError):
        parse_style("color:pink")
    for bad in ("fog/0", "fog/6", "fog/x", "fog/", "rotate:abc", "rotate:", "rotate:inf"):
        with pytest.raises(FedshiftError):
            parse_style(bad)
    with pytest.raises(FedshiftError):
        FeatureStyle(kind="weird", name="x")


def test_apply_style() -> None:
    images = BATCHES["gray28"]
    rng = np.random.default_rng(0)
    clean = apply_style(images, parse_style("clean"), rng)
    np.testing.assert_array_equal(clean, images)
    assert clean is not images
    fog = apply_style(images, parse_style("fog/2"), np.random.default_rng(4))
    np.testing.assert_array_equal(fog, apply_corruption(images, "fog", 2, np.random.default_rng(4)))
    np.testing.assert_array_equal(
        apply_style(images, parse_style("rotate:90"), rng), rotate(images, 90)
    )
    tinted = apply_style(images, parse_style("color:green"), rng)
    assert tinted.shape == (*images.shape[:3], 3)
    np.testing.assert_array_equal(tinted, colorize(images, "green"))
    with pytest.raises(FedshiftError):
        apply_style(images, parse_style("fog"), rng)  # severity not chosen yet


# --------------------------------------------------------------------------------------------
# pools and the newer corruptions


def test_corruption_pools() -> None:
    assert set(CORRUPTION_POOLS) == {"fmnist-c", "cifar10-c"}
    assert CORRUPTION_POOLS["fmnist-c"] == FMNIST_C
    assert CORRUPTION_POOLS["cifar10-c"] == CIFAR10_C
    assert len(CORRUPTION_POOLS["fmnist-c"]) == 15
    assert len(CORRUPTION_POOLS["cifar10-c"]) == 19
    for members in CORRUPTION_POOLS.values():
        assert len(set(members)) == len(members)
        assert set(members) <= set(CORRUPTIONS)


def test_expand_styles() -> None:
    assert expand_styles([]) == []
    # "all": every corruption but identity (which is no corruption)
    assert expand_styles(["all"]) == [c for c in CORRUPTIONS if c != "identity"]
    assert expand_styles(["fmnist-c"]) == list(FMNIST_C)
    assert expand_styles([" CIFAR10-C "]) == list(CIFAR10_C)
    specs = ["fog/2", "fmnist-c", "rotate:30", "color:red", "clean", "rotate"]
    assert expand_styles(specs) == ["fog/2", *FMNIST_C, "rotate:30", "color:red", "clean", "rotate"]
    for spec in expand_styles(["all", "fmnist-c", "cifar10-c"]):
        assert parse_style(spec).kind == "corruption"
    # unknown pool-like names are left alone and fail clearly in parse_style
    assert expand_styles(["mnist-c", "all-c"]) == ["mnist-c", "all-c"]
    with pytest.raises(UnknownNameError) as err:
        parse_style("mnist-c")
    assert err.value.kind == "feature style"


def test_identity_returns_the_image() -> None:
    for images in (BATCHES["gray28"], BATCHES["rgb32"]):
        for severity in range(1, 6):
            out = apply_corruption(images, "identity", severity, np.random.default_rng(0))
            np.testing.assert_array_equal(out, images)
            assert out is not images


def test_rotate_corruption_is_fixed_rotation_up_to_sign() -> None:
    images = np.concatenate([BATCHES["gray28"], smooth_images(10, 28, 1, seed=9)])
    signs = []
    for severity, angle in enumerate([8, 16, 24, 32, 40], start=1):
        out = apply_corruption(images, "rotate", severity, np.random.default_rng(5))
        plus, minus = rotate(images, angle), rotate(images, -angle)
        level = []
        for i in range(len(images)):
            if np.array_equal(out[i], plus[i]):
                level.append(1)
            else:
                np.testing.assert_array_equal(out[i], minus[i])
                level.append(-1)
        signs.append(level)
    assert all(level == signs[0] for level in signs)  # one sign per image at every level
    assert set(signs[0]) == {-1, 1}


def test_canny_edges() -> None:
    images = np.zeros((2, 28, 28, 1), dtype=np.uint8)
    images[0, 8:20, 8:20] = 200  # a square
    images[1, :, 14:] = 120  # a vertical step
    out = apply_corruption(images, "canny_edges", 5, np.random.default_rng(0))
    assert set(np.unique(out)) == {0, 255}  # the edge map itself: two-valued
    edges = out[..., 0] == 255
    ring = np.zeros((28, 28), dtype=bool)
    ring[6:22, 6:22] = True
    ring[10:18, 10:18] = False
    assert edges[0].any() and not edges[0][~ring].any()  # only near the square's border
    for side in (edges[0, 6:10, 8:20], edges[0, 18:22, 8:20]):  # top and bottom sides
        assert side.any(axis=0).all()
    assert edges[1].any() and not edges[1][:, :12].any() and not edges[1][:, 17:].any()
    assert (edges[1, 1:-1].sum(axis=1) == 1).all()  # non-maximum suppression: one pixel thin
    assert not edges[1, [0, -1]].any()  # as skimage's canny: no edges on the image's frame
    for i in range(len(images)):  # each image on its own (nothing leaks across the batch)
        alone = apply_corruption(images[i : i + 1], "canny_edges", 5, np.random.default_rng(0))
        np.testing.assert_array_equal(alone[0], out[i])
    # RGB: edges of the luminance, the same in every channel; lower severities blend them in
    rgb = BATCHES["rgb32"]
    top = apply_corruption(rgb, "canny_edges", 5, np.random.default_rng(1))
    assert set(np.unique(top)) == {0, 255}
    assert np.array_equal(top[..., 0], top[..., 1]) and np.array_equal(top[..., 1], top[..., 2])
    assert 0 < (top == 255).mean() < 0.5  # edges are a minority of the pixels
    dists = []
    for severity, c in enumerate([0.2, 0.4, 0.6, 0.8, 1.0], start=1):
        o = apply_corruption(rgb, "canny_edges", severity, np.random.default_rng(0))
        blend = (1 - c) * rgb.astype(np.float64) + c * top.astype(np.float64)
        assert np.abs(o - blend).max() <= 1.0
        dists.append(distance(o, rgb))
    assert all(hi > lo + 5 for lo, hi in zip(dists, dists[1:], strict=False)), dists


@pytest.mark.parametrize("name", ["snow", "frost"])
@pytest.mark.parametrize("batch", ["gray28", "rgb32"])
def test_snow_and_frost_brighten(name: str, batch: str) -> None:
    images = BATCHES[batch]
    outs = [apply_corruption(images, name, s, np.random.default_rng(2)) for s in range(1, 6)]
    means = [float(o.astype(np.float64).mean()) for o in outs]
    assert all(m > float(images.mean()) + 5 for m in means), means
    dists = [distance(o, images) for o in outs]
    assert all(hi > lo + 1 for lo, hi in zip(dists, dists[1:], strict=False)), dists
    other = apply_corruption(images, name, 3, np.random.default_rng(3))
    assert not np.array_equal(other, outs[2])  # the snow / frost layer comes from rng
    if name == "snow":  # same flakes at every level: the result only grows pixel by pixel
        for lo, hi in zip(outs, outs[1:], strict=False):
            assert np.all(hi.astype(int) >= lo.astype(int) - 1)
