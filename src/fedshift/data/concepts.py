"""Concept shift: a concept turns a sample (its dataset label ``y`` and input ``x``) into the
label a client sees, ``concept.apply(y, x)``.

Two kinds of concept share this contract:

- a :class:`LabelMap`, a permutation ``m`` of ``0..C-1``: ``y`` becomes ``m[y]`` (``x`` is not
  read). Clients that share the input distribution but use different label maps follow
  different concepts (the same image means different classes).
- a :class:`DecisionConcept`, a decision rule of the input: the label is ``rule(x)`` (``y`` is
  not read). A permutation of labels cannot express the drift streams of the drift literature
  (SEA's thresholds, SINE's curves, Circle's circles: :mod:`fedshift.data.sources.streams`),
  where a concept is another decision function of ``x``, so the scenario builders hand every
  concept the inputs of the samples it labels, whatever its kind, and a dataset source may
  offer concepts of its own (:attr:`RawDataset.concepts`, picked by index in
  ``scenario.concepts``; :attr:`RawDataset.concept_kinds`, picked by a spec such as
  ``"sea:8"``). :func:`make_concept` resolves every spec form.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fedshift.core.errors import ConfigError, UnknownNameError
from fedshift.core.registry import Registry

__all__ = [
    "LABEL_MAP_KINDS",
    "Concept",
    "DecisionConcept",
    "LabelMap",
    "fedrc_concepts",
    "identity_map",
    "make_concept",
    "make_label_map",
    "permutation_map",
    "random_permutation_map",
    "reverse_map",
    "shift_map",
]

#: ``build(num_classes, rng, *, <keys>) -> LabelMap``; the keyword-only parameters are the
#: optional keys of a dict spec.
_SpecBuilder = Callable[..., "LabelMap"]

#: Spec kinds accepted by :func:`make_label_map` (the builders are registered below).
LABEL_MAP_KINDS: Registry[_SpecBuilder] = Registry("concept")

_NAME_PREVIEW = 8  # entries shown in the name of a permutation


def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | np.integer)


def _check_num_classes(num_classes: Any) -> int:
    if not _is_int(num_classes) or num_classes < 1:
        raise ConfigError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    return int(num_classes)


def _validate_perm(perm: Any) -> tuple[int, ...]:
    """Return ``perm`` as a tuple of ints, or raise ConfigError naming what is wrong."""
    if isinstance(perm, str | bytes) or not isinstance(perm, Sequence | np.ndarray):
        raise ConfigError(f"permutation must be a list of integers, got {perm!r}")
    if isinstance(perm, np.ndarray) and perm.ndim != 1:
        raise ConfigError(f"permutation must be 1-D, got shape {perm.shape}")
    values = list(perm)
    if not values:
        raise ConfigError("permutation is empty; it must list 0..C-1 in some order")
    bad = [v for v in values if not _is_int(v)]
    if bad:
        raise ConfigError(f"permutation must contain integers only, got {bad[0]!r}")
    c = len(values)
    out = tuple(int(v) for v in values)
    outside = [v for v in out if v < 0 or v >= c]
    if outside:
        raise ConfigError(
            f"permutation of length {c} must contain each of 0..{c - 1} once; "
            f"value {outside[0]} is out of range"
        )
    if len(set(out)) != c:
        counts = np.bincount(out, minlength=c)
        dup = int(np.argmax(counts > 1))
        missing = sorted(set(range(c)) - set(out))
        raise ConfigError(
            f"permutation of length {c} must contain each of 0..{c - 1} once; value {dup} "
            f"appears more than once and {missing[0]} is missing"
        )
    return out


@dataclass(frozen=True)
class LabelMap:
    """A permutation of the labels ``0..C-1``: label ``y`` becomes ``mapping[y]``."""

    kind: str  # "identity" | "reverse" | "shift" | "permutation" | "random"
    mapping: tuple[int, ...]
    #: whether :meth:`apply` reads the inputs (a label map does not)
    uses_inputs: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.kind not in LABEL_MAP_KINDS.names():
            raise UnknownNameError("label map", self.kind, LABEL_MAP_KINDS.names())
        object.__setattr__(self, "mapping", _validate_perm(self.mapping))

    @property
    def num_classes(self) -> int:
        """The number of classes ``C``."""
        return len(self.mapping)

    @property
    def name(self) -> str:
        """A short human-readable name, e.g. ``"reverse (C-1-y)"`` or ``"shift+1"``."""
        if self.kind == "identity":
            return "identity"
        if self.kind == "reverse":
            return "reverse (C-1-y)"
        if self.kind == "shift":
            return f"shift+{self.mapping[0]}"
        shown = ",".join(str(v) for v in self.mapping[:_NAME_PREVIEW])
        if self.num_classes > _NAME_PREVIEW:
            shown += ",..."
        prefix = "random perm" if self.kind == "random" else "perm"
        return f"{prefix}[{shown}]"

    def as_array(self) -> np.ndarray:
        """The mapping as a fresh int64 array of length ``C``."""
        return np.asarray(self.mapping, dtype=np.int64)

    def apply(self, labels: np.ndarray, x: np.ndarray | None = None) -> np.ndarray:
        """Map ``labels`` (any shape, values in ``0..C-1``) to new int64 labels (``x``, the
        samples' inputs, is not read: a label map depends on the label only)."""
        y = np.asarray(labels)
        if y.size == 0:
            return np.zeros(y.shape, dtype=np.int64)
        if y.dtype.kind not in "iu":
            raise ConfigError(f"labels must be an integer array, got dtype {y.dtype}")
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= self.num_classes:
            raise ConfigError(
                f"label map {self.name!r} covers labels 0..{self.num_classes - 1}, "
                f"got values in {lo}..{hi}"
            )
        return self.as_array()[y]

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class DecisionConcept:
    """A concept that labels a sample by a decision rule of its input: ``rule(x)`` gives int
    labels in ``0..C-1`` for inputs ``x`` ``[N, ...]`` of dataset ``dataset`` (the source that
    offers it). Equal when kind, parameters, classes and dataset are."""

    kind: str  # the family, e.g. "sea"
    params: tuple[tuple[str, Any], ...]  # (name, value) pairs, e.g. (("theta", 8.0),)
    num_classes: int
    dataset: str  # the dataset whose inputs the rule reads
    rule: Callable[[np.ndarray], np.ndarray] = field(compare=False, repr=False)
    #: whether :meth:`apply` reads the inputs (a decision rule does)
    uses_inputs: ClassVar[bool] = True

    @property
    def name(self) -> str:
        """E.g. ``"sea(theta=8)"``."""
        args = ",".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.params
        )
        return f"{self.kind}({args})"

    def apply(self, labels: np.ndarray, x: np.ndarray | None = None) -> np.ndarray:
        """The labels of inputs ``x`` under the rule, int64, one per entry of ``labels`` (the
        dataset's own labels, not read)."""
        y = np.asarray(labels)
        if y.size == 0:
            return np.zeros(y.shape, dtype=np.int64)
        if x is None:
            raise ConfigError(f"concept {self.name!r} labels inputs: it needs the samples' x")
        out = np.asarray(self.rule(np.asarray(x)), dtype=np.int64)
        if out.shape != y.shape:
            raise ConfigError(
                f"concept {self.name!r}: {out.shape[0]} labels for {y.shape[0]} samples"
            )
        return out

    def __str__(self) -> str:
        return self.name


