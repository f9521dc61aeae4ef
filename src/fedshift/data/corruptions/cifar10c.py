"""The CIFAR-10-C corruptions (Hendrycks & Dietterich, 2019): noise, blur, weather, digital.

Each registers itself in :data:`~fedshift.data.corruptions.CORRUPTION_FUNCS`; the order of the
definitions is the order of ``CORRUPTIONS``, so keep it. See :mod:`fedshift.data.corruptions`
for the conventions.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image
from scipy import ndimage, sparse

from fedshift.data.corruptions.ops import (
    LUMA,
    apply_spatial,
    bilinear_sample,
    colour_value,
    hsv_to_rgb,
    interp_matrix,
    pixel_scale,
    resample_axis,
    rgb_to_hsv,
    spatial_gaussian,
    to_float,
    to_uint8,
)
from fedshift.data.corruptions.registry import CORRUPTION_FUNCS

# --------------------------------------------------------------------------------------------
# noise


@CORRUPTION_FUNCS.register("gaussian_noise")
def _gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Additive Gaussian noise; std [.04, .06, .08, .09, .10] (CIFAR-10-C)."""
    c = [0.04, 0.06, 0.08, 0.09, 0.10][severity - 1]
    return x + np.float32(c) * rng.standard_normal(x.shape, dtype=np.float32)


@CORRUPTION_FUNCS.register("shot_noise")
def _shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson noise ``poisson(x * c) / c``; c [500, 250, 100, 75, 50] (CIFAR-10-C)."""
    c = [500, 250, 100, 75, 50][severity - 1]
    return (rng.poisson(x.astype(np.float64) * c) / c).astype(np.float32)


@CORRUPTION_FUNCS.register("impulse_noise")
def _impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Salt-and-pepper noise on a fraction [.01, .02, .03, .05, .07] of the values (CIFAR-10-C)."""
    amount = [0.01, 0.02, 0.03, 0.05, 0.07][severity - 1]
    hit = rng.random(x.shape, dtype=np.float32) < amount
    salt = rng.random(x.shape, dtype=np.float32) < 0.5
    return np.where(hit, salt.astype(np.float32), x)


@CORRUPTION_FUNCS.register("speckle_noise")
def _speckle_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative noise ``x + x * N(0, c)``; c [.06, .1, .12, .16, .2] (CIFAR-10-C)."""
    c = [0.06, 0.1, 0.12, 0.16, 0.2][severity - 1]
    return x + x * np.float32(c) * rng.standard_normal(x.shape, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# blur


def _disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    half = int(math.ceil(radius)) + 1
    yy, xx = np.mgrid[-half : half + 1, -half : half + 1]
    disk = (yy**2 + xx**2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    smooth = ndimage.gaussian_filter(disk, sigma=alias_blur, mode="constant", truncate=2.0)
    return smooth / smooth.sum()


@CORRUPTION_FUNCS.register("defocus_blur")
def _defocus_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Convolution with an anti-aliased disk; (radius, alias sigma) from CIFAR-10-C.

    Table: (.3, .4), (.4, .5), (.5, .6), (1, .2), (1.5, .1). The radius scales with the image
    size above 32 px; the anti-aliasing sigma is about the pixel grid and does not. Borders are
    mirrored without repeating the edge pixel, as OpenCV's ``filter2D`` default (CIFAR-10-C).
    """
    radius, alias = [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)][severity - 1]
    kernel = _disk_kernel(radius * pixel_scale(x), alias).astype(np.float32)
    return ndimage.convolve(x, kernel[None, :, :, None], mode="mirror")


