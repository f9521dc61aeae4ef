"""Drift over time: a scenario of T steps, in which every client gets new data at each step.

Per step the config names the concepts present and one feature style for every image of the
step (FedDAA rotates all images by 0/120/240 degrees). Two ways to hand out data:

- ``pieces`` (FedDAA, spec feddaa.md §5.4): the training set is cut into pieces (equal IID
  pieces with ``label_shift.kind: iid``, the authors' construction; any other partitioner gives
  each piece its own label distribution, i.e. label drift as a client changes piece), each
  with a fixed concept by block (pieces 0..P/n-1 follow concept 0, and so on). At each step
  the step's concepts share the clients equally; a concept's pieces are dealt out as often as
  needed (each piece ``n // pieces`` times, then a random subset of the remainder once more)
  and the deal is shuffled. With 60 clients and 60 pieces this is the authors' deal: every
  piece twice at step 1 (2 concepts), 15 pieces and 5 duplicates per concept at step 2
  (3 concepts), a permutation from step 3 (4 concepts).
- ``switch``: each client keeps its own partition (``label_shift``) for the whole run and
  starts on a concept (round robin over the first step's); at a step, a share ``switch`` of
  the clients (and every client whose concept is gone) moves to another of the step's
  concepts. A simple drift scenario for new users.

The train/test split of a piece (``split``): ``fixed`` (the default) splits every piece once,
so no client's test image is ever trained on, by anyone, at any step; ``per_load`` splits it
anew whenever a client receives it (per step and client), as the authors' code re-splits every
piece it loads (spec feddaa.md §5.4.3, §7.17): a piece keeps its concept, so most test images
of a step were trained on before with the same label. :mod:`fedshift.data.audit` measures it.

Every client record knows its previous step's record (``Client.prev``), so algorithms can use
the previous data S^{t-1} and diagnostics know who truly drifted. Test tasks are test-only
clients for every (concept, style) pair, built from the official test set. Styled images are
made once per (piece or client, style) and added to the pool.
"""

from __future__ import annotations

import numpy as np
import torch

from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError
from fedshift.data.features import FeatureStyle, parse_style
from fedshift.data.federated import (
    Client,
    FederatedData,
    Pool,
    assemble,
    balanced_test,
    label_maps,
    split_indices,
    test_origin,
    training_pool,
)
from fedshift.data.partition import label_histogram, make_partitioner
from fedshift.data.sources import RawDataset


def step_styles(cfg: ScenarioConfig) -> list[FeatureStyle]:
    styles = [parse_style(s.style) for s in cfg.timeline.steps]
    for s in styles:
        if s.kind == "corruption" and s.severity == 0:
            raise ConfigError(f"timeline step style {s.label()!r} needs a severity, e.g. fog/3")
    return styles


