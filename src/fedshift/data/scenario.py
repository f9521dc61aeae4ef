"""Builds a federated dataset (:class:`FederatedData`) from a :class:`ScenarioConfig`.

The pieces are applied in order: dataset source -> label shift (partition) -> client types
(concept id and feature style per client) -> feature styles (applied once, cached on disk by
config hash) -> concept shift (per-client label maps) -> per-client train/test split -> test-only
clients (one per concept, from the official test set, balanced labels).

All images live once in one pool tensor; a client is index arrays into the pool plus its own
(mapped) label arrays and its ground truth. A scenario never knows about models.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from fedshift.data.audit import audit
from fedshift.data.augment import CropFlip, crop_flip
from fedshift.data.concepts import LabelMap, make_label_map
from fedshift.data.features import (
    CORRUPTIONS_VERSION,
    FeatureStyle,
    apply_style,
    expand_styles,
    parse_style,
)
from fedshift.data.partition import label_histogram, make_partitioner
from fedshift.data.sources import RawDataset, load_dataset
from fedshift.errors import ConfigError
from fedshift.scenario_config import ScenarioConfig

CLEAN = FeatureStyle(kind="clean", name="clean")


@dataclass
class Client:
    """One client: pool indices, its labels (after its label map) and its ground truth."""

    cid: int
    concept: int
    label_map: LabelMap
    style: FeatureStyle
    train_idx: torch.Tensor  # int64 indices into FederatedData.x
    test_idx: torch.Tensor
    y_train: torch.Tensor  # int64 labels after the client's label map
    y_test: torch.Tensor
    label_hist: np.ndarray  # counts of the client's (mapped) training labels
    test_only: bool = False
    step: int = 0  # time step the data belongs to (drift scenarios; 0 without time)
    prev: Client | None = None  # the same client's record at the previous time step

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
        for name in ("train_idx", "test_idx", "y_train", "y_test"):
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
    concepts: list[LabelMap]
    source: str
    step: int = 0
    meta: dict = field(default_factory=dict)
    # drift scenarios: the clients of every time step (``clients`` is the current step's)
    steps: list[list[Client]] | None = None
    rounds_per_step: int = 0
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
        return min(self.num_steps, (rnd - 1) // self.rounds_per_step + 1)

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

    def to(self, device: torch.device | str) -> FederatedData:
        self.x = self.x.to(device)
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        for c in [*self.clients, *self.test_clients, *(c for st in self.steps or [] for c in st)]:
            c.to(device)
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


# ----------------------------------------------------------------------------- building


def _allowed_styles(cfg: ScenarioConfig) -> list[FeatureStyle]:
    return [parse_style(s) for s in expand_styles(list(cfg.feature_shift.styles))]


def _client_types(
    cfg: ScenarioConfig, rng: np.random.Generator
) -> list[tuple[int, FeatureStyle | None]]:
    """(concept, style) per client; a style of None means 'draw one'."""
    m = cfg.num_clients
    if cfg.mix.clients is not None:
        return [
            (c.concept, None if c.style == "any" else parse_style(c.style)) for c in cfg.mix.clients
        ]
    types = cfg.mix.types or []
    raw = np.array([t.fraction * m for t in types])
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: m - counts.sum()]:
        counts[i] += 1  # largest remainder, so counts sum to m
    out: list[tuple[int, FeatureStyle | None]] = []
    for t, n in zip(types, counts, strict=True):
        for j in range(n):
            out.append((t.concepts[j % len(t.concepts)], None if t.feature else CLEAN))
    order = rng.permutation(m)
    return [out[i] for i in order]


def _draw_style(
    style: FeatureStyle | None,
    allowed: list[FeatureStyle],
    severities: list[int],
    rng: np.random.Generator,
) -> FeatureStyle:
    if style is None:
        if not allowed:
            raise ConfigError("scenario.feature_shift.styles is empty but some clients need one")
        style = allowed[rng.integers(len(allowed))]
    if style.kind == "corruption" and style.severity == 0:
        sev = int(severities[rng.integers(len(severities))])
        style = FeatureStyle(kind=style.kind, name=style.name, severity=sev)
    return style


def _cache_root() -> Path:
    return Path(os.environ.get("FEDSHIFT_CACHE", Path.home() / ".cache" / "fedshift"))


def _styled_images(
    images: np.ndarray, parts: list[np.ndarray], styles: list[FeatureStyle], key: str, seed: int
) -> list[np.ndarray]:
    """Apply each client's style to its images, cached on disk under ``key``. A cache file is
    reused only when it holds the same clients, the same style labels and the current
    :data:`~fedshift.data.features.CORRUPTIONS_VERSION`."""
    todo = [i for i, s in enumerate(styles) if s.kind != "clean"]
    if not todo:
        return []
    labels = np.array([styles[i].label() for i in todo])
    path = _cache_root() / "scenarios" / f"{key}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as f:
            same = (
                "styles" in f
                and "version" in f
                and int(f["version"]) == CORRUPTIONS_VERSION
                and list(f["clients"]) == todo
                and list(f["styles"]) == list(labels)
            )
            if same:
                flat, offs = f["images"], f["offsets"]
                return [flat[offs[j] : offs[j + 1]] for j in range(len(todo))]
    out = []
    for i in todo:
        rng = np.random.default_rng([seed, 7, i])
        out.append(apply_style(images[parts[i]], styles[i], rng))
    out = _same_channels(out)
    offsets = np.cumsum([0] + [len(o) for o in out])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    os.close(fd)
    with open(tmp, "wb") as fh:
        np.savez(
            fh,
            clients=np.array(todo),
            styles=labels,
            version=np.array(CORRUPTIONS_VERSION),
            images=np.concatenate(out),
            offsets=offsets,
        )
    os.replace(tmp, path)
    return out


def _same_channels(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Grayscale images repeated to RGB when any array is RGB (a colour style was applied)."""
    c = max(a.shape[-1] for a in arrays)
    return [np.repeat(a, c, axis=-1) if a.shape[-1] != c else a for a in arrays]


