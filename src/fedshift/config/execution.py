"""Where and how a run executes, not what it computes: Ray, the Flower deployment's limits, the
output folder and the tracking sinks (their keys are execution keys of a run: changing them
changes no number)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from fedshift.config.base import Strict
from fedshift.core.errors import did_you_mean

#: the tracking sinks a config may name, and the package each needs
#: the tracking sinks a config may name, and the package each needs
SINKS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


INSTALL = 'pip install "fedshift[tracking]"'


def parse_sinks(value: Any) -> list[str]:
    """The sink names of a ``log`` value: a list, a comma-separated string or nothing; an
    unknown name is a ValueError naming the valid ones (the config makes it a ConfigError)."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError(f"must be a list of sinks ({', '.join(SINKS)})")
    out: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        if not isinstance(item, str) or name not in SINKS:
            hint = did_you_mean(name, SINKS)
            raise ValueError(f"unknown sink {item!r}{hint}; allowed: {', '.join(SINKS)}")
        if name not in out:
            out.append(name)
    return out


class RayConfig(Strict):
    """executor=ray: where Ray runs and how a round's clients are spread over its actors."""

    address: str | None = Field(
        default=None,
        description="a Ray cluster to connect to (e.g. 192.168.1.10:6379, after `ray start "
        "--head` there); None: a local instance, started and stopped with the run",
    )
    connect_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="address only: how long the cluster may take to answer before that is an "
        "error naming the address (instead of Ray retrying for minutes)",
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


class FlowerConfig(Strict):
    """A Flower deployment (``fedshift deploy``): how the server treats its nodes' replies."""

    max_dropped_replies: int = Field(
        default=10,
        ge=0,
        description="a node's reply that does not fit what the server sent or the node declared "
        "(tensor names, shapes, dtypes, non-finite values, counts beyond a client's splits, "
        "another node's client) is dropped with a warning; more than this stop the run",
    )
    max_norm_ratio: float = Field(
        default=100.0,
        gt=0,
        description="a reply's model norm may be at most this times (the sent model's + 1); "
        "a larger one (a scaled update) is dropped",
    )


class OutputConfig(Strict):
    dir: str = "runs"
    checkpoint_every: int | Literal["auto"] = Field(
        default="auto",
        description="rounds between checkpoints; auto = every round while a checkpoint takes "
        "under 20 ms to write, else often enough that writing costs at most a tenth of the "
        "run (a large client state, e.g. kept momentum of 300 clients x K models, is gigabytes)",
    )
    plots: bool = True

    @field_validator("checkpoint_every")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be a number of rounds >= 1 or auto")
        return v


class TrackingConfig(Strict):
    """Where the ``log`` sinks send a run (see :mod:`fedshift.tracking`)."""

    project: str = Field(
        default="fedshift",
        min_length=1,
        description="W&B project; MLflow experiment of a run without a group",
    )
    group: str | None = Field(
        default=None,
        min_length=1,
        description="runs that belong together: the W&B group and MLflow experiment (sweep "
        "and reproduce set it to their study's name); None: none",
    )
    mode: Literal["offline", "online"] = Field(
        default="offline",
        description="W&B: offline writes under the run directory without network (`wandb "
        "sync` uploads it later); online needs `wandb login`",
    )
    mlflow_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (e.g. http://host:5000); None: a SQLite file "
        "mlflow.db in output.dir",
    )
