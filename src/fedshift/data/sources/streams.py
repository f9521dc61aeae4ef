"""The synthetic concept-drift streams of the drift literature: SEA, SINE and Circle (generated
from a seed, always available; the streams FedDrift's code uses).

Each dataset draws its inputs uniformly (``n_train`` + ``n_test`` points) and offers its
concepts as decision rules of the input (:class:`~fedshift.data.concepts.DecisionConcept`,
:attr:`RawDataset.concepts`): ``scenario.concepts: [0, 1]`` picks the dataset's concepts 0
and 1, and ``"sea:8"``, ``{kind: circle, cx: 0.3, cy: 0.5, r: 0.2}`` name other ones. A
client's label is its concept's rule of the input, so a drift schedule that moves a client to
another concept relabels the same inputs by another function of ``x`` (a permutation of
labels could not). ``y_train``/``y_test`` are the labels under concept 0.

Labels (``x1, x2, x3`` the features, 1-based as in the literature):

- ``sea`` (Street & Kim 2001): 3 features uniform in [0, 10]; ``y = 1 if x1 + x2 <= theta
  else 0``; ``x3`` is irrelevant. Concepts: the thresholds ``thetas`` (default the classic
  8, 9, 7, 9.5). Thresholds 8 and 9 disagree exactly on ``8 < x1 + x2 <= 9``, a share
  (9^2 - 8^2) / 200 = 8.5% of the inputs.
- ``sine`` (Gama et al. 2004, SINE1 / SINE2): 2 features uniform in [0, 1]; concept 0
  (SINE1) ``y = 1 if x2 <= sin(x1)``, concept 1 its reverse (``y = 1 if x2 > sin(x1)``),
  concept 2 (SINE2) ``y = 1 if x2 <= 0.5 + 0.3 sin(3 pi x1)``, concept 3 its reverse. Concept
  0 is FedDrift's "default concept" of its sine data, concept 1 the one it drifts to.
- ``circle``: 2 features uniform in [0, 1]; ``y = 1 if (x1 - cx)^2 + (x2 - cy)^2 <= r^2``
  (inside the circle); concepts: the circles ``circles`` (default (0.2, 0.5, 0.15),
  (0.4, 0.5, 0.2), (0.6, 0.5, 0.25), (0.8, 0.5, 0.3), the four of the drift literature;
  FedDrift's code uses the first and the third and labels the *outside* 1, a swap of the two
  labels that changes no learning problem).

Label noise (``noise``, default 0): a share of the samples whose label is flipped under every
concept. Which samples is a fixed pseudo-random function of the input and the seed (a hash of
its float32 bits), so a noisy sample stays noisy whatever concept labels it and wherever the
builders put it.

The features are not standardised here: every dataset gives the mean and standard deviation of
its uniform features (``mean``, ``std``), and the scenario standardises tabular inputs with
them once, when it builds the pool (:func:`fedshift.data.federated.assemble`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedshift.core.errors import ConfigError
from fedshift.data.concepts import DecisionConcept
from fedshift.data.sources import DATASETS, RawDataset

__all__ = [
    "CIRCLES",
    "SEA_THETAS",
    "SINE_CURVES",
    "circle_rule",
    "noise_flags",
    "sea_rule",
    "sine_rule",
]

#: SEA's classic four thresholds (Street & Kim 2001)
SEA_THETAS: tuple[float, ...] = (8.0, 9.0, 7.0, 9.5)
#: the four circles (cx, cy, r) of the drift literature
CIRCLES: tuple[tuple[float, float, float], ...] = (
    (0.2, 0.5, 0.15),
    (0.4, 0.5, 0.2),
    (0.6, 0.5, 0.25),
    (0.8, 0.5, 0.3),
)
#: the sine concepts in order: (curve, reversed)
SINE_CURVES: tuple[tuple[str, bool], ...] = (
    ("sine1", False),
    ("sine1", True),
    ("sine2", False),
    ("sine2", True),
)

Rule = Callable[[np.ndarray], np.ndarray]


# ----------------------------------------------------------------------------- the rules


def sea_rule(theta: float) -> Rule:
    """``y = 1 if x1 + x2 <= theta else 0`` (``x3`` not read)."""

    def rule(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return (x[:, 0] + x[:, 1] <= theta).astype(np.int64)

    return rule


def sine_curve(curve: str, x1: np.ndarray) -> np.ndarray:
    """SINE1: ``sin(x1)``; SINE2: ``0.5 + 0.3 sin(3 pi x1)``."""
    return np.sin(x1) if curve == "sine1" else 0.5 + 0.3 * np.sin(3 * math.pi * x1)


def sine_rule(curve: str, reverse: bool) -> Rule:
    """``y = 1 if x2 <= curve(x1)`` (``reverse``: ``y = 1 if x2 > curve(x1)``)."""

    def rule(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        below = x[:, 1] <= sine_curve(curve, x[:, 0])
        return (below != reverse).astype(np.int64)

    return rule


def circle_rule(cx: float, cy: float, r: float) -> Rule:
    """``y = 1 if (x1 - cx)^2 + (x2 - cy)^2 <= r^2`` (inside the circle)."""

    def rule(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return ((x[:, 0] - cx) ** 2 + (x[:, 1] - cy) ** 2 <= r * r).astype(np.int64)

    return rule


def noise_flags(x: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Which inputs (rows of ``x``) are noisy: a hash of each row's float32 bits and the seed,
    uniform in [0, 1), below ``rate``; bool [N]."""
    bits = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    h = np.full(len(bits), (int(seed) * 0x9E3779B97F4A7C15) & (2**64 - 1), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in bits.reshape(len(bits), -1).T.astype(np.uint64):
            h = (h ^ col) * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
        h = (h ^ (h >> np.uint64(29))) * np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(32)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) < rate


