"""Feature-shift transforms: image corruptions, rotation and colour tints.

Each client of a federated scenario may get a *feature style* (:class:`FeatureStyle`) that is
applied once to all of its images when the scenario is built. Images are numpy ``uint8`` arrays
``[N, H, W, C]`` (channels last, ``C`` = 1 or 3); every transform returns a new ``uint8`` array of
the same shape (``colorize`` always returns three channels) and never modifies its input.

The corruptions (CIFAR-10-C and FMNIST-C / MNIST-C families, five severities each) live in
:mod:`fedshift.data.corruptions`, registered in :data:`CORRUPTION_FUNCS`; :data:`CORRUPTIONS`
lists their names in order and :func:`apply_corruption` applies one.
:data:`CORRUPTION_POOLS` names the per-dataset sets ("fmnist-c", "cifar10-c") and
:func:`expand_styles` expands them (and "all") in style lists.

Style specs: "<corruption>" or "<corruption>/<1..5>" (so "rotate" and "rotate/3" are the
rotate corruption, by a random-sign angle that grows with the severity), "rotate:<degrees>" or
"rotate(<degrees>)" (a fixed rotation), "color:<name>" and "clean"; see :func:`parse_style`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from fedshift.core.errors import FedshiftError, UnknownNameError
from fedshift.data.corruptions import CORRUPTION_FUNCS
from fedshift.data.corruptions.ops import (
    affine_centre,
    check_images,
    rotation_matrix,
    to_float,
    to_uint8,
)

__all__ = [
    "COLORS",
    "CORRUPTIONS",
    "CORRUPTION_FUNCS",
    "CORRUPTION_POOLS",
    "FeatureStyle",
    "apply_corruption",
    "apply_style",
    "colorize",
    "corruption_names",
    "expand_styles",
    "parse_style",
    "rotate",
]

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "white": (255, 255, 255),
    "orange": (255, 165, 0),
    "purple": (128, 0, 128),
}

#: Corruption names in registration order (CIFAR-10-C families first); see
#: :data:`CORRUPTION_FUNCS`.
CORRUPTIONS: tuple[str, ...] = tuple(CORRUPTION_FUNCS.in_order())
#: bumped whenever a corruption's output changes, so scenario caches made before are not reused
CORRUPTIONS_VERSION = 3

CORRUPTION_POOLS: dict[str, tuple[str, ...]] = {
    # the 15 FMNIST-C methods: "identity" and the MNIST-C corruptions (Mu & Gilmer, 2019)
    # applied to Fashion-MNIST, without fog
    "fmnist-c": (
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
    ),
    # the 19 CIFAR-10-C corruptions (15 benchmark + 4 extra, Hendrycks & Dietterich, 2019)
    "cifar10-c": (
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
    ),
}
"""Named per-dataset sets of corruption names, usable as style specs via :func:`expand_styles`.

