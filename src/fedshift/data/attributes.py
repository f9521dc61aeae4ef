"""Attribute-skew scenarios (DFL, spec dfl.md §5.1-5.2): clients share the labels and differ in
a nuisance attribute.

``kind: color`` gives client k of N the colour HSV(k/N, saturation, value): as the background
behind a white digit (``mode: background``) or as the digit's colour on black
(``foreground``), by x = m * c_fg + (1 - m) * c_bg with m the grey intensity in [0, 1] (the
channel mean for RGB sources). The clients' pools are an equal random split of the data.
``colors_per_client: m`` (a test bed where a within-client term can see colour, not the
paper's set-up) gives client k the m palette hues j/N of j = (k + floor(i * N / m)) mod N,
i < m, and deals them to its train split and to its test split in equal shares at random;
``hue_jitter: h`` moves every sample's hue by a uniform draw from [-h, h] (mod 1). The colour
of every pool entry is recorded in ``meta["attributes"]``: ``color`` (its palette index j) and
``hue`` (the hue painted), read per client as ``meta["attributes"]["hue"][c.train_idx.cpu()]``.

``kind: factor`` deals the V distinct values of a generative factor of the dataset
(``RawDataset.factors_*``: dSprites orientation, 3Dshapes scale, a digit domain) to the N
clients: one each when N == V, round robin when N < V (value i to client i % N), and when
N > V client k gets value k % V, the clients sharing a value splitting its samples disjointly
(the spec's choice for 3Dshapes' 8 scales over 10 clients). A client's pool is the samples of
its value(s).

Each pool is split into a test part and a disjoint training part by ``test_ratio`` and
``train_ratio`` (fractions of the pool). ``pool: all`` pools the source's train and test sets
first (the spec's recipe); ``pool: split`` draws the training part from the source's train set
and the test part from its test set. Every client has concept 0 (identity labels) and its
attribute as its style (:class:`AttributeStyle`, e.g. "bg hue 0.05", "orientation 3"), the
ground truth for clustering scores; there are no test-only clients.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedshift.config.scenario import AttributeSkewConfig, ScenarioConfig
from fedshift.core.errors import ConfigError
from fedshift.data.concepts import identity_map
from fedshift.data.features import FeatureStyle
from fedshift.data.federated import Client, FederatedData, assemble
from fedshift.data.partition import label_histogram
from fedshift.data.sources import RawDataset, channel_stats

Assignment = tuple[tuple[int, ...], int, int]  # (value indices, share index, sharers)


@dataclass(frozen=True)
class AttributeStyle(FeatureStyle):
    """A client's attribute, recorded as its feature style (kind "attribute"); ``name`` is the
    readable attribute, which :meth:`label` returns. Ground truth only: never applied again."""

    kind: str = "attribute"
    name: str = ""

    def __post_init__(self) -> None:  # FeatureStyle only accepts the kinds it can apply
        pass

    def label(self) -> str:
        return self.name


def client_color(k: int, n: int, saturation: float = 1.0, value: float = 0.8) -> np.ndarray:
    """Client k's colour of n: RGB in [0, 1] of HSV(k/n, saturation, value)."""
    return np.asarray(colorsys.hsv_to_rgb(k / n, saturation, value), dtype=np.float32)


