"""The config layer: every schema of a run, loaded from YAML with dotted overrides, and errors
of one line. It knows only :mod:`fedshift.core` (names are checked against the registries a
layer up, when a run is built).

- :mod:`~fedshift.config.schema`: the run config (:class:`RunConfig` and its sections), YAML,
  overrides, dumping;
- :mod:`~fedshift.config.scenario`, :mod:`~fedshift.config.drift`,
  :mod:`~fedshift.config.label_noise`, :mod:`~fedshift.config.memory`: the scenario, drift,
  label-noise and memory sections.
"""

from fedshift.config.execution import FlowerConfig, OutputConfig, RayConfig, TrackingConfig
from fedshift.config.schema import (
    EXECUTION_KEYS,
    AlgorithmConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    ServerOptimizerConfig,
    TrainConfig,
    apply_overrides,
    dump_config,
    load_config,
    parse_config_text,
    parse_value,
    read_config_file,
    validate_config,
    with_plugins_resolved,
)

__all__ = [
    "EXECUTION_KEYS",
    "AlgorithmConfig",
    "EvalConfig",
    "ModelConfig",
    "OutputConfig",
    "FlowerConfig",
    "RayConfig",
    "RunConfig",
    "ServerOptimizerConfig",
    "TrackingConfig",
    "TrainConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
    "parse_config_text",
    "parse_value",
    "read_config_file",
    "validate_config",
    "with_plugins_resolved",
]
