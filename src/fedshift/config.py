"""Run configuration: pydantic models, YAML loading and dotted ``key=value`` overrides.

A config is validated as a whole before anything runs. Every mistake (an unknown key, a wrong
type, an impossible value) becomes a :class:`~fedshift.errors.ConfigError` whose one-line
message names the key and what is allowed.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedshift.errors import ConfigError


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LabelShiftConfig(Strict):
    """How training samples are split over clients (label shift / quantity skew)."""

    kind: Literal[
        "iid", "dirichlet", "dirichlet_seq", "dirichlet_capped", "pathological", "quantity"
    ] = "dirichlet"
    alpha: float | None = Field(default=None, gt=0, description="Dirichlet concentration")
    classes_per_client: int | None = Field(default=None, ge=1)
    samples_per_client: int | None = Field(default=None, ge=1)
    min_size: int | None = Field(default=None, ge=1)
    redraw_every: int | None = Field(
        default=None, ge=1, description="dirichlet_seq: re-draw q every N samples (Tiny-ImageNet)"
    )

    @model_validator(mode="after")
    def _defaults(self) -> LabelShiftConfig:
        if (
            self.kind in ("dirichlet", "dirichlet_seq", "dirichlet_capped", "quantity")
            and self.alpha is None
        ):
            self.alpha = 1.0  # documented default concentration
        if self.kind == "pathological" and self.classes_per_client is None:
            self.classes_per_client = 2
        return self

    def params(self) -> dict[str, Any]:
        """The partitioner's keyword arguments (the fields that were set)."""
        return {k: v for k, v in self.model_dump().items() if k != "kind" and v is not None}


class FeatureShiftConfig(Strict):
    """Which feature styles corrupted clients draw from, and with which severities."""

    styles: list[str] = Field(
        default_factory=lambda: ["all"],
        description="corruption names, 'name/severity', 'rotate:<deg>', 'color:<name>', a pool "
        "(fmnist-c: FMNIST-C's 15 methods, cifar10-c: CIFAR-10-C's 19) or 'all' (every "
        "corruption)",
    )
    severities: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5])

    @field_validator("severities")
    @classmethod
    def _sev(cls, v: list[int]) -> list[int]:
        if not v or any(s < 1 or s > 5 for s in v):
            raise ValueError("severities must be a non-empty list of integers in 1..5")
        return v


class ClientType(Strict):
    """A fraction of the clients sharing a concept set and whether they get a feature style."""

    fraction: float = Field(gt=0, le=1)
    concepts: list[int] = Field(default_factory=lambda: [0], min_length=1)
    feature: bool = False


class ExplicitClient(Strict):
    """One client spelled out: its concept index and feature style."""

    concept: int = Field(default=0, ge=0)
    style: str = "clean"


class MixConfig(Strict):
    """The client population: by fractions of client types, or an explicit list."""

    types: list[ClientType] | None = None
    clients: list[ExplicitClient] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> MixConfig:
        if self.types is not None and self.clients is not None:
            raise ValueError("give either mix.types or mix.clients, not both")
        if self.types is not None:
            total = sum(t.fraction for t in self.types)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"mix.types fractions must sum to 1 (they sum to {total:g})")
        return self


def fedrc_mix() -> MixConfig:
    """FedRC's population: 30% clean, 20% feature only, 40% concept only, 10% both."""
    return MixConfig(
        types=[
            ClientType(fraction=0.3, concepts=[0], feature=False),
            ClientType(fraction=0.2, concepts=[0], feature=True),
            ClientType(fraction=0.4, concepts=[1, 2], feature=False),
            ClientType(fraction=0.1, concepts=[1, 2], feature=True),
        ]
    )


class TestClientsConfig(Strict):
    """Test-only clients: one per concept, built from the official test set."""

    enabled: bool = True
    adapt_fraction: float = Field(
        default=0.9, ge=0, lt=1, description="labelled part used to adapt (E-step), rest scored"
    )
    max_samples: int | None = Field(default=None, ge=10)


class StepConfig(Strict):
    """One time step of a drift scenario: the concepts present and the style of every image."""

    concepts: list[int] = Field(min_length=1, description="indices into scenario.concepts")
    style: str = Field(default="clean", description="feature style of the step, e.g. rotate:120")
    switch: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="assignment switch: share of clients that change concept",
    )