def client_palette(k: int, n: int, m: int = 1) -> np.ndarray:
    """Client k's m palette indices of n (its hues j/n), spread round the hue circle:
    j = (k + floor(i * n / m)) mod n for i < m, sorted; [k] when m == 1."""
    return np.sort([(k + (i * n) // m) % n for i in range(m)])


def sample_colors(
    att: AttributeSkewConfig, k: int, n: int, n_train: int, n_test: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(palette index, hue) of each of client k's train then test samples: its palette dealt
    to each split in equal shares (to one sample) in a seeded random order, then each hue
    moved by a uniform draw from [-hue_jitter, hue_jitter] (mod 1)."""
    palette = client_palette(k, n, att.colors_per_client)
    if len(palette) == 1 and att.hue_jitter == 0:  # the paper's set-up: no draw at all
        return np.full(n_train + n_test, k), np.full(n_train + n_test, k / n)
    rng = np.random.default_rng([seed, 14, k])
    m = len(palette)
    which = np.concatenate([rng.permutation(np.arange(s) % m) for s in (n_train, n_test)])
    color = palette[which]
    shift = rng.uniform(-att.hue_jitter, att.hue_jitter, len(color)) if att.hue_jitter else 0.0
    return color, np.mod(color / n + shift, 1.0)


def hue_colors(hues: np.ndarray, saturation: float, value: float) -> np.ndarray:
    """RGB in [0, 1] of HSV(hue, saturation, value) per hue, as ``[N, 1, 1, 3]`` (one colour
    per image, for :func:`paint`); the same numbers as :func:`client_color` of hue k/n."""
    rgb = [colorsys.hsv_to_rgb(float(h), saturation, value) for h in hues]
    return np.asarray(rgb, dtype=np.float32).reshape(-1, 1, 1, 3)


def paint(images: np.ndarray, fg: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """x = m * fg + (1 - m) * bg per pixel, m = grey intensity in [0, 1] (channel mean);
    uint8 [N, H, W, 3]. ``fg``/``bg``: one RGB colour, or one per image (``[N, 1, 1, 3]``)."""
    m = images.astype(np.float32).mean(axis=-1, keepdims=True) / 255.0
    out = m * np.asarray(fg, np.float32) + (1.0 - m) * np.asarray(bg, np.float32)
    return np.clip(np.rint(out * 255.0), 0, 255).astype(np.uint8)


def color_pair(mode: str, color: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(foreground, background): a white digit on ``color``, or a ``color`` digit on black."""
    if mode == "background":
        return np.ones(3, np.float32), color
    return color, np.zeros(3, np.float32)


def assign_values(num_values: int, num_clients: int) -> list[Assignment]:
    """Each client's factor values (indices into the sorted distinct values) and its share of
    them: one value each (N == V), round robin (N < V), or value k % V shared by the clients
    k, k + V, ... which split its samples (N > V; share index k // V of the sharers)."""
    if num_clients <= num_values:
        return [(tuple(range(k, num_values, num_clients)), 0, 1) for k in range(num_clients)]
    return [
        ((k % num_values,), k // num_values, len(range(k % num_values, num_clients, num_values)))
        for k in range(num_clients)
    ]


def factor_pools(
    values: np.ndarray, distinct: np.ndarray, assignment: list[Assignment], seed: int, stream: int
) -> list[np.ndarray]:
    """The sample indices of each client: those whose value is one of its values; sharers of
    a value split its samples by one seeded permutation, so their parts are disjoint."""
    pools = []
    for vals, share, sharers in assignment:
        idx = np.flatnonzero(np.isin(values, distinct[list(vals)]))
        if sharers > 1:
            rng = np.random.default_rng([seed, 12, stream, vals[0]])
            idx = np.sort(np.array_split(rng.permutation(idx), sharers)[share])
        pools.append(idx)
    return pools


def equal_pools(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random split of ``range(n)`` into ``num_clients`` pools of (nearly) equal size."""
    return [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]


def split_pool(
    pool: np.ndarray, train_ratio: float, test_ratio: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint (train, test) parts of a pool: ``round(ratio * len(pool))`` random samples each
    (train trimmed when the two round up past the pool)."""
    idx = rng.permutation(pool)
    n_test = int(round(test_ratio * len(idx)))
    n_train = min(int(round(train_ratio * len(idx))), len(idx) - n_test)
    return np.sort(idx[n_test : n_test + n_train]), np.sort(idx[:n_test])


def client_pools(
    att: AttributeSkewConfig, raw: RawDataset, num_clients: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) indices of every client into the source's train and test sets pooled
    (test-set samples at ``len(y_train) + i``)."""
    n_tr, n_te = len(raw.y_train), len(raw.y_test)
    if att.kind == "factor":
        v_tr, v_te = raw.factors_train[att.factor], raw.factors_test[att.factor]
        distinct = np.unique(np.concatenate([v_tr, v_te]))
        assignment = assign_values(len(distinct), num_clients)
    else:
        v_tr, v_te = np.zeros(n_tr, np.int64), np.zeros(n_te, np.int64)

    def group(values: np.ndarray, stream: int) -> list[np.ndarray]:
        if att.kind == "color":
            return equal_pools(len(values), num_clients, np.random.default_rng([seed, 11, stream]))
        return factor_pools(values, distinct, assignment, seed, stream)

    if att.pool == "all":
        pools = group(np.concatenate([v_tr, v_te]), 2)
        return [
            split_pool(p, att.train_ratio, att.test_ratio, _rng(seed, k))
            for k, p in enumerate(pools)
        ]
    out = []
    for k, (a, b) in enumerate(zip(group(v_tr, 0), group(v_te, 1), strict=True)):
        rng = _rng(seed, k)
        tr = split_pool(a, att.train_ratio, 0.0, rng)[0]
        te = split_pool(b, 0.0, att.test_ratio, rng)[1]
        out.append((tr, te + n_tr))
    return out


def _rng(seed: int, k: int) -> np.random.Generator:
    return np.random.default_rng([seed, 13, k])


def take(raw: RawDataset, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels of indices into the train and test sets pooled."""
    n_tr = len(raw.y_train)
    a, b = idx[idx < n_tr], idx[idx >= n_tr] - n_tr
    x = np.concatenate([raw.x_train[a], raw.x_test[b]])
    return x, np.concatenate([raw.y_train[a], raw.y_test[b]])


def client_styles(att: AttributeSkewConfig, raw: RawDataset, n: int) -> list[AttributeStyle]:
    """Every client's attribute as readable text ("bg hue 0.05", "orientation 3")."""
    if att.kind == "color":
        return [AttributeStyle(name=color_name(att, k, n)) for k in range(n)]
    values = np.concatenate([raw.factors_train[att.factor], raw.factors_test[att.factor]])
    distinct = np.unique(values)
    out = []
    for vals, _, _ in assign_values(len(distinct), n):
        names = ",".join(raw.factor_value_name(att.factor, int(distinct[v])) for v in vals)
        out.append(AttributeStyle(name=f"{att.factor} {names}"))
    return out


def color_name(att: AttributeSkewConfig, k: int, n: int) -> str:
    """Client k's colour(s) as text: "bg hue 0.05", "bg hues 0.05,0.55", "bg hue 0.05 ±0.1"."""
    tag = "bg" if att.mode == "background" else "fg"
    hues = ",".join(f"{j / n:.3g}" for j in client_palette(k, n, att.colors_per_client))
    plural = "s" if att.colors_per_client > 1 else ""
    jitter = f" ±{att.hue_jitter:.3g}" if att.hue_jitter else ""
    return f"{tag} hue{plural} {hues}{jitter}"


def _check(cfg: ScenarioConfig, raw: RawDataset) -> AttributeSkewConfig:
    att = cfg.attributes
    if att.kind == "color" and not raw.is_image:
        raise ConfigError(f"attributes.kind=color needs images; dataset {raw.name!r} has none")
    if att.kind == "factor" and att.factor not in raw.factors_train:
        have = ", ".join(raw.factor_names) or "none"
        raise ConfigError(
            f"scenario.attributes.factor={att.factor!r}: dataset {raw.name!r} has no such "
            f"factor (it has: {have}); pick one of them or use attributes.kind=color"
        )
    if att.pool == "split" and len(raw.y_test) == 0:
        raise ConfigError(
            f"attributes.pool=split needs a test set, but dataset {raw.name!r} has all its "
            "samples in the training set; use attributes.pool=all"
        )
    return att


def paint_client(
    att: AttributeSkewConfig, x: np.ndarray, k: int, n: int, n_train: int, seed: int
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Client k's images (train then test) painted, and each one's (palette index, hue). One
    colour per client (the default) paints with :func:`client_color` as it always did."""
    color, hue = sample_colors(att, k, n, n_train, len(x) - n_train, seed)
    if att.colors_per_client == 1 and att.hue_jitter == 0:
        rgb = client_color(k, n, att.saturation, att.value)
    else:
        rgb = hue_colors(hue, att.saturation, att.value)
    return paint(x, *color_pair(att.mode, rgb)), (color, hue)


def build_attribute_scenario(cfg: ScenarioConfig, seed: int, raw: RawDataset) -> FederatedData:
    """The FederatedData of an attribute-skew scenario (deterministic given ``seed``)."""
    att = _check(cfg, raw)
    n = cfg.num_clients
    styles = client_styles(att, raw, n)
    lm = identity_map(raw.num_classes)
    pool: list[np.ndarray] = []
    colors: list[tuple[np.ndarray, np.ndarray]] = []  # (palette index, hue) per pool entry
    clients: list[Client] = []
    offset = 0
    for k, (tr, te) in enumerate(client_pools(att, raw, n, seed)):
        if len(tr) == 0:
            raise ConfigError(
                f"attribute skew: client {k} ({styles[k].label()}) gets no training samples; "
                "raise attributes.train_ratio, lower num_clients or use more data"
            )
        x, y = take(raw, np.concatenate([tr, te]))
        if att.kind == "color":
            x, drawn = paint_client(att, x, k, n, len(tr), seed)
            colors.append(drawn)
        pool.append(x)
        y_tr, y_te = y[: len(tr)], y[len(tr) :]
        clients.append(
            Client(
                cid=k,
                concept=0,
                label_map=lm,
                style=styles[k],
                train_idx=torch.arange(offset, offset + len(tr), dtype=torch.int64),
                test_idx=torch.arange(offset + len(tr), offset + len(x), dtype=torch.int64),
                y_train=torch.from_numpy(y_tr.astype(np.int64)),
                y_test=torch.from_numpy(y_te.astype(np.int64)),
                label_hist=label_histogram(y_tr, raw.num_classes),
            )
        )
        offset += len(x)
    if att.kind == "color":  # the colours change the statistics: normalise by the clients'
        train = np.concatenate([p[: c.num_train] for p, c in zip(pool, clients, strict=True)])
        mean, std = channel_stats(train)
        raw = replace(raw, mean=mean, std=std)
    key = cfg.hash(seed)
    data = assemble(raw, pool, clients, [], [lm], key)
    data.meta["attributes"] = {"kind": att.kind, "styles": [s.label() for s in styles]}
    if colors:  # every pool entry's colour: its palette index and the hue it was painted in
        data.meta["attributes"]["color"] = np.concatenate([c for c, _ in colors])
        data.meta["attributes"]["hue"] = np.concatenate([h for _, h in colors])
    return data
