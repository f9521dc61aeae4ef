"""dSprites (Matthey et al., 2017): 2D sprites from five independent generative factors.

The real file ``dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz`` (keys ``imgs``,
``latents_values``, ``latents_classes``; https://github.com/deepmind/dsprites-dataset) is used
when it is found under the data directory (``<data>/dsprites/`` or ``<data>/``); otherwise
fedshift *generates* images of the same factors with its own rasteriser:

- shape: square, ellipse, heart (3); scale: linspace(0.5, 1, 6); orientation:
  linspace(0, 2*pi, 40); pos_x, pos_y: linspace(0, 1, 32) each -> 737,280 combinations,
  ordered as in the real file (C order over shape, scale, orientation, pos_x, pos_y);
- binary 64 x 64 images (stored 0/255, one channel), a pixel on when at least half of its
  8 x 8 sub-samples fall inside the sprite.

What is known to match the original (its README): the factors, their values and counts, their
order, the image size, binary pixels, and that orientation 0 and 2*pi are both present (the
first and last orientation give the same image) and the square (4-fold) and ellipse (2-fold)
are symmetric, so their orientation is not fully visible. What is *not* known here (the original
generator is unpublished and the real file is not available offline to compare with), so the
pixels differ from the original's: the sprite's size in pixels (here a square of side
``scale * 20`` px), the ellipse's aspect ratio (here 2:1), the exact heart outline (here the
curve (x^2 + y^2 - 1)^3 = x^2 y^3 scaled into the square), the rotation centre and direction
(here counter-clockwise about the sprite's centre), and the position mapping (here the centre
moves in 1-px steps from 16 to 47 px, on pixel corners; pos_x to the right, pos_y downwards).
The factor structure, and so the classification tasks, are the same; accuracies are comparable
in kind, not digit for digit.

Options: ``label`` (the factor used as the label), ``fraction`` (a seeded subset, stratified so
every (shape, scale, orientation) keeps the same number of random positions; only the chosen
images are rendered), ``size`` (64, or a divisor of it: 2 x 2 blocks averaged, then thresholded
at one half, so images stay binary), ``seed`` and ``source`` (auto: the file when found, else
generated; file; generated). Every sample is in the training arrays (the test set is empty):
attribute-skew scenarios pool them (``pool: all``). Arrays are cached under
``<cache>/decoded``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedshift.core.errors import FedshiftError
from fedshift.data.sources import DATASETS, RawDataset
from fedshift.data.sources.cache import cached_decode, file_key
from fedshift.data.sources.lookup import candidates, not_found, search_dirs

FILE_NAME = "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz"
_SUBDIRS = ("dsprites", "dsprites-dataset", ".")
FACTORS = ("shape", "scale", "orientation", "pos_x", "pos_y")
SHAPES = ("square", "ellipse", "heart")
COUNTS = (3, 6, 40, 32, 32)
SCALES = np.linspace(0.5, 1.0, 6)
ORIENTATIONS = np.linspace(0.0, 2 * math.pi, 40)
POSITIONS = np.linspace(0.0, 1.0, 32)
TOTAL = int(np.prod(COUNTS))  # 737,280

RENDER_VERSION = 1  # bump when the generated pixels change (invalidates the cache)
SIDE = 20.0  # square side in pixels at scale 1 (64 x 64 canvas)
SPRITE = 32  # sprite canvas; the sprite's centre is its middle pixel corner
FIRST_CENTRE = 16  # the sprite's centre (x or y, pixel units) at position 0; then 1-px steps
SUBSAMPLES = 8
_HEART_K = 2.278  # the heart curve's width; its bounding box is [-1.139, 1.139] x [-1, 1.236]


def inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Whether unit-shape coordinates (u right, v up; the square is [-0.5, 0.5]^2) are inside."""
    if shape == "square":
        return (np.abs(u) <= 0.5) & (np.abs(v) <= 0.5)
    if shape == "ellipse":
        return (u / 0.5) ** 2 + (v / 0.25) ** 2 <= 1.0
    if shape == "heart":
        x, y = u * _HEART_K, v * _HEART_K + 0.118  # bounding box centred on the origin
        return (x * x + y * y - 1.0) ** 3 - x * x * y**3 <= 0.0
    raise FedshiftError(f"dsprites: unknown shape {shape!r}; allowed: {', '.join(SHAPES)}")


