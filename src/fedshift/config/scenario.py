"""Scenario section of the run config: how the federated data is made (label, feature and
concept shift, attribute skew, time). Validated with the rest of the config by
:func:`fedshift.config.validate_config`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fedshift.config.base import ConceptIndex, Strict
from fedshift.config.drift import DriftConfig
from fedshift.config.label_noise import LabelNoiseConfig


class LabelShiftConfig(Strict):
    """How training samples are split over clients (label shift / quantity skew)."""

    kind: Literal[
        "iid",
        "dirichlet",
        "dirichlet_seq",
        "dirichlet_equal",
        "dirichlet_capped",
        "pathological",
        "quantity",
        "flwr",
    ] = "dirichlet"
    alpha: float | None = Field(default=None, gt=0, description="Dirichlet concentration")
    classes_per_client: int | None = Field(default=None, ge=1)
    samples_per_client: int | None = Field(default=None, ge=1)
    min_size: int | None = Field(default=None, ge=1)
    redraw_every: int | None = Field(
        default=None, ge=1, description="dirichlet_seq: re-draw q every N samples (Tiny-ImageNet)"
    )
    partitioner: str | None = Field(
        default=None,
        min_length=1,
        description="flwr only (required): a flwr-datasets partitioner, e.g. DirichletPartitioner",
    )
    options: dict[str, Any] | None = Field(
        default=None,
        description="flwr only: the partitioner's keyword arguments (num_partitions is "
        "num_clients; seed defaults to one drawn from the run's seed; partition_by to label)",
    )

    @model_validator(mode="after")
    def _defaults(self) -> LabelShiftConfig:
        own = ("alpha", "classes_per_client", "samples_per_client", "min_size", "redraw_every")
        if self.kind == "flwr":
            if not self.partitioner:
                raise ValueError(
                    "kind=flwr needs a partitioner, a flwr-datasets partitioner class "
                    "(e.g. DirichletPartitioner)"
                )
            given = [k for k in own if getattr(self, k) is not None]
            if given:
                raise ValueError(
                    f"{given[0]} is not used with kind=flwr; give the flwr-datasets "
                    f"partitioner's arguments under options (e.g. options: {{alpha: 0.5}})"
                )
            return self
        for key in ("partitioner", "options"):
            if getattr(self, key) is not None:
                raise ValueError(f"{key} is for kind=flwr only; remove it or set kind=flwr")
        if (
            self.kind
            in ("dirichlet", "dirichlet_seq", "dirichlet_equal", "dirichlet_capped", "quantity")
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
    concepts: list[ConceptIndex] = Field(default_factory=lambda: [0], min_length=1)
    feature: bool = False


class ExplicitClient(Strict):
    """One client spelled out: its concept index and feature style."""

    concept: ConceptIndex = 0
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

    concepts: list[ConceptIndex] = Field(min_length=1, description="indices into scenario.concepts")
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
    split: Literal["fixed", "per_load"] = Field(
        default="fixed",
        description="train/test split of a piece: fixed (once; no test image is ever trained "
        "on) or per_load (anew whenever a client gets it, the FedDAA code's, which leaks "
        "earlier training images into later test splits)",
    )
    steps: list[StepConfig] = Field(min_length=1)
    test_styles: list[str] | None = Field(
        default=None, description="test tasks: every concept x these styles (default: the steps')"
    )


#: AttributeSkewConfig keys of kind=color only (a factor scenario keeps their defaults)
COLOR_KEYS = ("mode", "saturation", "value", "colors_per_client", "hue_jitter")


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
    colors_per_client: int = Field(
        default=1,
        description="color only: m colours inside each client, 1 <= m <= N; client k's are "
        "the palette hues j/N of j = (k + floor(i*N/m)) mod N, i < m, and its train and test "
        "splits are each dealt them in equal shares at random (1: client k's hue k/N alone)",
    )
    hue_jitter: float = Field(
        default=0.0,
        description="color only: every sample's hue moved by a uniform draw from "
        "[-hue_jitter, hue_jitter] (mod 1), 0 <= hue_jitter <= 0.5 (0.5: any hue)",
    )
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
                for k in COLOR_KEYS
                if getattr(self, k) != fields[k].get_default(call_default_factory=True)
            ]
            if colour_keys:
                raise ValueError(
                    f"{colour_keys[0]} is for kind=color only; remove it or set kind=color"
                )
        elif self.factor is not None:
            raise ValueError("factor is for kind=factor only; remove it or set kind=factor")
        if self.colors_per_client < 1:
            raise ValueError(
                f"colors_per_client={self.colors_per_client}: it must be at least 1 (1: one "
                "colour per client, the paper's set-up)"
            )
        if not 0.0 <= self.hue_jitter <= 0.5:
            raise ValueError(
                f"hue_jitter={self.hue_jitter:g}: it must lie in [0, 0.5] (a hue is a point on a "
                "circle of length 1, so 0.5 already allows any hue)"
            )
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
    "long_tail",
    "drift",
)

#: ScenarioConfig keys a drift scenario does not read (they must keep their defaults)
_NOT_WITH_DRIFT = ("mix", "feature_shift")


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
    long_tail: float | None = Field(
        default=None,
        ge=1,
        description="a long-tailed training set with this imbalance factor (largest class / "
        "smallest): class c keeps a share IF^(-c/(C-1)) of its images, the CReFF and FedNH "
        "long-tail protocol; test sets stay as they are",
    )
    label_shift: LabelShiftConfig = Field(default_factory=LabelShiftConfig)
    concepts: list[Any] = Field(
        default_factory=lambda: ["identity"],
        description="label maps: identity, reverse, shift:<k>, {kind: permutation, perm: [...]}; "
        "or the dataset's own concepts by index (0, 1, ...) or spec (sea:8): the drift streams' "
        "decision rules (sea, sine, circle)",
    )
    feature_shift: FeatureShiftConfig = Field(default_factory=FeatureShiftConfig)
    mix: MixConfig = Field(default_factory=lambda: MixConfig(types=[ClientType(fraction=1.0)]))
    test_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="per-client test split (0: none, e.g. FedNH)"
    )
    validation_fraction: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="a share of every training client's training split held out for "
        "validation (val_acc; compare --tune picks on it, never on test); 0: none",
    )
    test_clients: TestClientsConfig = Field(default_factory=TestClientsConfig)
    seed: int | None = Field(
        default=None, ge=0, description="partition seed (default: the run seed)"
    )
    timeline: TimelineConfig | None = Field(default=None, description="time steps (drift)")
    drift: DriftConfig | None = Field(
        default=None,
        description="drift at any round (fedshift.config.drift): sudden, gradual, incremental, "
        "recurrent, label-swap, label and participation events, each client on its own "
        "partition; not with timeline",
    )
    attributes: AttributeSkewConfig | None = Field(
        default=None,
        description="attribute skew (DFL): clients differ in a colour or a generative factor "
        "and share labels; it builds its own clients, so label_shift, mix, feature_shift, "
        "timeline, test_clients, concepts, copies, train_fraction_of_dataset and long_tail must keep "
        "their defaults, test_fraction is not used (attributes.train_ratio/test_ratio are) and "
        "there are no test-only clients",
    )

    label_noise: LabelNoiseConfig | None = Field(
        default=None,
        description="label noise on noisy clients' training labels, e.g. {kind: pair, rate: "
        "0.2, clients: 0.5}; not with timeline or drift",
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
        m = self.attributes.colors_per_client
        if m > self.num_clients:
            raise ValueError(
                f"attributes.colors_per_client={m} > num_clients={self.num_clients}: the "
                f"palette has one hue per client ({self.num_clients}); lower it to at most that"
            )
        return self

    @model_validator(mode="after")
    def _noise_without_time(self) -> ScenarioConfig:
        if self.label_noise is not None:
            self.label_noise.check_without_time(timeline=self.timeline, drift=self.drift)
        return self

    @model_validator(mode="after")
    def _drift_alone(self) -> ScenarioConfig:
        if self.drift is None:
            return self
        for key in _NOT_WITH_DRIFT:
            if getattr(self, key) != type(self).model_fields[key].get_default(
                call_default_factory=True
            ):
                raise ValueError(
                    f"{key} has no effect with drift (each client keeps its label_shift "
                    "partition; concepts come from drift.start/events, image styles from "
                    f"incremental events); remove scenario.{key} or scenario.drift"
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
        if self.drift is not None:
            if self.timeline is not None:
                raise ValueError(
                    "timeline (time steps) and drift (events at any round) are two ways to "
                    "declare time; keep one"
                )
            used = self.drift.concepts_used()
        bad = [c for c in used if c >= len(self.concepts)]
        if bad:
            raise ValueError(
                f"a client type or step refers to concept {bad[0]} but only {len(self.concepts)} "
                "concepts are "
                f"defined (indices 0..{len(self.concepts) - 1})"
            )
        return self

    def files_recorded(self) -> ScenarioConfig:
        """This scenario with the content hash of every file it reads filled in (a
        change-point schedule's ``sha256``, where the file is there): what a run records."""
        sched = self.drift.schedule if self.drift is not None else None
        if sched is None or sched.sha256 is not None or sched.content_sha256() is None:
            return self
        drift = self.drift.model_copy(
            update={"schedule": sched.model_copy(update={"sha256": sched.content_sha256()})}
        )
        return self.model_copy(update={"drift": drift})

    def hash(self, seed: int) -> str:
        """Hash of what determines the federated data (the scenario and its seed: its own
        ``seed`` when set, else the run's), the key of its on-disk caches."""
        dump = self.model_dump(mode="json")
        if dump["long_tail"] is None:  # added later: scenarios without it keep their hash
            del dump["long_tail"]
        if dump["drift"] is None:  # likewise
            del dump["drift"]
        if dump["validation_fraction"] == 0:  # likewise
            del dump["validation_fraction"]
        if dump["label_noise"] is None:  # likewise
            del dump["label_noise"]
        att = dump["attributes"]
        for key, default in (("colors_per_client", 1), ("hue_jitter", 0.0)):  # likewise
            if att is not None and att[key] == default:
                del att[key]
        for key in ("partitioner", "options"):  # likewise (kind flwr)
            if dump["label_shift"][key] is None:
                del dump["label_shift"][key]
        if self.drift is not None and self.drift.schedule is not None:
            # the data comes from the file's content, not its name
            sched = self.drift.schedule
            dump["drift"]["schedule"]["sha256"] = sched.content_sha256() or sched.sha256
        key = {
            "scenario": dump,
            "seed": self.seed if self.seed is not None else seed,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