#: what a client's labels follow: a label map or a decision rule of the input
Concept = LabelMap | DecisionConcept


def identity_map(num_classes: int) -> LabelMap:
    """``y -> y``."""
    c = _check_num_classes(num_classes)
    return LabelMap("identity", tuple(range(c)))


def reverse_map(num_classes: int) -> LabelMap:
    """``y -> C-1-y``."""
    c = _check_num_classes(num_classes)
    return LabelMap("reverse", tuple(range(c - 1, -1, -1)))


def shift_map(num_classes: int, k: int = 1) -> LabelMap:
    """``y -> (y + k) mod C`` (``k`` may be negative; it is reduced mod ``C``)."""
    c = _check_num_classes(num_classes)
    if not _is_int(k):
        raise ConfigError(f"shift: k must be an integer, got {k!r}")
    k = int(k) % c
    return LabelMap("shift", tuple((y + k) % c for y in range(c)))


def permutation_map(perm: Sequence[int]) -> LabelMap:
    """``y -> perm[y]``; ``perm`` must contain each of ``0..C-1`` exactly once."""
    return LabelMap("permutation", _validate_perm(perm))


def random_permutation_map(num_classes: int, rng: np.random.Generator) -> LabelMap:
    """A uniformly random permutation of ``0..C-1`` drawn from ``rng``."""
    c = _check_num_classes(num_classes)
    return LabelMap("random", tuple(int(v) for v in rng.permutation(c)))


