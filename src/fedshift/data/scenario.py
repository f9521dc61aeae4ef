"""Builds a federated dataset (:class:`~fedshift.data.federated.FederatedData`) from a
:class:`ScenarioConfig`: the one place that knows the four builders, a scenario without time
(:mod:`~fedshift.data.static`), time steps (:mod:`~fedshift.data.timeline`), drift at any round
(:mod:`~fedshift.data.drift`) and attribute skew (:mod:`~fedshift.data.attributes`), and adds
label noise (:mod:`~fedshift.data.label_noise`), validation splits and the leakage audit.
"""

from __future__ import annotations

from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError, FedshiftError, UnknownNameError, did_you_mean
from fedshift.data.attributes import build_attribute_scenario
from fedshift.data.audit import audit
from fedshift.data.drift import build_drift
from fedshift.data.features import CORRUPTION_POOLS, expand_styles, parse_style
from fedshift.data.federated import Client, FederatedData
from fedshift.data.label_noise import apply_label_noise
from fedshift.data.partition import label_histogram
from fedshift.data.sources import RawDataset, load_dataset
from fedshift.data.static import build_static
from fedshift.data.timeline import build_timeline

__all__ = ["Client", "FederatedData", "build_scenario", "check_styles"]


def build_scenario(
    cfg: ScenarioConfig, seed: int = 0, data_dir: str | None = None, raw: RawDataset | None = None
) -> FederatedData:
    """Build the federated dataset described by ``cfg`` (deterministic given the seed), with
    its leakage audit in ``meta["audit"]`` (and, with label noise, its summary in
    ``meta["label_noise"]``)."""
    seed = cfg.seed if cfg.seed is not None else seed
    check_styles(cfg)
    raw = raw or load_dataset(cfg.dataset, data_dir, **cfg.dataset_options)
    if cfg.timeline is not None:
        data = build_timeline(cfg, seed, raw)
    elif cfg.drift is not None:
        data = build_drift(cfg, seed, raw)
    elif cfg.attributes is not None:
        data = build_attribute_scenario(cfg, seed, raw)
    else:
        data = build_static(cfg, seed, raw)
    if cfg.label_noise is not None:  # before the carve: validation labels are noisy too
        apply_label_noise(data, cfg.label_noise, seed)
    if cfg.validation_fraction > 0:
        carve_validation(data, cfg.validation_fraction, seed)
    data.meta["audit"] = audit(data)
    return data


def carve_validation(data: FederatedData, fraction: float, seed: int) -> None:
    """Hold out a share ``fraction`` of every training client's training split (at every time
    step) as its validation split, in place; records that share a training split (steps of
    ``scenario.drift``) get the same carve. Each client keeps at least one training sample."""
    import numpy as np
    import torch

    done: dict[int, tuple] = {}
    records = [*data.clients, *(c for st in data.steps or [] for c in st)]
    records += [c.prev for c in records if c.prev is not None]  # what methods train on too
    for c in records:
        key = id(c.train_idx)
        if key not in done:
            n = c.num_train
            k = min(int(round(n * fraction)), n - 1)
            perm = np.random.default_rng([seed, 12, c.cid, c.version]).permutation(n)
            val, tr = torch.from_numpy(np.sort(perm[:k])), torch.from_numpy(np.sort(perm[k:]))
            done[key] = (
                c.train_idx[tr], c.y_train[tr], c.train_idx[val], c.y_train[val],
                label_histogram(c.y_train[tr].numpy(), data.num_classes),
                c.train_idx,  # held, so that no other tensor takes its id while we go
            )  # fmt: skip
        c.train_idx, c.y_train, c.val_idx, c.y_val, c.label_hist, _ = done[key]


def check_styles(cfg: ScenarioConfig) -> None:
    """Every feature style the scenario names is one (a known corruption, pool, rotation or
    colour, a severity in 1..5), used or not: else a one-line ConfigError naming its key, before
    any data is loaded."""
    specs = [("scenario.feature_shift.styles", s) for s in expand_styles(cfg.feature_shift.styles)]
    for i, c in enumerate(cfg.mix.clients or []):
        if c.style != "any":
            specs.append((f"scenario.mix.clients.{i}.style", c.style))
    tl = cfg.timeline
    if tl is not None:
        specs += [(f"scenario.timeline.steps.{i}.style", st.style) for i, st in enumerate(tl.steps)]
        specs += [("scenario.timeline.test_styles", s) for s in tl.test_styles or []]
    for i, ev in enumerate(cfg.drift.events if cfg.drift is not None else []):
        if ev.kind == "incremental":
            specs.append((f"scenario.drift.events.{i}.style", ev.style))
    for key, spec in specs:
        try:
            parse_style(spec)
        except FedshiftError as err:
            pool = did_you_mean(spec, ["all", *CORRUPTION_POOLS])
            if isinstance(err, UnknownNameError) and "did you mean" not in str(err) and pool:
                pools = ", ".join(["all", *CORRUPTION_POOLS])
                raise ConfigError(
                    f"config: {key}: unknown feature style {spec!r}{pool}; the pools are "
                    f"{pools} (`fedshift list` names every corruption)"
                ) from None
            raise ConfigError(f"config: {key}: {err}") from None