def _to_nchw(x: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.permute(0, 3, 1, 2).contiguous() if t.ndim == 4 else t


def _split(idx: np.ndarray, frac_test: float, rng: np.random.Generator):
    idx = rng.permutation(idx)
    n_test = int(round(len(idx) * frac_test))
    if len(idx) - n_test < 1:
        n_test = len(idx) - 1
    return idx[: len(idx) - n_test], idx[len(idx) - n_test :]


def _balanced_test(y: np.ndarray, num_classes: int, max_samples: int | None, rng) -> np.ndarray:
    """Indices of a label-balanced subset of the test set (shuffled)."""
    per = min(int((y == c).sum()) for c in range(num_classes))
    if max_samples is not None:
        per = max(1, min(per, max_samples // num_classes))
    sel = [rng.permutation(np.flatnonzero(y == c))[:per] for c in range(num_classes)]
    return rng.permutation(np.concatenate(sel))


def label_maps(cfg: ScenarioConfig, num_classes: int, seed: int) -> list[LabelMap]:
    """The scenario's concepts as label maps (random permutations seeded per concept)."""
    return [
        make_label_map(s, num_classes, np.random.default_rng([seed, 2, i]))
        for i, s in enumerate(cfg.concepts)
    ]


def training_pool(cfg: ScenarioConfig, raw: RawDataset, rng: np.random.Generator):
    """The training images, labels and source indices (into ``raw.x_train``) clients are made
    from: an optional random subset (``train_fraction_of_dataset``), optionally concatenated
    ``copies`` times (a source image then appears several times)."""
    base_x, base_y, src = raw.x_train, raw.y_train, np.arange(len(raw.y_train))
    if cfg.train_fraction_of_dataset < 1:
        keep = np.sort(
            rng.permutation(len(base_y))[: int(len(base_y) * cfg.train_fraction_of_dataset)]
        )
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


def build_scenario(
    cfg: ScenarioConfig, seed: int = 0, data_dir: str | None = None, raw: RawDataset | None = None
) -> FederatedData:
    """Build the federated dataset described by ``cfg`` (deterministic given the seed), with
    its leakage audit in ``meta["audit"]``."""
    seed = cfg.seed if cfg.seed is not None else seed
    raw = raw or load_dataset(cfg.dataset, data_dir, **cfg.dataset_options)
    if cfg.timeline is not None:
        from fedshift.data.timeline import build_timeline

        data = build_timeline(cfg, seed, raw)
    elif cfg.attributes is not None:
        from fedshift.data.attributes import build_attribute_scenario

        data = build_attribute_scenario(cfg, seed, raw)
    else:
        data = _build_static(cfg, seed, raw)
    data.meta["audit"] = audit(data)
    return data


def _build_static(cfg: ScenarioConfig, seed: int, raw: RawDataset) -> FederatedData:
    """A scenario without time: the label partition, client types, styles, concepts."""
    rng = np.random.default_rng([seed, 1])
    C = raw.num_classes
    concepts = label_maps(cfg, C, seed)
    base_x, base_y, src = training_pool(cfg, raw, rng)

    partitioner = make_partitioner(cfg.label_shift.kind, **cfg.label_shift.params())
    parts = partitioner.split(base_y, cfg.num_clients, rng)

    types = _client_types(cfg, rng)
    allowed = _allowed_styles(cfg)
    styles = [_draw_style(s, allowed, cfg.feature_shift.severities, rng) for _, s in types]
    if not raw.is_image and any(s.kind != "clean" for s in styles):
        raise ConfigError(
            f"dataset {raw.name!r} is not an image dataset: feature styles need images; "
            "set every client type's feature: false"
        )
    from fedshift.config import RunConfig  # local: the hash covers the whole scenario

    key = RunConfig(scenario=cfg, seed=seed).scenario_hash()
    styled = iter(_styled_images(base_x, parts, styles, key, seed))

    # pool = [train base | test set | styled copies]
    pool = [base_x, raw.x_test]
    origin = [src, test_origin(raw)]
    offset = len(base_x) + len(raw.x_test)
    clients = []
    for i, (part, (concept, _), style) in enumerate(zip(parts, types, styles, strict=True)):
        pool_idx = part
        if style.kind != "clean":
            imgs = next(styled)
            pool.append(imgs)
            origin.append(src[part])
            pool_idx = np.arange(offset, offset + len(imgs))
            offset += len(imgs)
        local_perm = np.arange(len(part))
        tr, te = _split(local_perm, cfg.test_fraction, np.random.default_rng([seed, 3, i]))
        lm = concepts[concept]
        y_tr, y_te = lm.apply(base_y[part[tr]]), lm.apply(base_y[part[te]])
        clients.append(
            Client(
                cid=i,
                concept=concept,
                label_map=lm,
                style=style,
                train_idx=torch.from_numpy(pool_idx[tr].astype(np.int64)),
                test_idx=torch.from_numpy(pool_idx[te].astype(np.int64)),
                y_train=torch.from_numpy(y_tr.astype(np.int64)),
                y_test=torch.from_numpy(y_te.astype(np.int64)),
                label_hist=label_histogram(y_tr, C),
            )
        )

    test_clients = []
    if cfg.test_clients.enabled:
        sel = _balanced_test(
            raw.y_test, C, cfg.test_clients.max_samples, np.random.default_rng([seed, 4])
        )
        n_adapt = int(len(sel) * cfg.test_clients.adapt_fraction)
        adapt, score = sel[:n_adapt], sel[n_adapt:]
        for k, lm in enumerate(concepts):
            y_a, y_s = lm.apply(raw.y_test[adapt]), lm.apply(raw.y_test[score])
            test_clients.append(
                Client(
                    cid=cfg.num_clients + k,
                    concept=k,
                    label_map=lm,
                    style=CLEAN,
                    train_idx=torch.from_numpy((adapt + len(base_x)).astype(np.int64)),
                    test_idx=torch.from_numpy((score + len(base_x)).astype(np.int64)),
                    y_train=torch.from_numpy(y_a.astype(np.int64)),
                    y_test=torch.from_numpy(y_s.astype(np.int64)),
                    label_hist=label_histogram(y_a, C),
                    test_only=True,
                )
            )

    return assemble(raw, pool, clients, test_clients, concepts, key, origin=np.concatenate(origin))


def test_origin(raw: RawDataset) -> np.ndarray:
    """The source ids of the official test images (after the training images')."""
    return len(raw.y_train) + np.arange(len(raw.y_test))


def assemble(
    raw: RawDataset,
    pool: list[np.ndarray],
    clients: list[Client],
    test_clients: list[Client],
    concepts: list[LabelMap],
    key: str,
    origin: np.ndarray | None = None,
    **extra,
) -> FederatedData:
    """The FederatedData of a pool of input arrays (concatenated in order: the clients'
    indices point into it) and its clients; normalisation from the dataset. ``origin``: the
    source id of every pool entry (see :func:`test_origin`), for the leakage audit."""
    if raw.is_image:
        pool = _same_channels(pool)
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
