"""Run configuration: pydantic models, YAML loading and dotted ``key=value`` overrides.

A config is validated as a whole before anything runs. Every mistake (an unknown key, a wrong
type, an impossible value) becomes a :class:`~fedshift.core.errors.ConfigError` whose one-line
message names the key and what is allowed.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from fedshift.config.base import Strict
from fedshift.config.execution import (
    FlowerConfig,
    OutputConfig,
    RayConfig,
    TrackingConfig,
    parse_sinks,
)
from fedshift.config.memory import MemoryConfig
from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.plugins import load_plugins, resolve


class ModelConfig(Strict):
    name: str = "auto"
    pretrained: bool = False
    norm: Literal["batch", "group"] = "batch"
    width: int | None = Field(default=None, ge=1)
    head_bias: bool = Field(default=True, description="whether the linear head has a bias")
    block_norm: bool = Field(
        default=True,
        description="resnet18: normalisation inside the residual branches (false: the FedNH "
        "code's --no_norm, kept in the stem and shortcuts)",
    )


class AlgorithmConfig(Strict):
    name: str = "fedavg"
    params: dict[str, Any] = Field(default_factory=dict)


class ServerOptimizerConfig(Strict):
    """A server optimiser on the pseudo-gradient of every averaged model (see
    :mod:`fedshift.algorithms.server_opt`): FedAvgM (sgd with momentum), FedAdam, FedYogi,
    FedAdagrad, composable with any algorithm that averages models."""

    kind: Literal["sgd", "adam", "yogi", "adagrad"]
    lr: float = Field(default=1.0, gt=0, description="server learning rate (eta)")
    momentum: float = Field(default=0.0, ge=0, lt=1, description="sgd: server momentum (beta)")
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.99, ge=0, lt=1)
    tau: float = Field(default=1e-3, gt=0, description="adaptivity (adam, yogi, adagrad)")


class TrainConfig(Strict):
    rounds: int = Field(default=200, ge=1)
    participation: float = Field(default=1.0, gt=0, le=1, description="client sampling rate")
    local_epochs: int = Field(default=1, ge=1)
    local_steps: int | None = Field(
        default=None, ge=1, description="fixed number of local steps (overrides local_epochs)"
    )
    local_epochs_max: int | None = Field(
        default=None,
        ge=1,
        description="unequal local work: each client draws its epochs of each round uniformly "
        "from local_epochs..local_epochs_max (FedNova's setting); None: all do local_epochs",
    )
    batch_size: int = Field(default=128, ge=1)
    lr: float = Field(default=0.01, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=5e-4, ge=0)
    drop_last: bool = True
    lr_decay: float = Field(
        default=1.0, gt=0, le=1, description="lr of round t is lr * lr_decay**(t-1)"
    )
    grad_clip: float | None = Field(
        default=None, gt=0, description="clip each client's gradient to this global L2 norm"
    )
    keep_momentum: bool | None = Field(
        default=None,
        description="keep each client's SGD momentum buffers (per model) across rounds, as "
        "the FedRC/FedEM code does (in drift scenarios: until the client's data changes); "
        "false: momentum starts fresh every round; unset: the algorithm's reference default "
        "(fedshift.algorithms.algorithm_defaults), else false",
    )
    augment: Literal["none", "crop_flip"] = Field(
        default="none",
        description="training augmentation: crop_flip = random crop with zero padding "
        "(crop_padding) + horizontal flip, per sample (the FedNH code's CIFAR/TinyImageNet)",
    )
    crop_padding: int = Field(default=4, ge=1, description="padding of crop_flip, in pixels")
    server_optimizer: ServerOptimizerConfig | None = Field(
        default=None,
        description="a server optimiser on the averaged models (e.g. {kind: adam, lr: 0.01}); "
        "None: the algorithm's own (FedAdam & co. declare one), else the plain aggregate",
    )

    clip_updates: float | Literal["median"] | None = Field(
        default=None,
        description="norm-bounded aggregation: clip each client's update of each model "
        "(shared model minus the model it started from; parameters and BatchNorm statistics, "
        "one L2 norm) to this bound before aggregation, or median: the median of the "
        "round's update norms of that model; None: off (see fedshift.algorithms.clipping)",
    )

    @field_validator("clip_updates", mode="before")
    @classmethod
    def _clip_rule(cls, v: Any) -> Any:
        number = isinstance(v, int | float) and not isinstance(v, bool)
        if v is None or v == "median" or (number and math.isfinite(v) and v > 0):
            return v
        raise ValueError(
            f"{v!r} is no clipping rule; use null (off), a positive number (an L2 bound on "
            "each update) or median (the median of the round's update norms)"
        )

    @model_validator(mode="after")
    def _unequal_work(self) -> TrainConfig:
        if self.local_epochs_max is not None:
            if self.local_steps is not None:
                raise ValueError(
                    "local_epochs_max draws epochs per client; it cannot be combined with "
                    "local_steps (remove one)"
                )
            if self.local_epochs_max < self.local_epochs:
                raise ValueError(
                    f"local_epochs_max ({self.local_epochs_max}) is below local_epochs "
                    f"({self.local_epochs}); it is the top of the range local_epochs..max"
                )
        return self


class EvalConfig(Strict):
    every: int = Field(default=1, ge=1, description="evaluate every N rounds (and the last)")
    train_metrics: bool = Field(default=True, description="train accuracy/loss over all clients")
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="inference batch (evaluation, E-steps, prototypes); None: 256 on a CPU, "
        "where smaller batches stay in cache (1.2-1.6x faster for the CNNs), 1024 elsewhere",
    )
    personal: Literal["none", "active", "all"] = Field(
        default="none",
        description="PM(V)/PM(L)/GM of FedNH's protocol: personalised models of the round's "
        "clients (active) or of every client (all; a method whose personal model is the "
        "latest local model skips clients that never trained), scored on the test-only "
        "client of their concept; none: off",
    )


#: RunConfig keys that say where and how a run executes, not what it computes
EXECUTION_KEYS = (
    "name",
    "device",
    "executor",
    "chunk_size",
    "vectorize",
    "clients_in_memory",
    "memory",
    "ray",
    "flower",
    "data_dir",
    "output",
    "log",
    "tracking",
)


class RunConfig(Strict):
    """The whole run."""

    name: str = "run"
    seed: int = Field(default=0, ge=0, description="the run's seed (0 or more)")
    device: str = "auto"
    executor: Literal["auto", "sequential", "batched", "ray"] = Field(
        default="auto",
        description="auto = batched where the algorithm supports it; ray = shards of the round's "
        "clients on Ray actors (see the ray section)",
    )
    chunk_size: int = Field(
        default=64,
        ge=1,
        description="the most clients a batched chunk trains at once; unset, the run's memory "
        "plan may choose fewer (memory.budget), set, it is used as it is",
    )
    vectorize: Literal["auto", "vmap", "loop"] = Field(
        default="auto",
        description="how the batched executor trains a chunk: vmap (one stacked call per "
        "step), loop (client by client, the sequential executor's path) or auto (loop for "
        "convolutional models on a CPU, where grouped convolutions are slower, else vmap)",
    )
    clients_in_memory: int | None = Field(
        default=None,
        ge=1,
        description="keep at most this many clients' large states (model copies, momentum "
        "buffers) in memory, spilling the rest to the run directory, whatever memory.budget "
        "allows; None: as many as the budget holds",
    )
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    flower: FlowerConfig = Field(default_factory=FlowerConfig)
    data_dir: str | None = None
    scenario: ScenarioConfig = Field(default_factory=ScenarioConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    log: list[str] = Field(
        default_factory=list,
        description="tracking sinks the evaluations also go to: tensorboard, wandb, mlflow "
        "(a list, or one comma-separated string)",
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    plugins: list[str] = Field(
        default_factory=list,
        description="your own code imported before the run: .py files or module names that "
        "register algorithms, datasets or models (see fedshift.core.plugins)",
    )

    @field_validator("log", mode="before")
    @classmethod
    def _sinks(cls, v: Any) -> Any:
        return parse_sinks(v)

    @model_validator(mode="after")
    def _load_plugins(self) -> RunConfig:
        # imported on validation, so that the names they register are known to every check
        # that follows and to every process that validates this config
        load_plugins(self.plugins)
        return self

    @model_validator(mode="after")
    def _rounds_of_the_timeline(self) -> RunConfig:
        tl, drift = self.scenario.timeline, self.scenario.drift
        if tl is None and drift is None:
            return self
        if tl is not None:
            total = len(tl.steps) * tl.rounds_per_step
            what = f"the timeline has {len(tl.steps)} steps x {tl.rounds_per_step} rounds"
        else:
            total, what = drift.rounds, "scenario.drift.rounds is"
        if "rounds" in self.train.model_fields_set and self.train.rounds != total:
            raise ValueError(
                f"train.rounds={self.train.rounds} but {what} = {total}; leave train.rounds out "
                f"or set it to {total}"
            )
        object.__setattr__(self.train, "rounds", total)
        return self

    @model_validator(mode="after")
    def _personal_needs_test_clients(self) -> RunConfig:
        if self.eval.personal != "none" and self.scenario.attributes is not None:
            raise ValueError(
                "eval.personal scores personalised models on test-only clients, which "
                "attribute-skew scenarios (scenario.attributes) do not have; set eval.personal=none"
            )
        if self.eval.personal != "none" and not self.scenario.test_clients.enabled:
            raise ValueError(
                "eval.personal scores personalised models on the test-only clients; set "
                "scenario.test_clients.enabled=true (or eval.personal=none)"
            )
        return self

    def scenario_hash(self) -> str:
        """Hash of what determines the federated data (for the on-disk cache)."""
        return self.scenario.hash(self.seed)


# ----------------------------------------------------------------------------- loading


def _format_error(err: ValidationError) -> str:
    """One line: the first problem, with its dotted key and pydantic's reason."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
        parent = _model_at(RunConfig, first["loc"][:-1])
        if parent is not None:
            msg += did_you_mean(str(first["loc"][-1]), parent.model_fields)
            msg += f" (allowed here: {', '.join(parent.model_fields)})"
    elif first["type"] == "literal_error" and isinstance(first.get("input"), str):
        allowed = first.get("ctx", {}).get("expected", "")
        msg += did_you_mean(first["input"], re.findall(r"'([^']*)'", allowed))
    msg = msg.replace("Input should be", "must be").replace("Value error, ", "")
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"config: {loc}: {msg}{more}" if loc else f"config: {msg}{more}"


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class at a location of the config tree, if any."""
    cur: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        cands = [ann, *args]
        for a in list(cands):
            cands.extend(getattr(a, "__args__", ()))
        nxt = next((a for a in cands if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if nxt is None:
            return None
        cur = nxt
    return cur


def validate_config(data: dict[str, Any]) -> RunConfig:
    """Validate a raw config dict; raise ConfigError with a one-line message."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None