def _parse_str_spec(spec: str) -> dict[str, Any]:
    """``"shift:2"`` -> ``{"kind": "shift", "k": 2}``; ``"random:3"`` -> seed 3."""
    kind, sep, arg = spec.strip().partition(":")
    kind = kind.strip().lower()
    if not sep:
        return {"kind": kind}
    arg = arg.strip()
    key = {"shift": "k", "random": "seed"}.get(kind)
    if key is None:
        LABEL_MAP_KINDS.canonical(kind)  # an unknown kind: UnknownNameError
        raise ConfigError(f"concept: {kind!r} takes no argument, got {spec!r}")
    try:
        return {"kind": kind, key: int(arg)}
    except ValueError:
        raise ConfigError(
            f"concept: {spec!r} needs an integer after ':', e.g. '{kind}:1'"
        ) from None


def make_label_map(
    spec: Mapping[str, Any] | str | LabelMap,
    num_classes: int,
    rng: np.random.Generator | None = None,
) -> LabelMap:
    """Build a label map from a spec.

    Forms: ``"identity"``, ``"reverse"``, ``"shift:<k>"`` (``"shift"`` alone means ``k=1``),
    ``"random"`` / ``"random:<seed>"``, or a dict such as ``{"kind": "shift", "k": 1}``,
    ``{"kind": "permutation", "perm": [...]}``, ``{"kind": "random", "seed": 3}``. A random map
    without a seed is drawn from ``rng``. A :class:`LabelMap` is returned as is (after checking
    its size).
    """
    c = _check_num_classes(num_classes)
    if isinstance(spec, LabelMap):
        if spec.num_classes != c:
            raise ConfigError(f"label map {spec.name!r} has {spec.num_classes} classes, not {c}")
        return spec
    if isinstance(spec, str):
        params = _parse_str_spec(spec)
    elif isinstance(spec, Mapping):
        params = dict(spec)
    else:
        raise ConfigError(
            f"concept must be a string like 'reverse' or a dict with a 'kind', got {spec!r}"
        )
    kind = params.pop("kind", None)
    if not isinstance(kind, str):
        raise ConfigError(f"concept: a dict spec needs a string 'kind', got {spec!r}")
    kind = LABEL_MAP_KINDS.canonical(kind)
    build = LABEL_MAP_KINDS.get(kind)
    _check_spec_keys(build, kind, params)
    return build(c, rng, **params)