@CORRUPTION_FUNCS.register("gaussian_blur")
def _gaussian_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur; sigma [.4, .6, .7, .8, 1] (CIFAR-10-C)."""
    sigma = [0.4, 0.6, 0.7, 0.8, 1.0][severity - 1] * pixel_scale(x)
    return spatial_gaussian(x, sigma)


def _motion_kernel(sigma: float, radius: float, angle: float) -> np.ndarray:
    """One-sided line kernel of ImageMagick's motion blur along ``angle`` degrees.

    As ImageMagick's ``MotionBlurImage`` (used by CIFAR-10-C): ``width = 2 * ceil(radius) + 1``
    taps ``i = 0, 1, ...`` with Gaussian weights ``exp(-i**2 / (2 sigma**2))`` (normalised), and
    each output pixel averages the input at the whole-pixel offsets
    ``ceil(i * (cos, sin)(angle) - .5)`` (columns, rows; rows point down), so the blur trails the
    image content towards ``angle + 180`` degrees.
    """
    width = 2 * int(math.ceil(radius)) + 1
    i = np.arange(width, dtype=np.float64)
    weights = np.exp(-(i**2) / (2 * sigma**2))
    weights /= weights.sum()
    theta = math.radians(angle)
    px, py = width * math.sin(theta), width * math.cos(theta)  # ImageMagick's arithmetic
    off_x = np.ceil(i * py / math.hypot(px, py) - 0.5).astype(np.intp)
    off_y = np.ceil(i * px / math.hypot(px, py) - 0.5).astype(np.intp)
    kernel = np.zeros((2 * width + 1, 2 * width + 1))
    # ndimage.convolve flips the kernel: a weight at -(off_y, off_x) reads the input at +(...)
    np.add.at(kernel, (width - off_y, width - off_x), weights)
    return kernel


@CORRUPTION_FUNCS.register("motion_blur")
def _motion_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Motion blur along a random angle in [-45, 45] degrees per image (ImageMagick's).

    (radius, sigma) from CIFAR-10-C: (6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5); the kernel is
    ImageMagick's one-sided Gaussian line (:func:`_motion_kernel`). Levels 3 and 4 share sigma 2
    and differ only in the radius, i.e. in extra taps of weight below 1e-9: as in CIFAR-10-C
    they are the same blur (a published table kept although not strictly monotonic). Angles
    are rounded to whole degrees so that images sharing one are convolved together.
    """
    radius, sigma = [(6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5)][severity - 1]
    k = pixel_scale(x)
    angles = np.rint(rng.uniform(-45.0, 45.0, size=x.shape[0])).astype(int)
    return _blur_along(x, angles, sigma * k, radius * k)


def _blur_along(x: np.ndarray, angles: np.ndarray, sigma: float, radius: float) -> np.ndarray:
    """Motion-blur each image of ``x`` along its whole-degree angle ``angles`` [N] (int)."""
    out = np.empty_like(x)
    for angle in np.unique(angles):
        idx = np.flatnonzero(angles == angle)
        kernel = _motion_kernel(sigma, radius, float(angle)).astype(np.float32)
        out[idx] = ndimage.convolve(x[idx], kernel[None, :, :, None], mode="nearest")
    return out


