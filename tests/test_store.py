"""Client states that spill to disk: a bounded store keeps at most ``capacity`` states in memory,
gives back exactly what was stored, survives checkpoints, and changes no number of a run."""

from __future__ import annotations

import pickle

import pytest
import torch

from fedshift.config import validate_config
from fedshift.engine.store import ClientStore
from fedshift.metrics import TIMING_KEYS
from fedshift.runner import run_experiment
from tests.conftest import tiny_config


def state(i: int) -> dict:
    return {"params": {"w": torch.full((3,), float(i))}, "cluster": i}


def test_bounded_store_spills_the_least_recently_used(tmp_path):
    store = ClientStore(capacity=2, folder=tmp_path / "clients")
    for i in range(5):
        store[i] = state(i)
    assert len(store) == 5 and store.in_memory == 2 and set(store) == set(range(5))
    assert len(list((tmp_path / "clients").glob("*.pt"))) == 3
    for i in (0, 4, 2):  # reading back a spilled state loads it (and spills another)
        assert torch.equal(store[i]["params"]["w"], torch.full((3,), float(i)))
        assert store[i]["cluster"] == i and store.in_memory == 2
    assert store.get(99) is None and 3 in store and 99 not in store
    store[3] = state(30)  # replacing a spilled state
    assert store[3]["cluster"] == 30
    del store[1]
    assert 1 not in store and len(store) == 4


def test_checkpoint_refers_to_files_that_stay_until_collected(tmp_path):
    store = ClientStore(capacity=1, folder=tmp_path / "c")
    store[0], store[1] = state(0), state(1)  # 0 spilled
    blob = pickle.dumps(store)  # the checkpoint
    store[0] = state(100)  # 0 back in memory, 1 spilled; 0's old file must survive...
    store[2] = state(2)
    restored = pickle.loads(blob)  # ...for a resume from the checkpoint
    assert restored[0]["cluster"] == 0 and restored[1]["cluster"] == 1
    store.collect()  # after the next checkpoint: only live files remain
    live = {p.name for p in (tmp_path / "c").glob("*.pt")}
    assert len(live) == len(store) - store.in_memory
    assert store[1]["cluster"] == 1 and store[0]["cluster"] == 100


def test_unbounded_store_is_a_dict():
    store = ClientStore()
    store[1] = state(1)
    assert store == {1: store[1]} and store.in_memory == 1
    with pytest.raises(ValueError):
        ClientStore(capacity=2)  # a bound needs a folder


@pytest.mark.parametrize("algorithm", ["local", "fedrc"])
def test_spilling_changes_no_number_and_resumes_exactly(tmp_path, algorithm):
    over = {
        "algorithm": {
            "name": algorithm,
            "params": {"num_clusters": 2} if algorithm == "fedrc" else {},
        },
        "train__rounds": 4,
        "train__participation": 0.5,
        "train__keep_momentum": True,
    }
    plain = run_experiment(validate_config(tiny_config(tmp_path, name="plain", **over)))
    bounded_cfg = tiny_config(tmp_path, name="bounded", clients_in_memory=2, **over)
    bounded = run_experiment(validate_config(bounded_cfg))
    assert list((tmp_path / "runs" / "bounded" / "clients").glob("*.pt"))  # it did spill
    strip = lambda h: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in h]  # noqa: E731
    assert strip(bounded.history) == strip(plain.history)
    # stop after 2 rounds, then resume to 4: the spilled states come back from the checkpoint
    part = {**bounded_cfg, "name": "part", "train": {**bounded_cfg["train"], "rounds": 2}}
    run_experiment(validate_config(part))
    part["train"]["rounds"] = 4
    resumed = run_experiment(validate_config(part), resume=True)
    assert strip(resumed.history) == strip(plain.history)
