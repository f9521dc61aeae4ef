"""Builds a ``scenario.drift`` scenario: each client's data at every round from the plan of
:mod:`fedshift.data.drift_plan`.

The training pool is cut into one partition unit per client by ``label_shift`` (two per client
when a ``label`` event needs a second partition); every unit is split into train and test
parts once, so no test image is ever trained on. A client's data at a round takes the samples
of its part *a* not given to part *b* (the last ``1 - share`` of a's parts, in a fixed random
order) and the first ``share`` of b's, each labelled by its part's concept, all in the round's
style (styled copies made once per unit and style).

Rounds with the same data for every client form a *step* (``FederatedData.steps``, starting at
the rounds ``step_starts``): the simulator changes data, and drift-aware methods look at it,
where a step starts. A client's record at a step is the record it had before (same data,
``prev`` None) or a new one whose ``prev`` is its last different record, so a method comparing
``prev`` with the current data sees exactly the clients whose data changed.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError
from fedshift.data.drift_plan import DATA_FIELDS, DriftPlan, compile_plan
from fedshift.data.features import parse_style
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


def step_starts(plan: DriftPlan) -> list[int]:
    """The rounds where some client's data differs from the round before (round 1 first)."""
    changed = plan.data_changes().any(axis=0)
    return [1, *(int(r) + 1 for r in np.flatnonzero(changed[1:]) + 1)]


class _Records:
    """Each client's record per distinct plan entry, made once."""

    def __init__(self, cfg, raw, plan: DriftPlan, units, splits, base_x, base_y, pool, seed):
        self.cfg, self.raw, self.plan, self.units, self.splits = cfg, raw, plan, units, splits
        self.base_x, self.base_y, self.pool, self.seed = base_x, base_y, pool, seed
        self.made: dict[tuple, Client] = {}
        self.versions: dict[int, int] = {}

    def _part(self, unit: int, which: int, style, lo: float, hi: float) -> tuple:
        """Pool indices, raw labels and raw inputs of a share [lo, hi) of a unit's train (0)
        or test (1) part (the inputs before any style: what a concept's rule reads)."""
        u = self.units[unit]
        pos = self.splits[unit][which]
        a, b = int(round(lo * len(pos))), int(round(hi * len(pos)))
        styled = self.pool.styled(("train", unit), u, self.base_x[u], style, self.seed)
        src = u[pos[a:b]]
        return np.asarray(styled)[pos[a:b]], self.base_y[src], self.base_x[src]

    def get(self, k: int, spec: tuple) -> Client:
        if (k, spec) in self.made:
            return self.made[(k, spec)]
        ca, cb, ua, ub, share, style_i = spec
        style = parse_style(self.plan.styles[style_i])
        maps = self.plan.maps
        parts = {}
        for which in (0, 1):
            ia, ya, xa = self._part(ua, which, style, share, 1.0)
            ib, yb, xb = self._part(ub, which, style, 0.0, share) if share > 0 else ([], [], None)
            idx = np.concatenate([ia, np.asarray(ib, dtype=np.int64)]).astype(np.int64)
            yb = maps[cb].apply(np.asarray(yb, np.int64), xb)
            y = np.concatenate([maps[ca].apply(ya, xa), yb])
            parts[which] = (idx, y.astype(np.int64))
        truth = cb if share >= 0.5 else ca
        self.versions[k] = self.versions.get(k, -1) + 1
        rec = Client(
            cid=k,
            concept=int(truth),
            label_map=maps[truth],
            style=style,
            train_idx=torch.from_numpy(parts[0][0]),
            test_idx=torch.from_numpy(parts[1][0]),
            y_train=torch.from_numpy(parts[0][1]),
            y_test=torch.from_numpy(parts[1][1]),
            label_hist=label_histogram(parts[0][1], self.raw.num_classes),
            version=self.versions[k],
        )
        self.made[(k, spec)] = rec
        return rec


def build_drift(cfg: ScenarioConfig, seed: int, raw: RawDataset) -> FederatedData:
    """The FederatedData of a ``scenario.drift`` scenario: its steps (rounds with the same data
    for every client), their first rounds, who may take part in each round and the onsets of
    every event, and test tasks for every concept x {clean, each incremental event's end}."""
    K, C = cfg.num_clients, raw.num_classes
    rng = np.random.default_rng([seed, 1])
    plan = compile_plan(cfg.drift, K, label_maps(cfg, C, seed, raw), seed)
    if not raw.is_image and len(plan.styles) > 1:
        raise ConfigError(f"dataset {raw.name!r} is not an image dataset: no incremental drift")
    base_x, base_y, src = training_pool(cfg, raw, rng)
    n_units = 2 * K if plan.uses_second_partition else K
    if n_units > len(base_y):
        raise ConfigError(f"{n_units} partitions of {len(base_y)} samples: use fewer clients")
    spec = cfg.label_shift
    units = make_partitioner(spec.kind, **spec.params()).split(base_y, n_units, rng)
    splits = []
    for i, u in enumerate(units):
        tr, te = split_indices(
            np.arange(len(u)), cfg.test_fraction, np.random.default_rng([seed, 3, i])
        )
        splits.append((tr, te))
    pool = Pool([base_x, raw.x_test], [src, test_origin(raw)])
    made = _Records(cfg, raw, plan, units, splits, base_x, base_y, pool, seed)
    starts = step_starts(plan)
    steps: list[list[Client]] = []
    last: dict[int, Client] = {}
    for s, r in enumerate(starts, start=1):
        clients = []
        for k in range(K):
            rec = made.get(k, plan.spec(k, r))
            before = last.get(k)
            changed = before is not None and before is not rec
            clients.append(replace(rec, step=s, prev=before if changed else None))
            last[k] = rec
        steps.append(clients)
    tests = _test_tasks(cfg, raw, plan, pool, len(base_x), seed) if cfg.test_clients.enabled else []
    data = assemble(
        raw,
        pool.arrays,
        steps[0],
        tests,
        plan.maps,
        cfg.hash(seed),
        origin=pool.origin,
        steps=steps,
        step_starts=starts,
        availability=None if plan.available.all() else plan.available,
        drift_onsets=plan.onset,
    )
    data.step = 1
    return data


def _test_tasks(cfg, raw, plan: DriftPlan, pool: Pool, offset: int, seed: int) -> list[Client]:
    """A test-only client per (concept, style): the balanced official test set relabelled by
    the concept, in each final style."""
    K, C = cfg.num_clients, raw.num_classes
    sel = balanced_test(
        raw.y_test, C, cfg.test_clients.max_samples, np.random.default_rng([seed, 4])
    )
    n_adapt = int(len(sel) * cfg.test_clients.adapt_fraction)
    out = []
    for spec in plan.final_styles:
        style = parse_style(spec)
        idx = np.asarray(pool.styled(("test",), sel + offset, raw.x_test[sel], style, seed))
        for k, lm in enumerate(plan.maps):
            y = lm.apply(raw.y_test[sel], raw.x_test[sel])
            out.append(
                Client(
                    cid=K + len(out),
                    concept=k,
                    label_map=lm,
                    style=style,
                    train_idx=torch.from_numpy(idx[:n_adapt].astype(np.int64)),
                    test_idx=torch.from_numpy(idx[n_adapt:].astype(np.int64)),
                    y_train=torch.from_numpy(y[:n_adapt].astype(np.int64)),
                    y_test=torch.from_numpy(y[n_adapt:].astype(np.int64)),
                    label_hist=label_histogram(y[:n_adapt], C),
                    test_only=True,
                )
            )
    return out


__all__ = ["DATA_FIELDS", "build_drift", "step_starts"]
