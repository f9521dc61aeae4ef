"""Algorithms registered by name: each module registers its class with ``@register``."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from fedshift.config import RunConfig, TrainConfig
from fedshift.config.schema import EXECUTION_KEYS
from fedshift.core.registry import Registry

#: modules of this package that define the contract, not algorithms
_CONTRACT = frozenset({"base", "registry", "task", "ops", "capabilities", "server_opt"})


def _load_builtin() -> None:
    """Import every algorithm module of this package once, so each registers its class(es)."""
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if mod.name not in _CONTRACT:
            importlib.import_module(f"fedshift.algorithms.{mod.name}")


ALGORITHMS: Registry[type] = Registry("algorithm", loader=_load_builtin)


def register(cls: type) -> type:
    """Class decorator: make an algorithm available under ``cls.name``."""
    if hasattr(cls, "personalised"):  # the flag of old: the engine reads the mixin only
        raise TypeError(
            f"{cls.__name__}: a personalised algorithm names the Personalised mixin at its class "
            f"line (class {cls.__name__}(Personalised, ...)), not a `personalised` attribute"
        )
    return ALGORITHMS.add(cls.name, cls)


def algorithm_names() -> list[str]:
    return ALGORITHMS.names()


def get_algorithm(name: str) -> type:
    """The algorithm class registered under ``name`` (case-insensitive)."""
    return ALGORITHMS.get(name)


def algorithm_defaults(cfg: RunConfig) -> dict[str, Any]:
    """The training settings a run takes from its algorithm's reference code (the algorithm's
    ``reference_train``) because the config leaves them unset, e.g. ``{"keep_momentum": True}``
    for FedRC; a key the config sets is not listed."""
    ref = getattr(get_algorithm(cfg.algorithm.name), "reference_train", {})
    return {k: v for k, v in ref.items() if getattr(cfg.train, k) is None}


def resolved_train(cfg: RunConfig) -> TrainConfig:
    """The training settings a run uses: the config's, an unset one from the algorithm's
    reference default, else its plain default (keep_momentum: false)."""
    unset = {k: False for k in ("keep_momentum",) if getattr(cfg.train, k) is None}
    return cfg.train.model_copy(update={**unset, **algorithm_defaults(cfg)})


def experiment(cfg: RunConfig) -> dict[str, Any]:
    """The settings that decide a run's numbers: all but where and how it executes
    (:data:`~fedshift.config.schema.EXECUTION_KEYS`, the inference batch), which change them at
    most by float rounding, with the training settings as resolved (:func:`resolved_train`)
    and the content hash of a change-point schedule (recorded, else the file's now).
    Two configs with the same experiment continue each other's runs."""
    out = cfg.model_dump(mode="json")
    for key in EXECUTION_KEYS:
        out.pop(key)
    out["eval"].pop("batch_size")
    out["train"] = resolved_train(cfg).model_dump(mode="json")
    drift = cfg.scenario.drift
    if drift is not None and drift.schedule is not None:  # the file's content, not its name
        out["scenario"]["drift"]["schedule"]["sha256"] = drift.schedule.identity()
    return out