Only the corruption names are shared with the published benchmarks: the implementations and the
severity tables are this module's (see each function), and ``frost`` uses a procedural texture.
"""


def corruption_names() -> list[str]:
    """Names of all corruptions, CIFAR-10-C families first."""
    return list(CORRUPTIONS)


def expand_styles(specs: list[str]) -> list[str]:
    """Expand "all" to every corruption name (except ``identity``) and a pool name (:data:`CORRUPTION_POOLS`, e.g.
    "fmnist-c") to its members; every other spec is kept as it is, in order.

    Case and surrounding spaces are ignored for "all" and pool names. Duplicates are kept
    (a name listed twice is drawn twice as often). Specs are not checked here: an unknown
    name, pool-like or not, fails in :func:`parse_style` with an :class:`UnknownNameError`.
    """
    out: list[str] = []
    for spec in specs:
        key = str(spec).strip().lower()
        if key == "all":
            out.extend(c for c in CORRUPTIONS if c != "identity")
        elif key in CORRUPTION_POOLS:
            out.extend(CORRUPTION_POOLS[key])
        else:
            out.append(spec)
    return out


def _check_severity(severity: int) -> int:
    if isinstance(severity, bool) or not isinstance(severity, int | np.integer):
        raise FedshiftError(f"corruption severity must be an integer 1..5, got {severity!r}")
    if not 1 <= severity <= 5:
        raise FedshiftError(f"corruption severity must be in 1..5, got {severity}")
    return int(severity)


def apply_corruption(
    images: np.ndarray, name: str, severity: int, rng: np.random.Generator
) -> np.ndarray:
    """Corrupt ``images`` [N,H,W,C] uint8 with corruption ``name`` at ``severity`` 1..5.

    Returns a new uint8 array of the same shape; deterministic given ``rng``.
    """
    corrupt = CORRUPTION_FUNCS.get(name)
    severity = _check_severity(severity)
    check_images(images)
    if images.shape[0] == 0:
        return images.copy()
    out = corrupt(to_float(images), severity, rng)
    return to_uint8(out)


def rotate(images: np.ndarray, angle: float) -> np.ndarray:
    """Rotate ``images`` counter-clockwise by ``angle`` degrees about the centre.

    Same size, bilinear interpolation, pixels from outside the image are black. ``angle`` 90
    on square images equals ``np.rot90`` over the spatial axes.
    """
    check_images(images)
    if images.shape[0] == 0 or float(angle) % 360.0 == 0.0:
        return images.copy()
    return to_uint8(affine_centre(to_float(images), rotation_matrix(angle)))


def _colour_rgb(color: str | tuple[int, int, int]) -> tuple[int, int, int]:
    if isinstance(color, str):
        key = color.strip().lower()
        if key not in COLORS:
            raise UnknownNameError("color", color, list(COLORS))
        return COLORS[key]
    rgb = tuple(int(c) for c in color)
    if len(rgb) != 3 or not all(0 <= c <= 255 for c in rgb):
        raise FedshiftError(f"a color must be a name or 3 integers in 0..255, got {color!r}")
    return rgb  # type: ignore[return-value]


def colorize(images: np.ndarray, color: str | tuple[int, int, int]) -> np.ndarray:
    """Tint ``images``: ``out = img / 255 * color``, always [N,H,W,3] uint8.

    Grayscale images become RGB; RGB images have each channel multiplied by ``color / 255``.
    ``color`` is a name from :data:`COLORS` or an ``(r, g, b)`` tuple.
    """
    check_images(images)
    rgb = np.asarray(_colour_rgb(color), dtype=np.float32)
    x = images.astype(np.float32)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return np.clip(np.rint(x * rgb / 255.0), 0, 255).astype(np.uint8)


_STYLE_KINDS = ("clean", "corruption", "rotate", "color")


def _format_angle(angle: float) -> str:
    a = float(angle)
    return str(int(a)) if a.is_integer() else repr(a)


@dataclass(frozen=True)
class FeatureStyle:
    """One client's feature style.

    ``kind`` is "clean", "corruption", "rotate" or "color"; ``name`` is the corruption name,
    "rotate", the colour name or "clean"; ``severity`` is 1..5 for corruptions (0 = not chosen
    yet) and 0 otherwise; ``angle`` is the rotation in degrees. The fixed rotation (kind
    "rotate", label "rotate(30)") and the rotate corruption (kind "corruption", name "rotate",
    label "rotate/3") share the name and differ in ``kind``.
    """

    kind: str
    name: str
    severity: int = 0
    angle: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _STYLE_KINDS:
            raise FedshiftError(
                f"feature style kind must be one of {', '.join(_STYLE_KINDS)}, got {self.kind!r}"
            )

    def label(self) -> str:
        """Short text: "clean", "fog/3" (or "fog" before a severity is chosen), "rotate(90)",
        "color(red)". :func:`parse_style` accepts it back."""
        if self.kind == "clean":
            return "clean"
        if self.kind == "corruption":
            return f"{self.name}/{self.severity}" if self.severity else self.name
        if self.kind == "rotate":
            return f"rotate({_format_angle(self.angle)})"
        return f"color({self.name})"


def _style_error(spec: str) -> UnknownNameError:
    allowed = ["clean", *CORRUPTIONS, "<corruption>/<1..5>", "rotate:<degrees>", "color:<name>"]
    return UnknownNameError("feature style", spec, allowed)


def parse_style(spec: str) -> FeatureStyle:
    """Parse a style spec.

    Accepted: "clean", "<corruption>" (severity chosen later, 0), "<corruption>/<1..5>",
    "rotate:<degrees>", "color:<name>"; also the :meth:`FeatureStyle.label` forms
    "rotate(<degrees>)" and "color(<name>)". Case and surrounding spaces are ignored. A bare
    "rotate" or "rotate/<1..5>" is the rotate corruption; only "rotate:<degrees>" and
    "rotate(<degrees>)" are the fixed rotation. "all" and pool names are not styles: expand them
    first with :func:`expand_styles`.
    """
    s = str(spec).strip().lower()
    if s == "clean":
        return FeatureStyle(kind="clean", name="clean")
    m = re.fullmatch(r"(rotate|colou?r)\s*(?::\s*(.*?)|\(\s*(.*?)\s*\))", s)
    if m:
        kind, arg = m.group(1), (m.group(2) if m.group(2) is not None else m.group(3)).strip()
        if kind == "rotate":
            try:
                angle = float(arg)
            except ValueError:
                raise FedshiftError(
                    f"bad rotation angle {arg!r} in feature style {spec!r}"
                ) from None
            if not math.isfinite(angle):
                raise FedshiftError(f"rotation angle must be finite, got {spec!r}")
            return FeatureStyle(kind="rotate", name="rotate", angle=angle)
        if arg not in COLORS:
            raise UnknownNameError("color", arg, list(COLORS))
        return FeatureStyle(kind="color", name=arg)
    name, sep, sev = s.partition("/")
    name = name.strip()
    if name not in CORRUPTION_FUNCS:
        raise _style_error(spec)
    if not sep:
        return FeatureStyle(kind="corruption", name=name)
    try:
        severity = int(sev.strip())
    except ValueError:
        raise FedshiftError(f"bad severity {sev!r} in feature style {spec!r}: use 1..5") from None
    return FeatureStyle(kind="corruption", name=name, severity=_check_severity(severity))


def apply_style(images: np.ndarray, style: FeatureStyle, rng: np.random.Generator) -> np.ndarray:
    """Apply ``style`` to ``images`` [N,H,W,C] uint8 (colour styles return 3 channels)."""
    check_images(images)
    if style.kind == "clean":
        return images.copy()
    if style.kind == "corruption":
        if style.severity == 0:
            raise FedshiftError(f"feature style {style.label()!r} has no severity chosen yet")
        return apply_corruption(images, style.name, style.severity, rng)
    if style.kind == "rotate":
        return rotate(images, style.angle)
    return colorize(images, style.name)