def render(
    shape: str,
    scale: float,
    angle: float,
    centre: tuple[float, float],
    size: tuple[int, int] = (64, 64),
    subsamples: int = SUBSAMPLES,
) -> np.ndarray:
    """A binary uint8 image (0/1) [H, W] of a sprite: ``shape`` at ``scale`` (side
    ``scale * SIDE`` px), rotated counter-clockwise by ``angle`` radians, its centre at
    ``centre`` = (x, y) in pixel units (pixel (i, j) covers [j, j+1) x [i, i+1))."""
    h, w = size
    offs = (np.arange(subsamples) + 0.5) / subsamples
    ys = (np.arange(h)[:, None] + offs[None, :]).reshape(-1) - centre[1]
    xs = (np.arange(w)[:, None] + offs[None, :]).reshape(-1) - centre[0]
    dx, dy = xs[None, :], -ys[:, None]  # math orientation: y up
    c, s, side = math.cos(angle), math.sin(angle), scale * SIDE
    u = (dx * c + dy * s) / side
    v = (-dx * s + dy * c) / side
    hits = inside(shape, u, v).reshape(h, subsamples, w, subsamples)
    return (hits.mean(axis=(1, 3)) >= 0.5).astype(np.uint8)


def sprite(shape: int, scale: int, orientation: int) -> np.ndarray:
    """The sprite of factor classes (shape, scale, orientation) on its canvas, centred on the
    canvas' middle pixel corner (so unrotated squares cover whole pixels: 10 to 20 px wide)."""
    mid = SPRITE / 2
    return render(
        SHAPES[shape], SCALES[scale], ORIENTATIONS[orientation], (mid, mid), (SPRITE, SPRITE)
    )


def factor_classes(index: np.ndarray) -> np.ndarray:
    """The factor classes [N, 5] (shape, scale, orientation, pos_x, pos_y) of flat indices."""
    return np.stack(np.unravel_index(np.asarray(index, dtype=np.int64), COUNTS), axis=1)


def generate(classes: np.ndarray) -> np.ndarray:
    """Binary 64 x 64 images (0/1) [N, 64, 64] for factor classes [N, 5]; each distinct
    (shape, scale, orientation) is rendered once and pasted at its 1-px-step positions."""
    out = np.zeros((len(classes), 64, 64), dtype=np.uint8)
    groups = classes[:, 0] * 240 + classes[:, 1] * 40 + classes[:, 2]
    span = np.arange(SPRITE)
    top = FIRST_CENTRE - SPRITE // 2  # 0: the canvas fits at every position
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        img = sprite(*(int(v) for v in classes[rows[0], :3]))
        ys = top + classes[rows, 4][:, None, None] + span[None, :, None]
        xs = top + classes[rows, 3][:, None, None] + span[None, None, :]
        out[rows[:, None, None], ys, xs] = img[None]
    return out


