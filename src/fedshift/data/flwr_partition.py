"""A flwr-datasets partitioner as a fedshift label shift (issue 25):
``label_shift: {kind: flwr, partitioner: DirichletPartitioner, options: {alpha: 0.5}}``.

The training labels become a small Hugging Face ``Dataset`` (the labels in a column named by
``options.partition_by``, default ``label``, and each sample's index), the partitioner is
built from ``options`` and given that dataset, and partition ``i`` (its indices) is client
``i``. ``num_partitions`` is the number of clients; ``seed``, when the partitioner takes one
and ``options`` does not set it, is drawn from the scenario's random stream (so it follows the
run's seed). The reverse direction, a fedshift scenario's split as a Flower partitioner, is
:class:`fedshift.flower.partitioner.ScenarioPartitioner`.

``datasets`` and ``flwr_datasets`` are imported inside :meth:`FlwrPartitioner.split` (the
``hub`` extra).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedshift.core.errors import ConfigError, FedshiftError, did_you_mean
from fedshift.data.partition_base import PARTITIONERS, as_labels, check_clients

EXTRA_HINT = 'pip install "fedshift[hub]"'
#: the column of the labels dataset that holds each sample's index
ROW_COLUMN = "fedshift_index"
_OWNER = "scenario.label_shift"


def flwr_partitioners() -> dict[str, type]:
    """The flwr-datasets partitioners that split samples (not the vertical, column-splitting
    ones), by class name; a one-line error naming the extra when flwr-datasets is missing."""
    try:
        from flwr_datasets import partitioner as module
    except ImportError:
        raise FedshiftError(f"label_shift kind flwr needs flwr-datasets: {EXTRA_HINT}") from None
    base = module.Partitioner
    return {
        name: cls
        for name, cls in sorted(vars(module).items())
        if isinstance(cls, type)
        and issubclass(cls, base)
        and cls is not base
        and not name.startswith("Vertical")
    }


def flwr_partitioner_class(name: str) -> type:
    """The flwr-datasets partitioner ``name`` (case-insensitive; the ``Partitioner`` suffix may
    be left out: ``dirichlet``), else a one-line error listing the available ones."""
    found = flwr_partitioners()
    want = str(name).strip().lower()
    for cls_name, cls in found.items():
        if want in (cls_name.lower(), cls_name.lower().removesuffix("partitioner")):
            return cls
    raise ConfigError(
        f"{_OWNER}.partitioner: unknown flwr-datasets partitioner {name!r}"
        f"{did_you_mean(name, found)}; available: {', '.join(found)}"
    )


@PARTITIONERS.register("flwr", "flwr-datasets", "flwr_datasets")
@dataclass(frozen=True)
class FlwrPartitioner:
    """A flwr-datasets partitioner (``partitioner``: its class name, ``options``: its keyword
    arguments) as a fedshift partitioner; see the module docs. Empty partitions and a sample in
    two partitions are errors (every fedshift client needs data of its own)."""

    partitioner: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.options, dict):
            raise ConfigError(f"{_OWNER}.options must be a mapping, got {self.options!r}")

    def _kwargs(self, cls: type, num_clients: int, seed: int) -> tuple[dict[str, Any], str]:
        params = inspect.signature(cls).parameters
        kwargs = dict(self.options)
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ConfigError(
                f"{_OWNER}.options: {cls.__name__} takes no {', '.join(map(repr, unknown))}; "
                f"its parameters: {', '.join(params)}"
            )
        if "num_partitions" in params:
            given = kwargs.setdefault("num_partitions", num_clients)
            if given != num_clients:
                raise ConfigError(
                    f"{_OWNER}.options.num_partitions={given!r} differs from "
                    f"scenario.num_clients={num_clients}; leave it out (it is the clients)"
                )
        column = str(kwargs.get("partition_by", "label"))
        if "partition_by" in params:
            kwargs["partition_by"] = column
        if "seed" in params:
            kwargs.setdefault("seed", seed)
        return kwargs, column

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Client ``i`` gets the indices of the flwr-datasets partitioner's partition ``i``."""
        y = as_labels(labels)
        m = check_clients("flwr", num_clients, y.size)
        cls = flwr_partitioner_class(self.partitioner)
        kwargs, column = self._kwargs(cls, m, int(rng.integers(2**31 - 1)))
        if column == ROW_COLUMN:
            raise ConfigError(f"{_OWNER}.options.partition_by: {ROW_COLUMN!r} is reserved")
        import datasets

        try:
            part = cls(**kwargs)
            part.dataset = datasets.Dataset.from_dict({column: y, ROW_COLUMN: np.arange(y.size)})
            if part.num_partitions != m:
                raise ValueError(
                    f"it makes {part.num_partitions} partitions for {m} clients (set "
                    "scenario.num_clients to match)"
                )
            parts = [np.asarray(part.load_partition(i)[ROW_COLUMN], np.int64) for i in range(m)]
        except (ValueError, TypeError, KeyError, IndexError, AssertionError) as exc:
            why = " ".join(str(exc).split())[:300]
            raise ConfigError(f"{_OWNER}: {cls.__name__} failed: {why}") from None
        empty = [i for i, p in enumerate(parts) if p.size == 0]
        if empty:
            raise ConfigError(
                f"{_OWNER}: {cls.__name__} gave client(s) {', '.join(map(str, empty[:5]))} no "
                "sample; change its options or lower scenario.num_clients"
            )
        counts = np.bincount(np.concatenate(parts), minlength=y.size)
        if counts.max() > 1:
            raise ConfigError(
                f"{_OWNER}: {cls.__name__} put {int((counts > 1).sum())} sample(s) in more than "
                "one partition; fedshift clients must not share samples"
            )
        return [np.sort(p) for p in parts]