def deal_pieces(
    piece_concepts: np.ndarray, active: list[int], num_clients: int, rng: np.random.Generator
) -> np.ndarray:
    """The piece of each client at a step: the active concepts share the clients equally (the
    first ones get one more when it does not divide), each concept's pieces dealt as evenly as
    possible, then shuffled."""
    counts = [
        num_clients // len(active) + (i < num_clients % len(active)) for i in range(len(active))
    ]
    deal = []
    for c, n in zip(active, counts, strict=True):
        own = np.flatnonzero(piece_concepts == c)
        if len(own) == 0:
            raise ConfigError(f"timeline: concept {c} has no pieces; raise timeline.pieces")
        extra = rng.choice(own, size=n % len(own), replace=False)
        deal.append(np.concatenate([np.tile(own, n // len(own)), extra]))
    return rng.permutation(np.concatenate(deal))


def switch_concepts(
    prev: np.ndarray | None, active: list[int], share: float, num_clients: int, rng
) -> np.ndarray:
    """Each client's concept at a step of the ``switch`` assignment: round robin over the
    active concepts in a random client order at the first step; later, a share of the clients
    (and every client whose concept is gone) moves to another active concept."""
    if prev is None:
        return np.asarray(active)[rng.permutation(num_clients) % len(active)]
    n = len(prev)
    out = prev.copy()
    movers = set(rng.permutation(n)[: int(round(share * n))].tolist())
    movers |= {i for i in range(n) if prev[i] not in active}
    for i in sorted(movers):
        others = [c for c in active if c != prev[i]] or active
        out[i] = others[rng.integers(len(others))]
    return out


def build_timeline(cfg: ScenarioConfig, seed: int, raw: RawDataset) -> FederatedData:
    """The FederatedData of a drift scenario: the clients of every step (``steps``), the
    first step's as ``clients``, and the test tasks."""
    tl = cfg.timeline
    rng = np.random.default_rng([seed, 1])
    C, K = raw.num_classes, cfg.num_clients
    concepts = label_maps(cfg, C, seed, raw)
    styles = step_styles(cfg)
    if not raw.is_image and any(s.kind != "clean" for s in styles):
        raise ConfigError(f"dataset {raw.name!r} is not an image dataset: use clean step styles")
    base_x, base_y, src = training_pool(cfg, raw, rng)
    pool = Pool([base_x, raw.x_test], [src, test_origin(raw)])
    if tl.assignment == "pieces":
        units, unit_concepts = _pieces(cfg, base_y, rng)
    else:
        units, unit_concepts = _partition(cfg, base_y, K, rng), None
    fixed = [
        split_indices(np.arange(len(u)), cfg.test_fraction, np.random.default_rng([seed, 3, i]))
        for i, u in enumerate(units)
    ]
    steps: list[list[Client]] = []
    prev_concepts = None
    for t, (st, style) in enumerate(zip(tl.steps, styles, strict=True), start=1):
        step_rng = np.random.default_rng([seed, 5, t])
        if tl.assignment == "pieces":
            which = deal_pieces(unit_concepts, st.concepts, K, step_rng)
            cons = unit_concepts[which]
        else:
            which = np.arange(K)
            cons = switch_concepts(prev_concepts, st.concepts, st.switch, K, step_rng)
        prev_concepts = cons
        clients = []
        for k in range(K):
            u = int(which[k])
            part = units[u]
            idx = pool.styled(("train", u), part, base_x[part], style, seed)
            tr, te = (
                fixed[u]
                if tl.split == "fixed"  # the authors' code: a new split at every load
                else split_indices(
                    np.arange(len(part)), cfg.test_fraction, np.random.default_rng([seed, 3, t, k])
                )
            )
            lm = concepts[int(cons[k])]
            y_tr = lm.apply(base_y[part[tr]], base_x[part[tr]])
            y_te = lm.apply(base_y[part[te]], base_x[part[te]])
            clients.append(
                Client(
                    cid=k,
                    concept=int(cons[k]),
                    label_map=lm,
                    style=style,
                    train_idx=torch.from_numpy(np.asarray(idx)[tr].astype(np.int64)),
                    test_idx=torch.from_numpy(np.asarray(idx)[te].astype(np.int64)),
                    y_train=torch.from_numpy(y_tr.astype(np.int64)),
                    y_test=torch.from_numpy(y_te.astype(np.int64)),
                    label_hist=label_histogram(y_tr, C),
                    step=t,
                    prev=steps[-1][k] if steps else None,
                    version=t,
                )
            )
        steps.append(clients)
    tests = (
        _test_tasks(cfg, raw, concepts, styles, pool, len(base_x), seed)
        if cfg.test_clients.enabled
        else []
    )
    key = cfg.hash(seed)
    data = assemble(
        raw,
        pool.arrays,
        steps[0],
        tests,
        concepts,
        key,
        origin=pool.origin,
        steps=steps,
        rounds_per_step=tl.rounds_per_step,
    )
    data.step = 1
    return data


def _partition(cfg: ScenarioConfig, base_y: np.ndarray, n: int, rng) -> list[np.ndarray]:
    return make_partitioner(cfg.label_shift.kind, **cfg.label_shift.params()).split(base_y, n, rng)


def _pieces(cfg: ScenarioConfig, base_y: np.ndarray, rng: np.random.Generator):
    """The pieces of the training pool and each piece's concept (by block). ``label_shift``
    makes the pieces: ``iid`` cuts equal IID pieces (the FedDAA code's), any other partitioner
    gives each piece its own label distribution, so a client's P(y) changes with its piece at
    every step (label drift, FedDAA's Table 5: ``dirichlet_equal`` with alpha = DP)."""
    P = cfg.timeline.pieces or cfg.num_clients
    size = len(base_y) // P
    if size < 2:
        raise ConfigError(f"timeline: {P} pieces of {len(base_y)} samples are too small")
    if cfg.label_shift.kind == "iid":
        perm = rng.permutation(len(base_y))
        pieces = [np.sort(perm[i * size : (i + 1) * size]) for i in range(P)]
    else:
        pieces = _partition(cfg, base_y, P, rng)
    return pieces, (np.arange(P) * len(cfg.concepts)) // P


def _test_tasks(cfg, raw, concepts, styles, pool: Pool, offset: int, seed: int) -> list[Client]:
    """A test-only client per (concept, style): the balanced official test set, relabelled by
    the concept and styled, split into a labelled adaptation part and a scored part."""
    C, K = raw.num_classes, cfg.num_clients
    tl = cfg.timeline
    task_styles = (
        [parse_style(s) for s in tl.test_styles] if tl.test_styles else list(dict.fromkeys(styles))
    )
    sel = balanced_test(
        raw.y_test, C, cfg.test_clients.max_samples, np.random.default_rng([seed, 4])
    )
    n_adapt = int(len(sel) * cfg.test_clients.adapt_fraction)
    out = []
    for style in task_styles:
        idx = pool.styled(("test",), sel + offset, raw.x_test[sel], style, seed)
        adapt, score = idx[:n_adapt], idx[n_adapt:]
        for k, lm in enumerate(concepts):
            a, s = sel[:n_adapt], sel[n_adapt:]
            y_a, y_s = (
                lm.apply(raw.y_test[a], raw.x_test[a]),
                lm.apply(raw.y_test[s], raw.x_test[s]),
            )
            out.append(
                Client(
                    cid=K + len(out),
                    concept=k,
                    label_map=lm,
                    style=style,
                    train_idx=torch.from_numpy(np.asarray(adapt).astype(np.int64)),
                    test_idx=torch.from_numpy(np.asarray(score).astype(np.int64)),
                    y_train=torch.from_numpy(y_a.astype(np.int64)),
                    y_test=torch.from_numpy(y_s.astype(np.int64)),
                    label_hist=label_histogram(y_a, C),
                    test_only=True,
                )
            )
    return out