def select(fraction: float, seed: int) -> np.ndarray:
    """Sorted flat indices of a seeded subset: every (shape, scale, orientation) keeps
    ``max(1, round(fraction * 1024))`` random positions of its 1024."""
    per_group = COUNTS[3] * COUNTS[4]
    if fraction >= 1.0:
        return np.arange(TOTAL)
    keep = max(1, int(round(fraction * per_group)))
    rng = np.random.default_rng([int(seed), 0xD5])
    chosen = np.argsort(rng.random((TOTAL // per_group, per_group)), axis=1)[:, :keep]
    base = np.arange(TOTAL // per_group)[:, None] * per_group
    return np.sort((base + chosen).reshape(-1))


def downscale(images: np.ndarray, size: int) -> np.ndarray:
    """Binary [N, 64, 64] images to [N, size, size]: block means thresholded at one half."""
    if size == 64:
        return images
    f = 64 // size
    blocks = images.reshape(len(images), size, f, size, f).mean(axis=(2, 4))
    return (blocks >= 0.5).astype(np.uint8)


def _find_file(data_dir: str | Path | None) -> Path | None:
    for folder in candidates(search_dirs(data_dir), _SUBDIRS):
        if (folder / FILE_NAME).is_file():
            return folder / FILE_NAME
    return None


def _from_file(path: Path, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            imgs, classes = z["imgs"], z["latents_classes"]
    except Exception as exc:
        raise FedshiftError(f"cannot read dSprites file {path}: {exc}") from None
    if imgs.shape != (TOTAL, 64, 64) or classes.shape != (TOTAL, 6):
        raise FedshiftError(
            f"{path}: expected imgs [{TOTAL}, 64, 64] and latents_classes [{TOTAL}, 6], got "
            f"{imgs.shape} and {classes.shape}"
        )
    return (imgs[index] > 0).astype(np.uint8), classes[index, 1:].astype(np.int64)


def _value_names(factor: str) -> tuple[str, ...]:
    if factor == "shape":
        return SHAPES
    if factor == "scale":
        return tuple(f"{v:.1f}" for v in SCALES)
    if factor == "orientation":
        return tuple(f"{math.degrees(v):.1f}deg" for v in ORIENTATIONS)
    return tuple(f"{v:.3f}" for v in POSITIONS)


@DATASETS.register("dsprites", "d-sprites")
def load_dsprites(
    data_dir: str | Path | None,
    download: bool,
    *,
    label: str = "scale",
    fraction: float = 1.0,
    size: int = 64,
    seed: int = 0,
    source: str = "auto",
) -> RawDataset:
    """dSprites with ``label`` as the class (shape: 3, scale: 6, orientation: 40 classes; the
    positions work too) and all five factors per sample; see the module docs.

    ``download`` is not used: without the real file the images are generated.
    """
    if label not in FACTORS:
        raise FedshiftError(f"dsprites: label {label!r} is not a factor; use one of {FACTORS}")
    if not 0.0 < float(fraction) <= 1.0:
        raise FedshiftError(f"dsprites: fraction must be in (0, 1], got {fraction!r}")
    if int(size) < 1 or 64 % int(size):
        raise FedshiftError(f"dsprites: size must divide 64 (64, 32, 16, ...), got {size!r}")
    if source not in ("auto", "file", "generated"):
        raise FedshiftError(f"dsprites: source must be auto, file or generated, got {source!r}")
    path = None if source == "generated" else _find_file(data_dir)
    if path is None and source == "file":
        bases = search_dirs(data_dir)
        hint = f"put {FILE_NAME} (github.com/deepmind/dsprites-dataset) in <data>/dsprites/"
        not_found("dsprites", bases, _SUBDIRS, hint, "source=file asks for the real file")
    index = select(float(fraction), int(seed))

    def decode() -> dict[str, np.ndarray]:
        if path is not None:
            images, classes = _from_file(path, index)
        else:
            classes = factor_classes(index)
            images = generate(classes)
        x = downscale(images, int(size))[..., None] * np.uint8(255)
        return {
            "x_train": x,
            "y_train": classes,  # the factor classes [N, 5]; the label is one column
            "x_test": np.zeros((0, *x.shape[1:]), dtype=np.uint8),
            "y_test": np.zeros((0, len(FACTORS)), dtype=np.int64),
            "classes": np.asarray(FACTORS),
        }

    what = ("file", file_key(path)) if path is not None else ("generated", RENDER_VERSION)
    arrays = cached_decode("dsprites", (*what, float(fraction), int(seed), int(size)), decode)
    x, classes = arrays["x_train"], arrays["y_train"]
    col = FACTORS.index(label)
    on = float(np.count_nonzero(x)) / max(1, x.size)
    where = str(path) if path is not None else "generated by fedshift (not the original pixels)"
    return RawDataset(
        name="dsprites",
        x_train=x,
        y_train=np.ascontiguousarray(classes[:, col]),
        x_test=arrays["x_test"],
        y_test=np.zeros(0, dtype=np.int64),
        num_classes=COUNTS[col],
        classes=_value_names(label),
        mean=(on,),
        std=(max(math.sqrt(on * (1 - on)), 1e-3),),
        source=f"dSprites, {where}",
        factors_train={f: np.ascontiguousarray(classes[:, i]) for i, f in enumerate(FACTORS)},
        factors_test={f: np.zeros(0, dtype=np.int64) for f in FACTORS},
        factor_values={"shape": SHAPES},  # the others read as class indices
    )
