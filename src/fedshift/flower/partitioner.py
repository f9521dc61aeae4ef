"""A fedshift scenario's client split as a Flower Datasets partitioner (issue 25).

:class:`ScenarioPartitioner` is a ``flwr_datasets.partitioner.Partitioner``: partition ``i`` is
the rows of the Hugging Face training split that fedshift's scenario gives client ``i`` (its
label shift, concept and style assignment, drift step, ``train_fraction_of_dataset`` and
``long_tail`` subsets, as :func:`~fedshift.data.scenario.build_scenario` makes them), so a
Flower app can use fedshift's client split on the original dataset::

    part = ScenarioPartitioner.from_config(
        {"dataset": "hf", "dataset_options": {"path": "uoft-cs/cifar10"},
         "num_clients": 10, "label_shift": {"kind": "dirichlet", "alpha": 0.3}}, seed=0)
    fds = FederatedDataset(dataset="uoft-cs/cifar10", shuffle=False, partitioners={"train": part})
    client_0 = fds.load_partition(0)

The rows are the source's, untouched: a client's feature style and label map are not applied
(``label_column`` adds the client's labels after its concept's label map as a column). The
dataset must keep the split's row order (``FederatedDataset(shuffle=False)``). The reverse
direction, a flwr-datasets partitioner as a fedshift label shift, is
:mod:`fedshift.data.flwr_partition`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from fedshift.config.scenario import ScenarioConfig
from fedshift.core.errors import FedshiftError
from fedshift.data.federated import Client, FederatedData
from fedshift.data.scenario import build_scenario
from fedshift.data.sources import load_dataset, resolve_name
from fedshift.data.sources.hub import EXTRA_HINT, read_hub

try:
    import datasets
    from flwr_datasets.partitioner import Partitioner
except ImportError as err:  # pragma: no cover - the hub extra is missing
    raise ImportError(f"fedshift.flower.partitioner needs flwr-datasets: {EXTRA_HINT}") from err

__all__ = ["ScenarioPartitioner", "scenario_rows"]

Part = Literal["train", "test", "all"]


def scenario_rows(
    scenario: ScenarioConfig | Mapping[str, Any], seed: int = 0, data_dir: str | None = None
) -> tuple[FederatedData, np.ndarray]:
    """Build the scenario (as :func:`~fedshift.data.scenario.build_scenario` with ``seed`` and
    ``data_dir``) and return it with ``rows``: the row of the dataset's training split that
    holds each raw training sample (the ``hf`` source records it, e.g. when it held a test
    fraction out of one split; other sources' training sets are their split, in order)."""

    cfg = scenario if isinstance(scenario, ScenarioConfig) else ScenarioConfig(**scenario)
    if resolve_name(cfg.dataset) == "hf":
        hub = read_hub(data_dir, **cfg.dataset_options)
        raw, rows = hub.raw, hub.rows_train
    else:
        raw = load_dataset(cfg.dataset, data_dir, **cfg.dataset_options)
        rows = np.arange(len(raw.y_train))
    return build_scenario(cfg, seed, data_dir, raw=raw), rows


class ScenarioPartitioner(Partitioner):
    """Client ``i`` of a fedshift scenario as Flower partition ``i``; see the module docs.

    ``data`` is the built scenario and ``rows[j]`` the row of the training split holding raw
    training sample ``j`` (:func:`scenario_rows` gives both; :meth:`from_config` builds them).
    ``part``: the client's ``train`` rows (default), its ``test`` rows (its own test split,
    ``scenario.test_fraction``) or ``all`` of them. ``step``: the drift step whose clients are
    meant (default: the first). ``label_column``: the name of a column to add holding each
    row's label as the client sees it (after its concept's label map)."""

    def __init__(
        self,
        data: FederatedData,
        rows: Sequence[int] | np.ndarray,
        *,
        part: Part = "train",
        step: int | None = None,
        label_column: str | None = None,
    ) -> None:
        super().__init__()
        if data.origin is None:
            raise FedshiftError(
                f"scenario {data.name!r} does not record which source sample each client "
                "holds (attribute-skew scenarios do not), so it has no rows to give Flower"
            )
        if part not in ("train", "test", "all"):
            raise FedshiftError(f"part must be train, test or all, got {part!r}")
        if step is not None and not 1 <= step <= max(data.num_steps, 1):
            raise FedshiftError(f"step must be in 1..{max(data.num_steps, 1)}, got {step!r}")
        self.data = data
        self.rows = np.asarray(rows, dtype=np.int64)
        self.part = part
        self.label_column = label_column
        self.clients: list[Client] = data.at_step(step).clients if step else data.clients

    @classmethod
    def from_config(
        cls,
        scenario: ScenarioConfig | Mapping[str, Any] | Any,
        seed: int = 0,
        data_dir: str | None = None,
        **kwargs: Any,
    ) -> ScenarioPartitioner:
        """Build the scenario (a scenario config or its mapping, or a run config, whose seed and
        data directory are then used) and partition by it; ``kwargs`` as for the class."""
        if hasattr(scenario, "scenario"):  # a RunConfig
            seed, data_dir, scenario = scenario.seed, scenario.data_dir, scenario.scenario
        data, rows = scenario_rows(scenario, seed, data_dir)
        return cls(data, rows, **kwargs)

    @property
    def num_partitions(self) -> int:
        """The number of clients (test-only clients are not partitions)."""
        return len(self.clients)

    def partition(self, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``partition_id``'s rows (ascending) and its label of each row."""
        if not 0 <= int(partition_id) < self.num_partitions:
            raise FedshiftError(
                f"partition_id must be in 0..{self.num_partitions - 1}, got {partition_id!r}"
            )
        c = self.clients[int(partition_id)]
        pieces = {"train": [(c.train_idx, c.y_train)], "test": [(c.test_idx, c.y_test)]}
        pieces["all"] = pieces["train"] + pieces["test"]
        idx = np.concatenate([i.cpu().numpy() for i, _ in pieces[self.part]]).astype(np.int64)
        labels = np.concatenate([y.cpu().numpy() for _, y in pieces[self.part]])
        source = self.data.origin[idx]
        if source.size and source.max() >= len(self.rows):
            raise FedshiftError(
                f"client {partition_id} holds samples of the test set, which are no rows of "
                "the training split"
            )
        rows = self.rows[source]
        order = np.argsort(rows, kind="stable")
        return rows[order], labels[order].astype(np.int64)

    def partition_rows(self, partition_id: int) -> np.ndarray:
        """The rows of the training split that client ``partition_id`` holds, ascending."""
        return self.partition(partition_id)[0]

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """Client ``partition_id``'s rows of the assigned dataset (the training split, in its
        original order)."""
        rows, labels = self.partition(partition_id)
        ds = self.dataset
        if getattr(ds, "_indices", None) is not None:
            raise FedshiftError(
                "the dataset's rows were reordered or subset (FederatedDataset shuffles unless "
                "shuffle=False): give the training split in its original order"
            )
        if rows.size and int(rows.max()) >= len(ds):
            raise FedshiftError(
                f"the dataset has {len(ds)} rows but client {partition_id} holds row "
                f"{int(rows.max())}: give the training split the scenario was built from"
            )
        out = ds.select(rows)
        if self.label_column:
            out = out.add_column(self.label_column, labels.tolist())
        return out