@CORRUPTION_FUNCS.register("zoom_blur")
def _zoom_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Average of the image and copies zoomed in about the centre by 1, 1.01, ..., z_max.

    z_max [1.06, 1.11, 1.15, 1.20, 1.25]: CIFAR-10-C's factors ``np.arange(1, stop, 0.01)`` with
    stop [1.06, 1.11, 1.16, 1.21, 1.26], whose floating-point lengths are 7, 12, 16, 21 and 26.
    """
    steps = [7, 12, 16, 21, 26][severity - 1]
    h, w = x.shape[1], x.shape[2]
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    op = sparse.identity(h * w, dtype=np.float32, format="csr")
    for z in 1.0 + 0.01 * np.arange(steps):
        rows = interp_matrix(cy + (np.arange(h) - cy) / z, h)
        cols = interp_matrix(cx + (np.arange(w) - cx) / z, w)
        op = op + sparse.kron(rows, cols, format="csr")
    return apply_spatial(x, op / np.float32(steps + 1))


@CORRUPTION_FUNCS.register("glass_blur")
def _glass_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur, local pixel shuffling, Gaussian blur again; own monotonic table.

    (sigma, max_delta, iterations): (.4, 1, 1), (.4, 1, 2), (.45, 1, 3), (.5, 1, 4), (.5, 1, 5).
    Each pixel is swapped with a random neighbour at most ``max_delta`` away (scanning from the
    bottom-right, as in CIFAR-10-C); the scan loops over pixels and is vectorised over the batch.
    In the CIFAR-10-C table more blur smooths the shuffling away, so its distance from the clean
    image goes down at levels 2-3 and 5; here the shuffling grows with the level instead.
    The offsets of iteration ``i`` are the same at every level that has ``i`` iterations.
    """
    sigma, delta, iters = [(0.4, 1, 1), (0.4, 1, 2), (0.45, 1, 3), (0.5, 1, 4), (0.5, 1, 5)][
        severity - 1
    ]
    k = pixel_scale(x)
    sigma *= k
    delta = max(1, round(delta * k))
    n, h, w, ch = x.shape
    hs = np.arange(h - 1 - delta, delta - 1, -1)
    ws = np.arange(w - 1 - delta, delta - 1, -1)
    pos = (hs[:, None] * w + ws[None, :]).ravel()  # scan order
    # apply the swaps to a permutation [H*W, N] (one column per image), then gather once
    perm = np.repeat(np.arange(h * w, dtype=np.intp)[:, None], n, axis=1)
    flat = perm.reshape(-1)
    batch = np.arange(n, dtype=np.intp)
    for _ in range(iters):
        offsets = rng.integers(-delta, delta + 1, size=(len(pos), 2, n), dtype=np.int8)
        for p, (dy, dx) in zip(pos, offsets, strict=True):
            idx = (p + dy.astype(np.intp) * w + dx) * n + batch
            cur = perm[p].copy()
            perm[p] = flat[idx]
            flat[idx] = cur
    y = spatial_gaussian(x, sigma).reshape(n, h * w, ch)
    y = np.take_along_axis(y, perm.T[:, :, None], axis=1).reshape(n, h, w, ch)
    return spatial_gaussian(y, sigma)


# --------------------------------------------------------------------------------------------
# weather


def _zoom_centre(x: np.ndarray, z: float) -> np.ndarray:
    """Zoom ``x`` [N,H,W,C] in about the centre by ``z`` >= 1 (bilinear, same size)."""
    h, w = x.shape[1], x.shape[2]
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    ys = cy + (np.arange(h) - cy) / z
    xs = cx + (np.arange(w) - cx) / z
    return resample_axis(resample_axis(x, ys, 1, "nearest"), xs, 2, "nearest")


