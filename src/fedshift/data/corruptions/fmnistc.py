"""The FMNIST-C / MNIST-C corruptions (Mu & Gilmer, 2019): identity, geometric, overlays and
edges.

Each registers itself in :data:`~fedshift.data.corruptions.CORRUPTION_FUNCS` after those of
:mod:`.cifar10c`; the order of the definitions is the order of ``CORRUPTIONS``, so keep it.
See :mod:`fedshift.data.corruptions` for the conventions.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from fedshift.data.corruptions.ops import (
    LUMA,
    affine_centre,
    bilinear_sample,
    pixel_scale,
    resample_axis,
    rotation_matrix,
)
from fedshift.data.corruptions.registry import CORRUPTION_FUNCS

# --------------------------------------------------------------------------------------------
# identity and geometric


@CORRUPTION_FUNCS.register("identity")
def _identity(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """No corruption: the image unchanged at every severity (Fashion-MNIST-C's "identity")."""
    return x


@CORRUPTION_FUNCS.register("shear")
def _shear(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Horizontal shear about the centre by [.15, .3, .45, .6, .75] (random sign), fill black.

    (Fashion-MNIST-C family; own table.)
    """
    c = [0.15, 0.3, 0.45, 0.6, 0.75][severity - 1]
    sign = rng.choice([-1.0, 1.0], size=x.shape[0])
    out = np.empty_like(x)
    for sg in (-1.0, 1.0):
        idx = np.flatnonzero(sign == sg)
        if idx.size:
            out[idx] = affine_centre(x[idx], np.array([[1.0, 0.0], [sg * c, 1.0]]))
    return out


@CORRUPTION_FUNCS.register("scale")
def _scale_down(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Shrink about the centre to [.9, .8, .7, .6, .5] of the size, fill black (MNIST-C)."""
    s = [0.9, 0.8, 0.7, 0.6, 0.5][severity - 1]
    h, w = x.shape[1], x.shape[2]
    ys = (h - 1) / 2.0 + (np.arange(h) - (h - 1) / 2.0) / s
    xs = (w - 1) / 2.0 + (np.arange(w) - (w - 1) / 2.0) / s
    return resample_axis(resample_axis(x, ys, 1, "constant"), xs, 2, "constant")


@CORRUPTION_FUNCS.register("rotate")
def _rotate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Rotate about the centre by [8, 16, 24, 32, 40] degrees, random sign per image, fill black.

    (MNIST-C / Fashion-MNIST-C family; own table.) Same sampling as
    :func:`fedshift.data.features.rotate`, so an image equals ``rotate(image, +-angle)``; the
    signs are the same at every level.
    """
    angle = [8.0, 16.0, 24.0, 32.0, 40.0][severity - 1]
    sign = rng.choice([-1.0, 1.0], size=x.shape[0])
    out = np.empty_like(x)
    for sg in (-1.0, 1.0):
        idx = np.flatnonzero(sign == sg)
        if idx.size:
            out[idx] = affine_centre(x[idx], rotation_matrix(sg * angle))
    return out


@CORRUPTION_FUNCS.register("translate")
def _translate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Shift by [1, 2, 3, 4, 5] px (times size/32 above 32 px) along a random diagonal, fill black.

    (MNIST-C values, which are for 28x28 images.)
    """
    c = [1, 2, 3, 4, 5][severity - 1] * pixel_scale(x)
    signs = rng.choice([-1.0, 1.0], size=(x.shape[0], 2))
    h, w = x.shape[1], x.shape[2]
    yy, xx = np.meshgrid(
        np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij"
    )
    out = np.empty_like(x)
    for sy in (-1.0, 1.0):
        for sx in (-1.0, 1.0):
            idx = np.flatnonzero((signs[:, 0] == sy) & (signs[:, 1] == sx))
            if idx.size:
                out[idx] = bilinear_sample(x[idx], (yy - c * sy)[None], (xx - c * sx)[None])
    return out


# --------------------------------------------------------------------------------------------
# overlays


def _paint(x: np.ndarray, ys: np.ndarray, xs: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Set pixels at float positions ``ys, xs`` [N, P] (where ``keep``) to white."""
    n, h, w, _ = x.shape
    yi, xi = np.rint(ys).astype(np.intp), np.rint(xs).astype(np.intp)
    keep = keep & (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
    batch = np.broadcast_to(np.arange(n)[:, None], yi.shape)
    out = x.copy()
    out[batch[keep], yi[keep], xi[keep]] = 1.0
    return out


def _random_lines(
    n: int, h: int, w: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Five random segments per image crossing the image: endpoints ``(p0, p1)`` [n, 5, 2]."""
    p0 = rng.uniform(0, 1, size=(n, 5, 2)) * [h - 1, w - 1]
    p1 = rng.uniform(0, 1, size=(n, 5, 2)) * [h - 1, w - 1]
    # make sure segments are not too short: push p1 to the opposite half of the image
    p1 = np.where(
        np.abs(p1 - p0) < 0.3 * np.array([h, w]),
        (p0 + 0.5 * np.array([h, w])) % np.array([h, w]),
        p1,
    )
    return p0, p1


@CORRUPTION_FUNCS.register("stripe")
def _stripe(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Invert a vertical band [.06, .12, .18, .24, .3] of the width around a random column."""
    frac = [0.06, 0.12, 0.18, 0.24, 0.3][severity - 1]
    n, h, w, _ = x.shape
    centre = rng.uniform(0.3, 0.7, size=n) * (w - 1)
    half = max(0.5, frac * w / 2.0)
    cols = np.arange(w)[None, :]
    band = np.abs(cols - centre[:, None]) <= half  # [N, W]
    return np.where(band[:, None, :, None], 1 - x, x)


@CORRUPTION_FUNCS.register("dotted_line")
def _dotted_line(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``severity`` white dotted lines (dots every 3 px) between random points."""
    n, h, w, _ = x.shape
    p0, p1 = _random_lines(n, h, w, rng)
    p0, p1 = p0[:, :severity], p1[:, :severity]
    samples = 4 * max(h, w)
    t = np.linspace(0.0, 1.0, samples)
    pts = p0[:, :, None, :] + t[None, None, :, None] * (p1 - p0)[:, :, None, :]  # [N, L, T, 2]
    length = np.linalg.norm(p1 - p0, axis=-1)[:, :, None]
    keep = np.mod(t[None, None, :] * length, 3.0) < 1.0
    return _paint(x, pts[..., 0].reshape(n, -1), pts[..., 1].reshape(n, -1), keep.reshape(n, -1))


@CORRUPTION_FUNCS.register("zigzag")
def _zigzag(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``severity`` white zigzag lines (random position, angle and amplitude)."""
    n, h, w, _ = x.shape
    size = max(h, w)
    centre = rng.uniform(0.25, 0.75, size=(n, 5, 2)) * [h - 1, w - 1]
    angle = rng.uniform(0, np.pi, size=(n, 5))
    amp = rng.uniform(0.05, 0.12, size=(n, 5)) * size
    period = rng.uniform(0.2, 0.35, size=(n, 5)) * size
    centre, angle = centre[:, :severity], angle[:, :severity]
    amp, period = amp[:, :severity], period[:, :severity]
    u = np.linspace(-0.4, 0.4, 4 * size)[None, None, :] * size  # along the line
    phase = np.mod(u / period[..., None], 1.0)
    v = amp[..., None] * (4 * np.abs(phase - 0.5) - 1)  # triangle wave across the line
    cos, sin = np.cos(angle)[..., None], np.sin(angle)[..., None]
    ys = centre[..., 0:1] + u * sin + v * cos
    xs = centre[..., 1:2] + u * cos - v * sin
    keep = np.ones(ys.shape, dtype=bool)
    return _paint(x, ys.reshape(n, -1), xs.reshape(n, -1), keep.reshape(n, -1))


# --------------------------------------------------------------------------------------------
# edges


def _canny(lum: np.ndarray, sigma: float) -> np.ndarray:
    """Canny edge map [N,H,W] (bool) of ``lum`` [N,H,W] in [0, 1].

    Gaussian smoothing (``sigma``), Sobel gradients, non-maximum suppression along the gradient
    direction quantised to 0/45/90/135 degrees (of equal neighbours along the gradient only the
    first is kept, so edges are one pixel thin), then hysteresis: pixels above the low
    threshold are kept when 8-connected to one above the high threshold. As in MNIST-C
    (``skimage.feature.canny`` with its defaults) the thresholds are absolute, .1 and .2 in units
    of the unnormalised Sobel magnitude (8 times the per-pixel gradient computed here, so
    .0125 and .025 per pixel), and the one-pixel frame of the image gets no edges.
    """
    n, h, w = lum.shape
    smooth = ndimage.gaussian_filter(lum, sigma=(0, sigma, sigma), mode="nearest")
    # Sobel per image (ndimage.sobel would also smooth across the batch axis), per pixel
    diff, tri = np.array([-0.5, 0.0, 0.5]), np.array([0.25, 0.5, 0.25])
    gy = ndimage.correlate1d(
        ndimage.correlate1d(smooth, diff, 1, mode="nearest"), tri, 2, mode="nearest"
    )
    gx = ndimage.correlate1d(
        ndimage.correlate1d(smooth, diff, 2, mode="nearest"), tri, 1, mode="nearest"
    )
    mag = np.hypot(gy, gx)
    sector = np.rint(np.degrees(np.arctan2(gy, gx)) / 45.0).astype(np.intp) % 4
    pad = np.pad(mag, ((0, 0), (1, 1), (1, 1)))
    peak = np.zeros(mag.shape, dtype=bool)
    # (dy, dx) of the neighbour along the gradient, for directions 0, 45, 90 and 135 degrees
    for k, (dy, dx) in enumerate(((0, 1), (1, 1), (1, 0), (1, -1))):
        ahead = pad[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
        behind = pad[:, 1 - dy : 1 - dy + h, 1 - dx : 1 - dx + w]
        peak |= (sector == k) & (mag >= ahead) & (mag > behind)  # ties: keep the first
    peak[:, [0, -1], :] = False  # skimage's canny erodes its mask: no edges on the border
    peak[:, :, [0, -1]] = False
    nms = np.where(peak, mag, 0.0)
    low, high = 0.1 / 8, 0.2 / 8  # skimage's defaults .1 and .2 on ndimage.sobel's scale
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[1] = True  # 8-connected within an image, never across images
    labels, count = ndimage.label(nms >= low, structure=structure)
    keep = np.zeros(count + 1, dtype=bool)
    keep[labels[nms >= high]] = True
    keep[0] = False
    return keep[labels]


@CORRUPTION_FUNCS.register("canny_edges")
def _canny_edges(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Canny edge map (white edges on black) blended in by [.2, .4, .6, .8, 1]; own table.

    Edges (:func:`_canny`, smoothing sigma 1 px, times size/32 above 32 px) are found on the
    luminance and written to every channel. Fashion-MNIST-C has one level, the edge map itself
    (our level 5); lower levels mix ``(1 - c) * x + c * edges``, so the distance from the clean
    image is proportional to ``c``. Deterministic: ``rng`` is not used.
    """
    c = np.float32([0.2, 0.4, 0.6, 0.8, 1.0][severity - 1])
    lum = x[..., 0] if x.shape[-1] == 1 else x @ LUMA
    edges = _canny(lum, pixel_scale(x)).astype(np.float32)[..., None]
    return (1 - c) * x + c * edges