def make_concept(
    spec: Any,
    num_classes: int,
    rng: np.random.Generator | None = None,
    dataset: Any = None,
) -> Concept:
    """Build a concept from a spec of ``scenario.concepts``, for ``dataset`` (a
    :class:`~fedshift.data.sources.RawDataset`, or None).

    Forms: an integer ``i``, the dataset's own concept ``i`` (``dataset.concepts``); a kind the
    dataset offers (``dataset.concept_kinds``), as ``"<kind>:<arg>"`` (e.g. ``"sea:8"``) or a
    dict ``{"kind": "sea", "theta": 8}``; else a label map (:func:`make_label_map`).
    """
    own = tuple(getattr(dataset, "concepts", ()) or ())
    kinds = dict(getattr(dataset, "concept_kinds", {}) or {})
    name = getattr(dataset, "name", "?")
    if _is_int(spec):
        if not own:
            raise ConfigError(
                f"concept: {spec} picks a concept of the dataset's own, but dataset {name!r} "
                "has none; use a label map such as 'identity', 'reverse' or 'shift:1'"
            )
        if not 0 <= int(spec) < len(own):
            raise ConfigError(
                f"concept: dataset {name!r} has concepts 0..{len(own) - 1}, not {spec}"
            )
        return own[int(spec)]
    kind, arg, params = None, None, {}
    if isinstance(spec, str):
        kind, sep, rest = spec.strip().partition(":")
        arg = rest.strip() if sep else None
    elif isinstance(spec, Mapping):
        params = dict(spec)
        kind = params.pop("kind", None)
    key = kind.strip().lower() if isinstance(kind, str) else None
    if key not in kinds:
        return make_label_map(spec, num_classes, rng)
    build = kinds[key]
    _check_spec_keys(build, key, params)
    concept = build(arg, **params)
    if concept.num_classes != num_classes:
        raise ConfigError(
            f"concept: {concept.name!r} has {concept.num_classes} classes, not {num_classes}"
        )
    return concept


def _check_spec_keys(build: Callable[..., Any], kind: str, params: Mapping[str, Any]) -> None:
    """A one-line ConfigError for a dict spec's key that the concept kind's builder lacks."""
    allowed = _spec_keys(build)
    for key in params:
        if key not in allowed:
            raise ConfigError(
                f"concept: unexpected parameter {key!r} for {kind!r}; "
                f"allowed: {', '.join(allowed) or '(none)'}"
            )


def _spec_keys(build: _SpecBuilder) -> tuple[str, ...]:
    """The optional keys of a dict spec: the builder's keyword-only parameters."""
    params = inspect.signature(build).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


# --------------------------------------------------------------------------------------------
# spec kinds: build(num_classes, rng, *, <keys>) -> LabelMap


@LABEL_MAP_KINDS.register("identity")
def _identity_spec(c: int, rng: np.random.Generator | None) -> LabelMap:
    return identity_map(c)


@LABEL_MAP_KINDS.register("reverse")
def _reverse_spec(c: int, rng: np.random.Generator | None) -> LabelMap:
    return reverse_map(c)


@LABEL_MAP_KINDS.register("shift")
def _shift_spec(c: int, rng: np.random.Generator | None, *, k: int = 1) -> LabelMap:
    return shift_map(c, k)


_NO_PERM: Any = object()


@LABEL_MAP_KINDS.register("permutation")
def _permutation_spec(
    c: int, rng: np.random.Generator | None, *, perm: Sequence[int] = _NO_PERM
) -> LabelMap:
    if perm is _NO_PERM:
        raise ConfigError("concept: 'permutation' needs a 'perm' list of 0..C-1")
    lm = permutation_map(perm)
    if lm.num_classes != c:
        raise ConfigError(
            f"concept: permutation has length {lm.num_classes} but the dataset has {c} classes"
        )
    return lm


@LABEL_MAP_KINDS.register("random")
def _random_spec(c: int, rng: np.random.Generator | None, *, seed: int | None = None) -> LabelMap:
    if seed is not None:
        if not _is_int(seed) or seed < 0:
            raise ConfigError(f"concept: random seed must be an integer >= 0, got {seed!r}")
        return random_permutation_map(c, np.random.default_rng(int(seed)))
    if rng is None:
        raise ConfigError("concept: 'random' needs a 'seed' (or an rng passed by the caller)")
    return random_permutation_map(c, rng)


def fedrc_concepts(num_classes: int) -> list[LabelMap]:
    """FedRC's three concepts: identity, ``y -> C-1-y`` and ``y -> (y+1) mod C``.

    These follow the FedRC code and appendix H.8; the main text's ``C - y`` would map class 0
    out of range. For ``C = 2`` the last two coincide.
    """
    c = _check_num_classes(num_classes)
    return [identity_map(c), reverse_map(c), shift_map(c, 1)]
