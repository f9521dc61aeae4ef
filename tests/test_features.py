"""Tests for fedshift.data.features (corruptions, rotation, colour tints, feature styles)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from fedshift.data.features import (
    COLORS,
    CORRUPTIONS,
    FeatureStyle,
    apply_corruption,
    apply_style,
    colorize,
    corruption_names,
    parse_style,
    rotate,
)
from fedshift.errors import FedshiftError, UnknownNameError

REQUIRED = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "speckle_noise",
    "defocus_blur",
    "gaussian_blur",
    "motion_blur",
    "zoom_blur",
    "glass_blur",
    "fog",
    "brightness",
    "contrast",
    "saturate",
    "pixelate",
    "jpeg_compression",
    "elastic_transform",
    "spatter",
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
    assert set(REQUIRED) <= set(CORRUPTIONS)
    assert corruption_names() == list(CORRUPTIONS)
    assert len(set(CORRUPTIONS)) == len(CORRUPTIONS)


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