def _with_noise(rule: Rule, noise: float, seed: int) -> Rule:
    if noise <= 0:
        return rule

    def noisy(x: np.ndarray) -> np.ndarray:
        y = rule(x)
        return np.where(noise_flags(x, noise, seed), 1 - y, y)

    return noisy


# ----------------------------------------------------------------------------- checks


def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | np.integer)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float | np.floating)) and math.isfinite(float(v))


def _check(name: str, n_train: Any, n_test: Any, noise: Any, seed: Any) -> None:
    for opt, val in (("n_train", n_train), ("n_test", n_test)):
        if not _is_int(val) or val < 1:
            raise ConfigError(f"{name}: {opt} must be an integer >= 1, got {val!r}")
    if not _is_num(noise) or not 0 <= float(noise) < 0.5:
        raise ConfigError(f"{name}: noise must be a share in [0, 0.5), got {noise!r}")
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"{name}: seed must be an integer >= 0, got {seed!r}")


def _number(name: str, key: str, v: Any) -> float:
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = float(v)
    if not _is_num(v):
        raise ConfigError(f"{name}: {key} must be a number, got {v!r}")
    return float(v)


def _circle(name: str, v: Any) -> tuple[float, float, float]:
    if isinstance(v, str) or not isinstance(v, Sequence) or len(v) != 3:
        raise ConfigError(f"{name}: a circle is [cx, cy, r], got {v!r}")
    cx, cy, r = (_number(name, k, x) for k, x in zip(("cx", "cy", "r"), v, strict=True))
    if r <= 0:
        raise ConfigError(f"{name}: a circle's radius must be > 0, got {r!r}")
    return cx, cy, r


def _nonempty(name: str, opt: str, v: Any) -> list:
    if isinstance(v, str) or not isinstance(v, Sequence) or not v:
        raise ConfigError(f"{name}: {opt} must be a non-empty list, got {v!r}")
    return list(v)


# ----------------------------------------------------------------------------- the datasets


def _dataset(
    name: str,
    dim: int,
    high: float,
    concepts: list[DecisionConcept],
    kinds: dict[str, Any],
    n_train: int,
    n_test: int,
    seed: int,
) -> RawDataset:
    """Uniform inputs in [0, high]^dim, labelled by concept 0."""
    rng = np.random.default_rng([int(seed), 31])
    x_tr = (rng.random((int(n_train), dim)) * high).astype(np.float32)
    x_te = (rng.random((int(n_test), dim)) * high).astype(np.float32)
    return RawDataset(
        name=name,
        x_train=x_tr,
        y_train=concepts[0].apply(np.zeros(len(x_tr), np.int64), x_tr),
        x_test=x_te,
        y_test=concepts[0].apply(np.zeros(len(x_te), np.int64), x_te),
        num_classes=2,
        classes=("0", "1"),
        mean=(high / 2,) * dim,
        std=(high / math.sqrt(12),) * dim,
        source="generated",
        concepts=tuple(concepts),
        concept_kinds=kinds,
    )


def _concept(kind: str, params: dict, rule: Rule, dataset: str, noise: float, seed: int):
    return DecisionConcept(
        kind=kind,
        params=tuple(params.items()),
        num_classes=2,
        dataset=dataset,
        rule=_with_noise(rule, float(noise), int(seed)),
    )