class TimelineConfig(Strict):
    """Time: T steps of ``rounds_per_step`` rounds; clients get new data at every step."""

    rounds_per_step: int = Field(ge=1)
    assignment: Literal["pieces", "switch"] = Field(
        default="pieces",
        description="pieces: the training set cut into equal IID pieces, a concept per block of "
        "pieces, each step's active concepts shared equally by the clients (FedDAA); switch: "
        "clients keep their partition and a share of them change concept at a step",
    )
    pieces: int | None = Field(default=None, ge=1, description="pieces (default: num_clients)")
    steps: list[StepConfig] = Field(min_length=1)
    test_styles: list[str] | None = Field(
        default=None, description="test tasks: every concept x these styles (default: the steps')"
    )


class AttributeSkewConfig(Strict):
    """Attribute skew (DFL, spec dfl.md §5.2): clients share the labels but differ in a nuisance
    attribute, either a colour given to their images (``color``) or the value(s) of one of the
    dataset's generative factors (``factor``: dSprites orientation, 3Dshapes scale, a domain).

    Each client's pool is split into a training and a disjoint test part by ``train_ratio`` and
    ``test_ratio`` (fractions of the pool), so train and test are identically distributed
    within a client."""

    kind: Literal["color", "factor"]
    mode: Literal["background", "foreground"] = Field(
        default="background",
        description="color only: background = white digit on client k's colour HSV(k/N, "
        "saturation, value); foreground = digit in client k's colour on black "
        "(x = m*c_fg + (1-m)*c_bg, m = grey intensity in [0, 1])",
    )
    saturation: float = Field(default=1.0, ge=0, le=1, description="color only: HSV saturation")
    value: float = Field(default=0.8, ge=0, le=1, description="color only: HSV value")
    factor: str | None = Field(
        default=None,
        description="factor only (required): a generative factor of the dataset, e.g. "
        "orientation (dsprites), scale (3dshapes), domain (digit-domains); its V values are "
        "dealt to the N clients: N == V one each, N < V round robin (value i to client i % N), "
        "N > V client k gets value k % V and clients sharing a value split its samples",
    )
    train_ratio: float = Field(
        default=0.5, gt=0, le=1, description="training split, as a fraction of the client's pool"
    )
    test_ratio: float = Field(
        default=0.5, ge=0, le=1, description="test split, as a fraction of the client's pool"
    )
    pool: Literal["all", "split"] = Field(
        default="all",
        description="all: the source's train and test sets pooled, each client's pool split by "
        "the ratios (train_ratio + test_ratio <= 1); split: train drawn from the source's "
        "train set, test from its test set (each ratio applied to its own set)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AttributeSkewConfig:
        if self.kind == "factor":
            if not self.factor:
                raise ValueError(
                    "kind=factor needs a factor, the factor that differs "
                    "between clients (e.g. orientation for dsprites, domain for digit-domains)"
                )
            # by value, not by model_fields_set: a dumped config (defaults written out) must
            # validate again, e.g. each row of a reproduction
            fields = type(self).model_fields
            colour_keys = [
                k
                for k in ("mode", "saturation", "value")
                if getattr(self, k) != fields[k].get_default(call_default_factory=True)
            ]
            if colour_keys:
                raise ValueError(
                    f"{colour_keys[0]} is for kind=color only; remove it or set kind=color"
                )
        elif self.factor is not None:
            raise ValueError("factor is for kind=factor only; remove it or set kind=factor")
        if self.pool == "all" and self.train_ratio + self.test_ratio > 1 + 1e-9:
            raise ValueError(
                f"train_ratio + test_ratio = {self.train_ratio + self.test_ratio:g} "
                "> 1 with pool=all (the splits are disjoint parts of one pool); lower them or "
                "use pool=split"
            )
        return self


#: ScenarioConfig keys an attribute-skew scenario builds itself (they must keep their defaults)
_NOT_WITH_ATTRIBUTES = (
    "label_shift",
    "mix",
    "feature_shift",
    "timeline",
    "test_clients",
    "concepts",
    "copies",
    "train_fraction_of_dataset",
)


class ScenarioConfig(Strict):
    """A federated dataset with label, feature and concept shift (and, with ``timeline``,
    drift over time steps)."""

    dataset: str = "fmnist"
    dataset_options: dict[str, Any] = Field(default_factory=dict)
    num_clients: int = Field(default=100, ge=1)
    train_fraction_of_dataset: float = Field(
        default=1.0, gt=0, le=1, description="use a random subset of the training set"
    )
    copies: int = Field(default=1, ge=1, description="concatenated copies of the training set")
    label_shift: LabelShiftConfig = Field(default_factory=LabelShiftConfig)
    concepts: list[Any] = Field(
        default_factory=lambda: ["identity"],
        description="label maps: identity, reverse, shift:<k>, {kind: permutation, perm: [...]}",
    )
    feature_shift: FeatureShiftConfig = Field(default_factory=FeatureShiftConfig)
    mix: MixConfig = Field(default_factory=lambda: MixConfig(types=[ClientType(fraction=1.0)]))
    test_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="per-client test split (0: none, e.g. FedNH)"
    )
    test_clients: TestClientsConfig = Field(default_factory=TestClientsConfig)
    seed: int | None = Field(default=None, description="partition seed (default: the run seed)")
    timeline: TimelineConfig | None = Field(default=None, description="time steps (drift)")
    attributes: AttributeSkewConfig | None = Field(
        default=None,
        description="attribute skew (DFL): clients differ in a colour or a generative factor "
        "and share labels; it builds its own clients, so label_shift, mix, feature_shift, "
        "timeline, test_clients, concepts, copies and train_fraction_of_dataset must keep "
        "their defaults, test_fraction is not used (attributes.train_ratio/test_ratio are) and "
        "there are no test-only clients",
    )

    @field_validator("concepts")
    @classmethod
    def _concepts(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("at least one concept is needed (e.g. ['identity'])")
        return v

    @model_validator(mode="after")
    def _attributes_alone(self) -> ScenarioConfig:
        if self.attributes is None:
            return self
        for key in _NOT_WITH_ATTRIBUTES:
            if getattr(self, key) != type(self).model_fields[key].get_default(
                call_default_factory=True
            ):
                raise ValueError(
                    f"{key} cannot be combined with attributes (an "
                    f"attribute-skew scenario builds its own clients); remove scenario.{key}"
                )
        return self

    @model_validator(mode="after")
    def _mix_concepts(self) -> ScenarioConfig:
        used: list[int] = []
        if self.mix.types:
            used = [c for t in self.mix.types for c in t.concepts]
        if self.mix.clients:
            used = [c.concept for c in self.mix.clients]
            if len(self.mix.clients) != self.num_clients:
                raise ValueError(
                    f"mix.clients lists {len(self.mix.clients)} clients but num_clients is "
                    f"{self.num_clients}"
                )
        if self.timeline is not None:
            used = [c for st in self.timeline.steps for c in st.concepts]
        bad = [c for c in used if c >= len(self.concepts)]
        if bad:
            raise ValueError(
                f"a client type or step refers to concept {bad[0]} but only {len(self.concepts)} "
                "concepts are "
                f"defined (indices 0..{len(self.concepts) - 1})"
            )
        return self


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


class TrainConfig(Strict):
    rounds: int = Field(default=200, ge=1)
    participation: float = Field(default=1.0, gt=0, le=1, description="client sampling rate")
    local_epochs: int = Field(default=1, ge=1)
    local_steps: int | None = Field(
        default=None, ge=1, description="fixed number of local steps (overrides local_epochs)"
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
    keep_momentum: bool = Field(
        default=False,
        description="keep each client's SGD momentum buffers (per model) across rounds, as "
        "the FedRC/FedEM code does (in drift scenarios: until the next time step); false: "
        "momentum starts fresh every round",
    )
    augment: Literal["none", "crop_flip"] = Field(
        default="none",
        description="training augmentation: crop_flip = random crop with zero padding "
        "(crop_padding) + horizontal flip, per sample (the FedNH code's CIFAR/TinyImageNet)",
    )
    crop_padding: int = Field(default=4, ge=1, description="padding of crop_flip, in pixels")


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


class RayConfig(Strict):
    """executor=ray: where Ray runs and how a round's clients are spread over its actors."""

    address: str | None = Field(
        default=None,
        description="a Ray cluster to connect to (e.g. 192.168.1.10:6379, after `ray start "
        "--head` there); None: a local instance, started and stopped with the run",
    )
    actors: int | None = Field(
        default=None,
        ge=1,
        description="shards per round, one actor each (None: one per GPU for a CUDA run, else "
        "one per cpus_per_actor CPUs of the cluster)",
    )
    gpus_per_actor: float | None = Field(
        default=None,
        ge=0,
        description="GPU share of an actor, e.g. 0.5 for two actors per GPU (None: the GPUs "
        "shared equally for a CUDA run, 0 for a CPU run)",
    )
    cpus_per_actor: float = Field(default=1.0, gt=0, description="CPUs (torch threads) per actor")
    inner: Literal["auto", "batched", "sequential"] = Field(
        default="auto", description="what each actor runs on its shard (auto: as executor=auto)"
    )
    num_cpus: int | None = Field(
        default=None, ge=1, description="local instance only: CPUs it may use (None: all)"
    )
    num_gpus: int | None = Field(
        default=None, ge=0, description="local instance only: GPUs it may use (None: all)"
    )
    host: str = Field(
        default="127.0.0.1",
        description="local instance only: the address it binds to (localhost unless you "
        "want other machines to reach it)",
    )
    dashboard: bool = Field(default=False, description="local instance only: Ray's dashboard")


class OutputConfig(Strict):
    dir: str = "runs"
    checkpoint_every: int = Field(default=1, ge=1)
    plots: bool = True


#: RunConfig keys that say where and how a run executes, not what it computes
EXECUTION_KEYS = (
    "name",
    "device",
    "executor",
    "chunk_size",
    "clients_in_memory",
    "ray",
    "data_dir",
    "output",
)


class RunConfig(Strict):
    """The whole run."""

    name: str = "run"
    seed: int = 0
    device: str = "auto"
    executor: Literal["auto", "sequential", "batched", "ray"] = Field(
        default="auto",
        description="auto = batched where the algorithm supports it; ray = shards of the round's "
        "clients on Ray actors (see the ray section)",
    )
    chunk_size: int = Field(default=64, ge=1, description="clients per batched chunk (memory)")
    clients_in_memory: int | None = Field(
        default=None,
        ge=1,
        description="keep at most this many clients' states (and momentum buffers) in memory, "
        "spilling the rest to the run directory; None: all in memory",
    )
    ray: RayConfig = Field(default_factory=RayConfig)
    data_dir: str | None = None
    scenario: ScenarioConfig = Field(default_factory=ScenarioConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    @model_validator(mode="after")
    def _rounds_of_the_timeline(self) -> RunConfig:
        tl = self.scenario.timeline
        if tl is None:
            return self
        total = len(tl.steps) * tl.rounds_per_step
        if "rounds" in self.train.model_fields_set and self.train.rounds != total:
            raise ValueError(
                f"train.rounds={self.train.rounds} but the timeline has {len(tl.steps)} steps x "
                f"{tl.rounds_per_step} rounds = {total}; leave train.rounds out or set it to {total}"
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

    def experiment(self) -> dict[str, Any]:
        """The settings that decide a run's numbers: all but where and how it executes
        (:data:`EXECUTION_KEYS`, the inference batch), which change them at most by float
        rounding. Two configs with the same experiment continue each other's runs."""
        out = self.model_dump(mode="json")
        for key in EXECUTION_KEYS:
            out.pop(key)
        out["eval"].pop("batch_size")
        return out

    def scenario_hash(self) -> str:
        """Hash of what determines the federated data (for the on-disk cache)."""
        key = {
            "scenario": self.scenario.model_dump(mode="json"),
            "seed": self.scenario.seed if self.scenario.seed is not None else self.seed,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


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
            msg += f" (allowed here: {', '.join(parent.model_fields)})"
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
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {err}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
        data = loaded
    return validate_config(apply_overrides(data, overrides or []))


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
