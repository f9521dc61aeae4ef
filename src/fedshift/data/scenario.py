"""Builds a federated dataset (:class:`~fedshift.data.federated.FederatedData`) from a
:class:`ScenarioConfig`: the one place that knows the three builders, a scenario without time
(:mod:`~fedshift.data.static`), time steps (:mod:`~fedshift.data.timeline`) and attribute skew
(:mod:`~fedshift.data.attributes`), and adds the leakage audit.
"""

from __future__ import annotations

from fedshift.data.attributes import build_attribute_scenario
from fedshift.data.audit import audit
from fedshift.data.federated import Client, FederatedData
from fedshift.data.sources import RawDataset, load_dataset
from fedshift.data.static import build_static
from fedshift.data.timeline import build_timeline
from fedshift.scenario_config import ScenarioConfig

__all__ = ["Client", "FederatedData", "build_scenario"]


def build_scenario(
    cfg: ScenarioConfig, seed: int = 0, data_dir: str | None = None, raw: RawDataset | None = None
) -> FederatedData:
    """Build the federated dataset described by ``cfg`` (deterministic given the seed), with
    its leakage audit in ``meta["audit"]``."""
    seed = cfg.seed if cfg.seed is not None else seed
    raw = raw or load_dataset(cfg.dataset, data_dir, **cfg.dataset_options)
    if cfg.timeline is not None:
        data = build_timeline(cfg, seed, raw)
    elif cfg.attributes is not None:
        data = build_attribute_scenario(cfg, seed, raw)
    else:
        data = build_static(cfg, seed, raw)
    data.meta["audit"] = audit(data)
    return data
