"""The federated dataset (:class:`FederatedData`, :class:`Client`) and the pieces every
scenario builder assembles it from: the training pool, the concepts' label maps, per-client
splits, balanced test sets and :func:`assemble`.

The builders (:mod:`~fedshift.data.static`, :mod:`~fedshift.data.timeline`,
:mod:`~fedshift.data.drift`, :mod:`~fedshift.data.attributes`) import this module and nothing imports them back except
:mod:`~fedshift.data.scenario`, which picks one. All images live once in one pool tensor; a
client is index arrays into the pool plus its own (mapped) label arrays and its ground truth.
A scenario never knows about models.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError, FedshiftError
from fedshift.data.augment import CropFlip, crop_flip
from fedshift.data.concepts import Concept, make_concept
from fedshift.data.features import FeatureStyle, apply_style
from fedshift.data.sources import RawDataset

CLEAN = FeatureStyle(kind="clean", name="clean")


@dataclass(frozen=True)
class NoiseRecord:
    """The truth of a noisy client's label noise (``scenario.label_noise``): the pool indices
    of its training samples whose label was flipped, with the label before (after the concept's
    label map) and after the flip. Empty arrays when no label of the client flipped."""

    idx: np.ndarray  # int64 pool indices (into FederatedData.x), sorted
    original: np.ndarray  # int64 labels before the flip
    noisy: np.ndarray  # int64 labels after it (what the client trains on)

    def __len__(self) -> int:
        return len(self.idx)


@dataclass
class Client:
    """One client: pool indices, its labels (after its label map) and its ground truth."""

    cid: int
    concept: int
    label_map: Concept  # a label map or a decision rule of the input
    style: FeatureStyle
    train_idx: torch.Tensor  # int64 indices into FederatedData.x
    test_idx: torch.Tensor
    y_train: torch.Tensor  # int64 labels after the client's label map
    y_test: torch.Tensor
    label_hist: np.ndarray  # counts of the client's (mapped) training labels
    test_only: bool = False
    step: int = 0  # time step the data belongs to (drift scenarios; 0 without time)
    prev: Client | None = None  # the same client's record at the previous time step
    version: int = 0  # changes whenever the client's data changes (drift scenarios)
    # a validation split carved from the training split (scenario.validation_fraction)
    val_idx: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    # ground truth of scenario.label_noise: None for a clean client
    noise: NoiseRecord | None = None

    @property
    def noisy(self) -> bool:
        """Ground truth: the client is one of the scenario's noisy clients (label noise)."""
        return self.noise is not None

    @property
    def num_train(self) -> int:
        return int(self.train_idx.numel())

    @property
    def drifted(self) -> bool:
        """Ground truth: the client's concept differs from the previous step's (real drift)."""
        return self.prev is not None and self.prev.concept != self.concept

    @property
    def task(self) -> str:
        """The name of a test-only client's task: ``c<concept>``, with ``@<style>`` when the
        images are styled (e.g. ``c1@rotate(120)``)."""
        return (
            f"c{self.concept}"
            if self.style.kind == "clean"
            else f"c{self.concept}@{self.style.label()}"
        )

    @property
    def num_test(self) -> int:
        return int(self.test_idx.numel())

    def to(self, device: torch.device | str) -> Client:
        for name in ("train_idx", "test_idx", "y_train", "y_test", "val_idx", "y_val"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        return self


@dataclass
class FederatedData:
    """The federated dataset: one pool of inputs, clients as index arrays into it.

    Images are kept as uint8 NCHW and normalised per batch by :meth:`inputs`, which keeps the
    device copy four times smaller than float32. Tabular data is kept as float32.
    """

    name: str
    x: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    mean: torch.Tensor
    std: torch.Tensor
    clients: list[Client]
    test_clients: list[Client]
    concepts: list[Concept]
    source: str
    step: int = 0
    meta: dict = field(default_factory=dict)
    # drift scenarios: the clients of every time step (``clients`` is the current step's)
    steps: list[list[Client]] | None = None
    rounds_per_step: int = 0  # steps of equal length (timeline); 0: see step_starts
    # scenario.drift: the first round of every step (steps of any length; none evaluated at
    # its end), who may take part in each round (bool [clients, rounds]; None: everyone) and
    # every client's drift onsets (bool [clients, rounds])
    step_starts: list[int] | None = None
    availability: np.ndarray | None = None
    drift_onsets: np.ndarray | None = None
    # provenance of every pool entry, for the leakage audit (:mod:`fedshift.data.audit`): the
    # source image (raw train index, or ``len(x_train) + j`` for test image j) and its raw class
    origin: np.ndarray | None = None
    raw_label: np.ndarray | None = None

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def num_steps(self) -> int:
        return len(self.steps) if self.steps else 0

    def step_of_round(self, rnd: int) -> int:
        """The (1-based) time step of round ``rnd`` (0 without time)."""
        if not self.steps:
            return 0
        if self.step_starts is not None:
            return int(np.searchsorted(self.step_starts, rnd, side="right"))
        return min(self.num_steps, (rnd - 1) // self.rounds_per_step + 1)

    def starts_step(self, rnd: int) -> bool:
        """Whether the data changes at round ``rnd`` (round 1 starts the first step)."""
        return bool(self.steps) and (
            rnd == 1 or self.step_of_round(rnd) != self.step_of_round(rnd - 1)
        )

    def ends_step(self, rnd: int) -> bool:
        """Whether round ``rnd`` is the last of a step of equal-length steps (a timeline's
        protocol scores every step's end; steps of ``scenario.drift`` are not scored so)."""
        return bool(self.steps) and self.step_starts is None and rnd % self.rounds_per_step == 0

    def available(self, rnd: int) -> list[int] | None:
        """The clients that may take part in round ``rnd`` (None: every client)."""
        if self.availability is None:
            return None
        col = min(rnd, self.availability.shape[1]) - 1
        return np.flatnonzero(self.availability[:, col]).tolist()

    def at_step(self, step: int) -> FederatedData:
        """This data with the clients of time step ``step`` (itself without time)."""
        if not self.steps or step == self.step:
            return self
        return replace(self, clients=self.steps[step - 1], step=step)

    def active_concepts(self) -> int:
        """Number of distinct concepts among the current clients."""
        return len({c.concept for c in self.clients})

    @property
    def is_image(self) -> bool:
        return self.x.ndim == 4

    @property
    def has_validation(self) -> bool:
        return any(c.val_idx is not None for c in self.clients)

    def validation_view(self) -> FederatedData:
        """This data with every training client's validation split as its test split and no
        test-only clients: evaluating it scores the models on validation, never on test."""
        clients = [replace(c, test_idx=c.val_idx, y_test=c.y_val) for c in self.clients]
        return replace(self, clients=clients, test_clients=[])

    def to(self, device: torch.device | str) -> FederatedData:
        self.x = self.x.to(device)
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        moved: dict[int, torch.Tensor] = {}  # records of several steps share their tensors
        for c in [*self.clients, *self.test_clients, *(c for st in self.steps or [] for c in st)]:
            for name in ("train_idx", "test_idx", "y_train", "y_test", "val_idx", "y_val"):
                t = getattr(c, name)
                if t is None:
                    continue
                if id(t) not in moved:
                    moved[id(t)] = t.to(device)
                setattr(c, name, moved[id(t)])
        return self

    def inputs(self, idx: torch.Tensor, aug: CropFlip | None = None) -> torch.Tensor:
        """Float model inputs for pool indices ``idx`` (normalised images or raw features),
        augmented by ``aug`` on the raw pixels first when given (training only)."""
        xb = self.x[idx]
        if aug is not None:
            xb = crop_flip(xb, aug.params, aug.padding)
        if xb.dtype == torch.uint8:
            return (xb.float().div_(255.0) - self.mean) / self.std
        return xb


# ----------------------------------------------------------------------------- assembly


class Pool:
    """The input arrays of a scenario, appended in order, with the source id of every entry
    (for the leakage audit); styled copies are made once per (source, style) and their pool
    indices remembered."""

    def __init__(self, arrays: list[np.ndarray], origins: list[np.ndarray]) -> None:
        self.arrays = list(arrays)
        self.origin = np.concatenate(origins)
        self.size = sum(len(a) for a in arrays)
        self._styled: dict[tuple, np.ndarray] = {}

    def add(self, images: np.ndarray, origin: np.ndarray) -> np.ndarray:
        """Append ``images`` (whose source ids are ``origin``); their pool indices."""
        idx = np.arange(self.size, self.size + len(images))
        self.arrays.append(images)
        self.origin = np.concatenate([self.origin, origin])
        self.size += len(images)
        return idx

    def styled(
        self, key: tuple, base_idx: np.ndarray, images: np.ndarray, style: FeatureStyle, seed
    ):
        """Pool indices of ``images`` (at pool ``base_idx``) in ``style``; made on first use."""
        if style.kind == "clean" or (style.kind == "rotate" and style.angle % 360 == 0):
            return base_idx
        k = (*key, style.label())
        if k not in self._styled:
            stable = zlib.crc32(repr(k).encode())  # not hash(): it differs between processes
            rng = np.random.default_rng([seed, 9, stable])
            self._styled[k] = self.add(apply_style(images, style, rng), self.origin[base_idx])
        return self._styled[k]


def label_maps(
    cfg: ScenarioConfig, num_classes: int, seed: int, raw: RawDataset | None = None
) -> list[Concept]:
    """The scenario's concepts: label maps (random permutations seeded per concept), or the
    dataset's own decision rules (``raw.concepts``, ``raw.concept_kinds``); a bad spec is a
    one-line ConfigError naming its key (``scenario.concepts.<i>``)."""
    out = []
    for i, spec in enumerate(cfg.concepts):
        try:
            rng = np.random.default_rng([seed, 2, i])
            out.append(make_concept(spec, num_classes, rng, raw))
        except FedshiftError as err:
            why = str(err).removeprefix("concept: ")
            raise ConfigError(f"config: scenario.concepts.{i}: {why}") from None
    return out


def training_pool(cfg: ScenarioConfig, raw: RawDataset, rng: np.random.Generator):
    """The training images, labels and source indices (into ``raw.x_train``) clients are made
    from: an optional random subset (``train_fraction_of_dataset``), made long-tailed
    (``long_tail``), optionally concatenated ``copies`` times (a source image then appears
    several times)."""
    base_x, base_y, src = raw.x_train, raw.y_train, np.arange(len(raw.y_train))
    if cfg.train_fraction_of_dataset < 1:
        keep = np.sort(
            rng.permutation(len(base_y))[: int(len(base_y) * cfg.train_fraction_of_dataset)]
        )
        base_x, base_y, src = base_x[keep], base_y[keep], src[keep]
    if cfg.long_tail is not None:
        keep = long_tail_keep(base_y, raw.num_classes, cfg.long_tail, rng)
        base_x, base_y, src = base_x[keep], base_y[keep], src[keep]
    if cfg.copies > 1:
        base_x, base_y, src = (
            np.concatenate([base_x] * cfg.copies),
            np.concatenate([base_y] * cfg.copies),
            np.concatenate([src] * cfg.copies),
        )
    if cfg.num_clients > len(base_y):
        raise ConfigError(
            f"scenario.num_clients={cfg.num_clients} is more than the {len(base_y)} training "
            "samples; lower num_clients or raise train_fraction_of_dataset"
        )
    return base_x, base_y, src


def long_tail_shares(num_classes: int, imbalance: float) -> np.ndarray:
    """The share of its images class c keeps in a long-tailed set: ``imbalance ** (-c / (C - 1))``
    (class 0 keeps all, the last class ``1 / imbalance``)."""
    if num_classes < 2:
        return np.ones(num_classes)
    return imbalance ** (-np.arange(num_classes) / (num_classes - 1))


def long_tail_keep(
    y: np.ndarray, num_classes: int, imbalance: float, rng: np.random.Generator
) -> np.ndarray:
    """Sorted indices of a random long-tailed subset of labels ``y`` (at least one image of every
    class that has one)."""
    shares = long_tail_shares(num_classes, imbalance)
    keep = []
    for c in range(num_classes):
        idx = np.flatnonzero(y == c)
        if len(idx):
            n = max(1, int(round(len(idx) * shares[c])))
            keep.append(rng.permutation(idx)[:n])
    return np.sort(np.concatenate(keep)) if keep else np.arange(0)


def split_indices(idx: np.ndarray, frac_test: float, rng: np.random.Generator):
    """A random (train, test) split of ``idx`` with a ``frac_test`` share tested (at least one
    sample trains)."""
    idx = rng.permutation(idx)
    n_test = int(round(len(idx) * frac_test))
    if len(idx) - n_test < 1:
        n_test = len(idx) - 1
    return idx[: len(idx) - n_test], idx[len(idx) - n_test :]


def balanced_test(y: np.ndarray, num_classes: int, max_samples: int | None, rng) -> np.ndarray:
    """Indices of a label-balanced subset of the test set (shuffled)."""
    per = min(int((y == c).sum()) for c in range(num_classes))
    if max_samples is not None:
        per = max(1, min(per, max_samples // num_classes))
    sel = [rng.permutation(np.flatnonzero(y == c))[:per] for c in range(num_classes)]
    return rng.permutation(np.concatenate(sel))


def same_channels(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Grayscale images repeated to RGB when any array is RGB (a colour style was applied)."""
    c = max(a.shape[-1] for a in arrays)
    return [np.repeat(a, c, axis=-1) if a.shape[-1] != c else a for a in arrays]


def _to_nchw(x: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.permute(0, 3, 1, 2).contiguous() if t.ndim == 4 else t


def test_origin(raw: RawDataset) -> np.ndarray:
    """The source ids of the official test images (after the training images')."""
    return len(raw.y_train) + np.arange(len(raw.y_test))


def assemble(
    raw: RawDataset,
    pool: list[np.ndarray],
    clients: list[Client],
    test_clients: list[Client],
    concepts: list[Concept],
    key: str,
    origin: np.ndarray | None = None,
    **extra,
) -> FederatedData:
    """The FederatedData of a pool of input arrays (concatenated in order: the clients'
    indices point into it) and its clients; normalisation from the dataset. ``origin``: the
    source id of every pool entry (see :func:`test_origin`), for the leakage audit.

    Tabular data whose source gives a mean and std per feature (the drift streams) is
    standardised here, once, in the pool (the labels were made from the raw features before);
    other tabular data is kept as it is."""
    if raw.is_image:
        pool = same_channels(pool)
    x = _to_nchw(np.concatenate(pool))
    if raw.is_image:
        shape = tuple(x.shape[1:])
        mean = torch.tensor(raw.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(raw.std, dtype=torch.float32).view(1, -1, 1, 1)
        if shape[0] != mean.shape[1]:  # e.g. grayscale coloured to RGB
            mean = mean.mean().repeat(shape[0]).view(1, -1, 1, 1)
            std = std.mean().repeat(shape[0]).view(1, -1, 1, 1)
    else:
        x = x.float()
        shape = tuple(x.shape[1:])
        if len(raw.mean) == len(raw.std) == (shape[0] if len(shape) == 1 else -1):
            mu = torch.tensor(raw.mean, dtype=torch.float32)
            x = (x - mu) / torch.tensor(raw.std, dtype=torch.float32)
        mean, std = torch.zeros(1), torch.ones(1)
    return FederatedData(
        name=raw.name,
        x=x,
        num_classes=raw.num_classes,
        input_shape=shape,
        mean=mean,
        std=std,
        clients=clients,
        test_clients=test_clients,
        concepts=concepts,
        source=raw.source,
        meta={"scenario_hash": key},
        origin=origin,
        raw_label=None if origin is None else np.concatenate([raw.y_train, raw.y_test])[origin],
        **extra,
    )