def parse_value(text: str) -> Any:
    """Parse the value of a ``key=value`` override as YAML (numbers, lists, booleans)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted ``a.b=c`` overrides applied."""
    out = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. train.rounds=10")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {key}: {p!r} is not a section")
            node = nxt
        node[parts[-1]] = parse_value(value)
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults when ``path`` is None) and apply overrides."""
    data = read_config_file(path) if path is not None else {}
    return validate_config(with_plugins_resolved(apply_overrides(data, overrides or []), path))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a YAML config file, its plugin files resolved (see
    :func:`with_plugins_resolved`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found")
    return with_plugins_resolved(parse_config_text(p.read_text(), f"config file {str(p)!r}"), p)


def with_plugins_resolved(data: dict[str, Any], path: str | Path | None) -> dict[str, Any]:
    """``data`` with its ``plugins`` files made absolute: relative to the current folder, else
    to the folder of the config file ``path`` (so every process that runs it finds them)."""
    if not isinstance(data.get("plugins"), list):
        return data
    base = Path(path).resolve().parent if path is not None else None
    return {**data, "plugins": [resolve(str(e), base) for e in data["plugins"]]}


def parse_config_text(text: str, what: str) -> dict[str, Any]:
    """The raw mapping of a YAML config text (empty text: no settings); ``what`` names the text
    in the one-line ConfigError for invalid YAML or a top level that is not a mapping."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} is not valid YAML: {err}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{what} must hold a mapping at the top level")
    return loaded


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML, with the content hash of every file its scenario reads
    (:meth:`ScenarioConfig.files_recorded`)."""
    cfg = cfg.model_copy(update={"scenario": cfg.scenario.files_recorded()})
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
