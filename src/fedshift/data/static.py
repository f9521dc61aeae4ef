"""The scenario without time (:func:`build_static`): the dataset source -> label shift
(partition) -> client types (concept id and feature style per client) -> feature styles
(applied once, cached on disk by the scenario's hash) -> concept shift (per-client label maps)
-> per-client train/test split -> test-only clients (one per concept, from the official test
set, balanced labels).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError
from fedshift.data.features import (
    CORRUPTIONS_VERSION,
    FeatureStyle,
    apply_style,
    expand_styles,
    parse_style,
)
from fedshift.data.federated import (
    CLEAN,
    Client,
    FederatedData,
    assemble,
    balanced_test,
    label_maps,
    same_channels,
    split_indices,
    test_origin,
    training_pool,
)
from fedshift.data.partition import label_histogram, make_partitioner
from fedshift.data.sources import RawDataset


def build_static(cfg: ScenarioConfig, seed: int, raw: RawDataset) -> FederatedData:
    """A scenario without time: the label partition, client types, styles, concepts."""
    rng = np.random.default_rng([seed, 1])
    C = raw.num_classes
    concepts = label_maps(cfg, C, seed, raw)
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
    key = cfg.hash(seed)
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
        tr, te = split_indices(local_perm, cfg.test_fraction, np.random.default_rng([seed, 3, i]))
        lm = concepts[concept]
        y_tr = lm.apply(base_y[part[tr]], base_x[part[tr]])
        y_te = lm.apply(base_y[part[te]], base_x[part[te]])
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
        sel = balanced_test(
            raw.y_test, C, cfg.test_clients.max_samples, np.random.default_rng([seed, 4])
        )
        n_adapt = int(len(sel) * cfg.test_clients.adapt_fraction)
        adapt, score = sel[:n_adapt], sel[n_adapt:]
        for k, lm in enumerate(concepts):
            y_a = lm.apply(raw.y_test[adapt], raw.x_test[adapt])
            y_s = lm.apply(raw.y_test[score], raw.x_test[score])
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
    out = same_channels(out)
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
