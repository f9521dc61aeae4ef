"""Raw dataset sources: find, parse and return datasets as plain numpy arrays.

Every dataset is returned as a :class:`RawDataset` (images channels-last ``uint8``, tabular data
``float32``, labels ``int64``). File-based datasets are looked up, in order, in

1. the explicit ``data_dir`` argument, else the ``FEDSHIFT_DATA`` environment variable;
2. well-known locations: ``/usr/share/datasets`` (Debian's ``dataset-*`` packages),
   ``<cache>/data`` and ``~/data``, where ``<cache>`` is ``FEDSHIFT_CACHE`` or
   ``~/.cache/fedshift``;
3. if ``download=True``, a download into ``<cache>/data`` (via torchvision, imported lazily).

Under each base directory several sub-folder spellings are accepted (each source lists its own).
Decoded JPEG datasets are cached as uncompressed ``.npz`` files under ``<cache>/decoded``.

Each dataset is a plug-in: a module of this package registers a function in :data:`DATASETS`,
``@DATASETS.register("fmnist", "fashion-mnist", ...)``, with the signature
``load(data_dir, download, *, <options>) -> RawDataset``; its keyword-only parameters are the
options :func:`load_dataset` accepts for it. The built-in modules are imported on the first
lookup. Shared helpers: :mod:`.lookup` (directories, download, not-found errors), :mod:`.cache`
(the decoded-array cache) and :mod:`.formats` (IDX, CIFAR pickles, JPEG).

This package never imports torch at import time.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshift.core.errors import FedshiftError, did_you_mean
from fedshift.core.registry import Registry
from fedshift.data.sources.formats import check_labels, read_idx
from fedshift.data.sources.lookup import cache_root, search_dirs

if TYPE_CHECKING:
    from fedshift.data.concepts import DecisionConcept

__all__ = [
    "DATASETS",
    "RawDataset",
    "cache_root",
    "channel_stats",
    "dataset_names",
    "dataset_options",
    "load_dataset",
    "read_idx",
    "resolve_name",
    "search_dirs",
]


@dataclass(frozen=True, eq=False)
class RawDataset:
    """A dataset as numpy arrays, before any partitioning, shift or tensor conversion."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str
    #: optional per-sample integer generative factors (e.g. dSprites orientation, a digit
    #: domain), by name; the same names in both splits (attribute skew reads them)
    factors_train: dict[str, np.ndarray] = field(default_factory=dict)
    factors_test: dict[str, np.ndarray] = field(default_factory=dict)
    #: optional readable names of a factor's values (index -> name), e.g. domain: mnist, usps
    factor_values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: optional concepts of the dataset's own, decision rules of the input
    #: (:class:`~fedshift.data.concepts.DecisionConcept`), picked by index in
    #: ``scenario.concepts`` (the drift streams: :mod:`.streams`); ``y_train``/``y_test`` are
    #: then the labels under concept 0
    concepts: tuple[DecisionConcept, ...] = ()
    #: optional concept kinds the dataset offers: kind -> ``build(arg, **params)``, for specs
    #: such as ``"sea:8"`` or ``{kind: sea, theta: 8}`` (keyword-only parameters: the keys)
    concept_kinds: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise ValueError(f"{self.name}: inputs and labels differ in length")
        bad = [c for c in self.concepts if c.num_classes != self.num_classes]
        if bad:
            raise ValueError(f"{self.name}: concept {bad[0].name} has another number of classes")
        if len(self.classes) != self.num_classes:
            raise ValueError(
                f"{self.name}: {len(self.classes)} class names for {self.num_classes} classes"
            )
        if set(self.factors_train) != set(self.factors_test):
            raise ValueError(
                f"{self.name}: train factors {sorted(self.factors_train)} differ from test "
                f"factors {sorted(self.factors_test)}"
            )
        for split, factors, n in (
            ("train", self.factors_train, len(self.y_train)),
            ("test", self.factors_test, len(self.y_test)),
        ):
            for key, values in factors.items():
                values = np.asarray(values)
                if values.shape != (n,) or not np.issubdtype(values.dtype, np.integer):
                    raise ValueError(
                        f"{self.name}: factor {key!r} of the {split} split must be {n} integers, "
                        f"got {values.dtype} {values.shape}"
                    )

    @property
    def factor_names(self) -> tuple[str, ...]:
        """The names of the per-sample factors, in order."""
        return tuple(self.factors_train)

    def factor_value_name(self, factor: str, value: int) -> str:
        """A factor value as text: its name when known (``usps``), else the integer."""
        names = self.factor_values.get(factor, ())
        return names[value] if 0 <= value < len(names) else str(value)

    @classmethod
    def of_images(
        cls,
        name: str,
        where: Path,
        arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        classes: tuple[str, ...],
        mean: tuple[float, ...],
        std: tuple[float, ...],
        source: str,
        **factors: Any,
    ) -> RawDataset:
        """A dataset from decoded (x_train, y_train, x_test, y_test), its labels checked
        against ``classes`` (an error naming ``where`` otherwise) and cast to int64;
        ``factors`` are passed on (``factors_train``, ``factors_test``, ``factor_values``)."""

        x_tr, y_tr, x_te, y_te = arrays
        check_labels(where, classes, y_tr, y_te)
        return cls(
            name=name,
            x_train=x_tr,
            y_train=np.asarray(y_tr, dtype=np.int64),
            x_test=x_te,
            y_test=np.asarray(y_te, dtype=np.int64),
            num_classes=len(classes),
            classes=classes,
            mean=mean,
            std=std,
            source=source,
            **factors,
        )

    @property
    def is_image(self) -> bool:
        """True for image data ``[N, H, W, C]``."""
        return self.x_train.ndim == 4

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample (``(H, W, C)`` or ``(D,)``)."""
        return tuple(int(s) for s in self.x_train.shape[1:])


def channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[tuple[float, ...], ...]:
    """Per-channel mean and std of uint8 images [N, H, W, C] in [0, 1], in chunks (no full
    float copy of a large dataset)."""
    c = x.shape[-1]
    total, sq, n = np.zeros(c), np.zeros(c), 0
    for i in range(0, len(x), chunk):
        part = x[i : i + chunk].reshape(-1, c).astype(np.float64) / 255.0
        total += part.sum(axis=0)
        sq += (part * part).sum(axis=0)
        n += len(part)
    mean = total / max(n, 1)
    std = np.sqrt(np.maximum(sq / max(n, 1) - mean**2, 1e-6))
    return tuple(float(m) for m in mean), tuple(float(v) for v in std)


#: ``load(data_dir, download, *, <options>) -> RawDataset``
DataSource = Callable[..., RawDataset]

#: The built-in source modules, imported on the first lookup; :func:`dataset_names` lists their
#: datasets in this order.
_SOURCE_MODULES = (
    "mnist",
    "cifar10",
    "cifar100",
    "tinyimagenet",
    "digits",
    "synthetic",
    "streams",
    "digit_domains",
    "dsprites",
    "shapes3d",
    "domain_folders",
    "hub",
)


def _import_sources() -> None:
    for module in _SOURCE_MODULES:
        importlib.import_module(f"{__name__}.{module}")


#: Every dataset by canonical name (aliases accepted, case-insensitive).
DATASETS: Registry[DataSource] = Registry("dataset", loader=_import_sources)


def dataset_names() -> list[str]:
    """Canonical dataset names: the built-in ones in :data:`_SOURCE_MODULES` order (also when a
    source module was imported before the first lookup), then any others as registered."""
    rank = {f"{__name__}.{m}": i for i, m in enumerate(_SOURCE_MODULES)}
    names = DATASETS.in_order()
    return sorted(names, key=lambda n: rank.get(DATASETS.get(n).__module__, len(rank)))


def resolve_name(name: str) -> str:
    """Map a (case-insensitive) name or alias to its canonical name."""
    return DATASETS.canonical(name)


def dataset_options(name: str) -> tuple[str, ...]:
    """The options dataset ``name`` accepts: its source's keyword-only parameters, in order."""
    params = inspect.signature(DATASETS.get(name)).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def load_dataset(
    name: str, data_dir: str | Path | None = None, *, download: bool = True, **options: Any
) -> RawDataset:
    """Load dataset ``name`` (case-insensitive, aliases accepted) as a :class:`RawDataset`.

    ``data_dir`` overrides ``FEDSHIFT_DATA``; ``download`` allows a torchvision download into the
    cache when no local copy is found; ``options`` are dataset-specific (e.g. for ``synthetic``).
    """
    canonical = resolve_name(name)
    allowed = dataset_options(canonical)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise FedshiftError(
            f"dataset {canonical!r} does not accept option(s) {', '.join(unknown)}"
            f"{did_you_mean(unknown[0], allowed)}; "
            f"allowed: {', '.join(allowed) if allowed else '(none)'}"
        )
    return DATASETS.get(canonical)(data_dir, download, **options)