@CORRUPTION_FUNCS.register("snow")
def _snow(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Falling snow: the image greyed and brightened, plus motion-blurred flakes; own table.

    A Gaussian noise field is zoomed in by 1.5 (times size/32 above 32 px) so that flakes span
    a few pixels, normalised per image and thresholded at ``t`` (in field std): a flake pixel has
    value ``.6 + .2 * (field - t)`` (at most 1). The flakes are motion-blurred along one random
    angle in [-135, -45] degrees per image (ImageMagick's kernel, :func:`_motion_kernel`, of
    sigma 1.5 px and radius 6 px) and added twice, once rotated by 180 degrees, as in
    CIFAR-10-C. The image itself becomes ``m * x + (1 - m) * max(x, 1.5 * luminance + .5)``.
    Table (t, m): (2.2, .95), (2, .9), (1.8, .85), (1.6, .8), (1.4, .75). The field, zoom, blur
    and angle are the same at every level, so the result only grows pixel by pixel with the
    level (nested, monotonic distance). The CIFAR-10-C table also changes the zoom and blur per
    level and is not monotonic.
    """
    t, m = [(2.2, 0.95), (2.0, 0.9), (1.8, 0.85), (1.6, 0.8), (1.4, 0.75)][severity - 1]
    n, h, w, ch = x.shape
    k = pixel_scale(x)
    field = _zoom_centre(rng.standard_normal((n, h, w, 1), dtype=np.float32), 1.5 * k)
    angles = np.rint(rng.uniform(-135.0, -45.0, size=n)).astype(int)
    mean = field.mean(axis=(1, 2, 3), keepdims=True)
    std = field.std(axis=(1, 2, 3), keepdims=True)
    field = (field - mean) / np.maximum(std, 1e-6)
    flakes = np.where(field >= t, np.minimum(0.6 + 0.2 * (field - t), 1.0), 0.0)
    flakes = _blur_along(flakes.astype(np.float32), angles, 1.5 * k, 6.0 * k)
    flakes = flakes + flakes[:, ::-1, ::-1]
    gray = x if ch == 1 else (x @ LUMA)[..., None]
    base = np.float32(m) * x + np.float32(1 - m) * np.maximum(x, 1.5 * gray + 0.5)
    return base + flakes


def _frost_texture(n: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Procedural frost [n, H, W, 1] in [0, 1]: crystal-like veins over a patchy ice haze.

    Two rough plasma fractals (decay 1.5) give the veins: bright thin ridges along their
    mid-level contours, ``(1 - |2 p - 1|) ** 6``, which wander and branch like ice crystals;
    a smoother one (decay 2) gives the haze. The sum ``.45 haze + .8 veins`` is sharpened with
    an unsharp mask (sigma 1 px, times size/32 above 32 px) and clipped.
    """
    size = max(h, w)
    rough = _plasma_fractal(2 * n, size, 1.5, rng).reshape(2, n, size, size)[:, :, :h, :w]
    haze = _plasma_fractal(n, size, 2.0, rng)[:, :h, :w]
    veins = ((1 - np.abs(2 * rough - 1)) ** 6).max(axis=0)
    tex = (0.45 * haze + 0.8 * veins)[..., None]
    sigma = max(1.0, min(h, w) / 32.0)
    tex = tex + (tex - ndimage.gaussian_filter(tex, sigma=(0, sigma, sigma, 0), mode="wrap"))
    return np.clip(tex, 0, 1).astype(np.float32)


@CORRUPTION_FUNCS.register("frost")
def _frost(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Frost on the lens: ``a * x + b * frost`` with a procedural frost texture; own table.

    CIFAR-10-C blends crops of frost photographs, which are not available offline; here the
    frost is a procedural texture drawn from ``rng`` (see :func:`_frost_texture`), tinted ice
    blue (215, 235, 255) (its luminance for grayscale). It is not the published frost images,
    so results differ from CIFAR-10-C's frost. Table (a, b): (1, .2), (.95, .3), (.9, .4),
    (.85, .5), (.8, .6) -- the frost grows faster than the image fades, so the distance from
    the clean image grows and the image brightens on average. The texture is the same at
    every level.
    """
    a, b = [(1.0, 0.2), (0.95, 0.3), (0.9, 0.4), (0.85, 0.5), (0.8, 0.6)][severity - 1]
    n, h, w, _ = x.shape
    frost = _frost_texture(n, h, w, rng) * colour_value(x, (215, 235, 255))
    return np.float32(a) * x + np.float32(b) * frost


def _plasma_fractal(n: int, size: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` diamond-square plasma fractals [n, size, size] in [0, 1] (wrap-around grid).

    Each finer octave has ``decay**2`` times less random amplitude than the previous one. The
    number of random draws depends only on ``n`` and ``size``.
    """
    m = 1 << max(1, math.ceil(math.log2(max(size, 2))))
    grid = np.zeros((n, m, m))
    step, amp = m, 1.0
    while step >= 2:
        half = step // 2
        cells = m // step
        noise = rng.uniform(-amp, amp, size=(3, n, cells, cells))
        corners = grid[:, ::step, ::step]
        right, down = np.roll(corners, -1, axis=2), np.roll(corners, -1, axis=1)
        diag = np.roll(down, -1, axis=2)
        grid[:, half::step, half::step] = (corners + right + down + diag) / 4 + noise[0]
        centres = grid[:, half::step, half::step]
        above, left = np.roll(centres, 1, axis=1), np.roll(centres, 1, axis=2)
        grid[:, ::step, half::step] = (corners + right + centres + above) / 4 + noise[1]
        grid[:, half::step, ::step] = (corners + down + centres + left) / 4 + noise[2]
        step, amp = half, amp / decay**2
    grid = grid[:, :size, :size]
    lo = grid.min(axis=(1, 2), keepdims=True)
    hi = grid.max(axis=(1, 2), keepdims=True)
    return ((grid - lo) / np.maximum(hi - lo, 1e-12)).astype(np.float32)


@CORRUPTION_FUNCS.register("fog")
def _fog(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add ``c * plasma`` and rescale by ``max / (max + c)``; (c, decay) from CIFAR-10-C.

    Table: (.2, 3), (.5, 3), (.75, 2.5), (1, 2), (1.5, 1.75).
    """
    c, decay = [(0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75)][severity - 1]
    n, h, w, _ = x.shape
    plasma = _plasma_fractal(n, max(h, w), decay, rng)[:, :h, :w, None]
    top = x.max(axis=(1, 2, 3), keepdims=True)
    return (x + np.float32(c) * plasma) * top / (top + np.float32(c))


# --------------------------------------------------------------------------------------------
# digital / photometric


@CORRUPTION_FUNCS.register("brightness")
def _brightness(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add c [.05, .1, .15, .2, .3] to the HSV value (CIFAR-10-C; grey level for grayscale)."""
    c = np.float32([0.05, 0.1, 0.15, 0.2, 0.3][severity - 1])
    if x.shape[-1] == 1:
        return x + c
    h, s, v = rgb_to_hsv(x)
    return hsv_to_rgb(h, s, np.clip(v + c, 0, 1))


@CORRUPTION_FUNCS.register("contrast")
def _contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Pull towards the mean: ``(x - mean) * c + mean``; c [.75, .5, .4, .3, .15].

    (CIFAR-10-C values.) As in CIFAR-10-C the mean is per image and per channel.
    """
    c = np.float32([0.75, 0.5, 0.4, 0.3, 0.15][severity - 1])
    mean = x.mean(axis=(1, 2), keepdims=True)
    return (x - mean) * c + mean


@CORRUPTION_FUNCS.register("saturate")
def _saturate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Over-saturation ``s * a + b`` in HSV; own monotonic table (a, b).

    Table: (1.3, 0), (1.6, 0), (2, .1), (2.5, .2), (3, .3). CIFAR-10-C de-saturates at levels 1-2
    and over-saturates at 3-5, which is not monotonic in distance from the clean image; here
    every level over-saturates more than the previous one. Grayscale images have no saturation:
    their tones are stretched away from mid-grey by ``a`` instead (``.5 + (x - .5) * a``).
    """
    a, b = [(1.3, 0.0), (1.6, 0.0), (2.0, 0.1), (2.5, 0.2), (3.0, 0.3)][severity - 1]
    if x.shape[-1] == 1:
        return np.float32(0.5) + (x - np.float32(0.5)) * np.float32(a)
    h, s, v = rgb_to_hsv(x)
    return hsv_to_rgb(h, np.clip(s * a + b, 0, 1), v)


@CORRUPTION_FUNCS.register("pixelate")
def _pixelate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Box-downsample to a fraction [.95, .9, .85, .75, .65] of the size, nearest-upsample."""
    frac = [0.95, 0.9, 0.85, 0.75, 0.65][severity - 1]
    u8 = to_uint8(x)
    n, h, w, ch = u8.shape
    small = (max(1, int(w * frac)), max(1, int(h * frac)))
    out = np.empty_like(u8)
    for i in range(n):
        img = Image.fromarray(u8[i, ..., 0] if ch == 1 else u8[i])
        img = img.resize(small, Image.Resampling.BOX).resize((w, h), Image.Resampling.NEAREST)
        out[i] = np.asarray(img).reshape(h, w, ch)
    return to_float(out)


@CORRUPTION_FUNCS.register("jpeg_compression")
def _jpeg_compression(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """JPEG encode/decode (Pillow) at quality [80, 65, 58, 50, 40] (CIFAR-10-C)."""
    quality = [80, 65, 58, 50, 40][severity - 1]
    u8 = to_uint8(x)
    n, h, w, ch = u8.shape
    out = np.empty_like(u8)
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(u8[i, ..., 0] if ch == 1 else u8[i]).save(buf, "JPEG", quality=quality)
        buf.seek(0)
        out[i] = np.asarray(Image.open(buf)).reshape(h, w, ch)
    return to_float(out)


@CORRUPTION_FUNCS.register("elastic_transform")
def _elastic_transform(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Random affine jitter plus a smooth random displacement field; own monotonic table.

    The three affine control points move by up to ``d`` pixels and the elastic field (uniform
    noise smoothed by a Gaussian of sigma 1.5 px) has an RMS of ``d / 2`` pixels, with
    d [.6, .9, 1.2, 1.6, 2] px (times size/32 above 32 px). Sampling is bilinear with reflected
    borders. The CIFAR-10-C table trades affine for elastic strength across levels and is not
    monotonic in distance from the clean image; here the whole displacement scales with ``d``.
    """
    d = [0.6, 0.9, 1.2, 1.6, 2.0][severity - 1] * pixel_scale(x)
    n, h, w, _ = x.shape
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    sq = max(1, min(h, w) // 3)
    pts = np.array([[cy + sq, cx + sq, 1.0], [cy + sq, cx - sq, 1.0], [cy - sq, cx - sq, 1.0]])
    jitter = rng.uniform(-1.0, 1.0, size=(n, 3, 2))  # displacement of each control point
    field = rng.uniform(-1.0, 1.0, size=(2, n, h, w)).astype(np.float32)
    field = ndimage.gaussian_filter(field, sigma=(0, 0, 1.5 * pixel_scale(x), 1.5 * pixel_scale(x)))
    rms = np.sqrt((field**2).mean(axis=(0, 2, 3), keepdims=True))
    field *= np.float32(0.5 * d) / np.maximum(rms, 1e-12)
    coef = np.linalg.inv(pts) @ (jitter * d)  # [N, 3, 2]: displacement = [y, x, 1] @ coef
    yy = np.arange(h, dtype=np.float32)[None, :, None]
    xx = np.arange(w, dtype=np.float32)[None, None, :]
    c = coef.astype(np.float32)[:, :, :, None, None]
    ys = yy + (yy * c[:, 0, 0] + xx * c[:, 1, 0] + c[:, 2, 0]) + field[0]
    xs = xx + (yy * c[:, 0, 1] + xx * c[:, 1, 1] + c[:, 2, 1]) + field[1]
    return bilinear_sample(x, ys, xs, mode="reflect")


# --------------------------------------------------------------------------------------------
# spatter (a weather corruption, listed after the digital ones)


@CORRUPTION_FUNCS.register("spatter")
def _spatter(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Water drops (severities 1-3) and, on top, mud splashes (4-5); own monotonic table.

    Drops and splashes are thresholded blobs of smoothed Gaussian noise (a lower threshold gives
    more, larger blobs, nested across severities). Water adds pale turquoise (175, 238, 238) with
    intensity .5/.55/.6 and thresholds 1.5/1.2/.9 (in noise std); levels 4-5 keep level 3's water
    and blend mud brown (63, 42, 20) into the dry pixels with thresholds 1.3/.9. The CIFAR-10-C
    table mixes water and mud and is not monotonic in distance from the clean image.
    """
    water_t, water_i = [(1.5, 0.5), (1.2, 0.55), (0.9, 0.6), (0.9, 0.6), (0.9, 0.6)][severity - 1]
    mud_t = [None, None, None, 1.3, 0.9][severity - 1]
    n, h, w, _ = x.shape
    sigma = pixel_scale(x)
    fields = rng.standard_normal((2, n, h, w, 1), dtype=np.float32)
    fields = ndimage.gaussian_filter(fields, sigma=(0, 0, sigma, sigma, 0), mode="wrap")
    mean = fields.mean(axis=(2, 3, 4), keepdims=True)
    std = fields.std(axis=(2, 3, 4), keepdims=True)
    fields = (fields - mean) / np.maximum(std, 1e-6)
    water = np.clip((fields[0] - water_t) / 0.5, 0, 1)
    out = x + water * np.float32(water_i) * colour_value(x, (175, 238, 238))
    if mud_t is not None:
        mud = np.clip((fields[1] - mud_t) / 0.5, 0, 1) * (1 - water)
        out = np.clip(out, 0, 1) * (1 - mud) + mud * colour_value(x, (63, 42, 20))
    return out