@DATASETS.register("sea")
def load_sea(
    data_dir: str | Path | None,
    download: bool,
    *,
    n_train: int = 20000,
    n_test: int = 5000,
    thetas: Sequence[float] = SEA_THETAS,
    noise: float = 0.0,
    seed: int = 0,
) -> RawDataset:
    """SEA: x in U[0, 10]^3, concept i: ``y = 1 if x1 + x2 <= thetas[i]``; ``noise``: the
    share of samples whose label is flipped (under every concept). ``data_dir`` and
    ``download`` are not used."""
    _check("sea", n_train, n_test, noise, seed)
    thetas = [_number("sea", "thetas", t) for t in _nonempty("sea", "thetas", thetas)]

    def kind(arg: str | None = None, *, theta: float | None = None) -> DecisionConcept:
        """``sea:<theta>`` or ``{kind: sea, theta: <theta>}``."""
        value = arg if theta is None else theta
        if value is None:
            raise ConfigError("concept: 'sea' needs a threshold, e.g. 'sea:8'")
        t = _number("concept sea", "theta", value)
        return _concept("sea", {"theta": t}, sea_rule(t), "sea", noise, seed)

    concepts = [kind(theta=t) for t in thetas]
    return _dataset("sea", 3, 10.0, concepts, {"sea": kind}, n_train, n_test, seed)


def _sine_variant(arg: str) -> tuple[str, bool]:
    key = arg.strip().lower().replace("_", "-")
    curve, _, rev = key.partition("-")
    if curve not in ("sine1", "sine2") or rev not in ("", "reversed"):
        raise ConfigError(
            f"concept: sine takes sine1, sine2, sine1-reversed or sine2-reversed, got {arg!r}"
        )
    return curve, rev == "reversed"


@DATASETS.register("sine")
def load_sine(
    data_dir: str | Path | None,
    download: bool,
    *,
    n_train: int = 20000,
    n_test: int = 5000,
    noise: float = 0.0,
    seed: int = 0,
) -> RawDataset:
    """SINE: x in U[0, 1]^2; concepts SINE1 (``y = 1 if x2 <= sin(x1)``), SINE1 reversed, SINE2
    (``y = 1 if x2 <= 0.5 + 0.3 sin(3 pi x1)``), SINE2 reversed. ``data_dir`` and ``download``
    are not used."""
    _check("sine", n_train, n_test, noise, seed)

    def kind(
        arg: str | None = None, *, curve: str | None = None, reverse: bool = False
    ) -> DecisionConcept:
        """``sine:sine2-reversed`` or ``{kind: sine, curve: sine2, reverse: true}``."""
        if curve is None and arg is None:
            raise ConfigError("concept: 'sine' needs a curve, e.g. 'sine:sine1'")
        if not isinstance(reverse, bool):
            raise ConfigError(f"concept: sine's reverse must be true or false, got {reverse!r}")
        if curve is not None:
            name, rev = _sine_variant(str(curve))
            rev = rev or reverse
        else:
            name, rev = _sine_variant(arg)
        params = {"curve": name, "reverse": rev}
        return _concept("sine", params, sine_rule(name, rev), "sine", noise, seed)

    concepts = [kind(curve=c, reverse=r) for c, r in SINE_CURVES]
    return _dataset("sine", 2, 1.0, concepts, {"sine": kind}, n_train, n_test, seed)


@DATASETS.register("circle")
def load_circle(
    data_dir: str | Path | None,
    download: bool,
    *,
    n_train: int = 20000,
    n_test: int = 5000,
    circles: Sequence[Sequence[float]] = CIRCLES,
    noise: float = 0.0,
    seed: int = 0,
) -> RawDataset:
    """Circle: x in U[0, 1]^2, concept i: ``y = 1 if (x1 - cx)^2 + (x2 - cy)^2 <= r^2`` for
    ``circles[i] = (cx, cy, r)``. ``data_dir`` and ``download`` are not used."""
    _check("circle", n_train, n_test, noise, seed)
    triples = [_circle("circle", c) for c in _nonempty("circle", "circles", circles)]

    def kind(
        arg: str | None = None,
        *,
        cx: float | None = None,
        cy: float | None = None,
        r: float | None = None,
    ) -> DecisionConcept:
        """``circle:<cx>,<cy>,<r>`` or ``{kind: circle, cx: .., cy: .., r: ..}``."""
        given = [cx, cy, r]
        if arg is not None and all(v is None for v in given):
            given = arg.split(",")
        if any(v is None for v in given):
            raise ConfigError("concept: 'circle' needs cx, cy and r, e.g. 'circle:0.2,0.5,0.15'")
        c = _circle("concept circle", given)
        params = dict(zip(("cx", "cy", "r"), c, strict=True))
        return _concept("circle", params, circle_rule(*c), "circle", noise, seed)

    concepts = [kind(cx=cx, cy=cy, r=r) for cx, cy, r in triples]
    return _dataset("circle", 2, 1.0, concepts, {"circle": kind}, n_train, n_test, seed)
