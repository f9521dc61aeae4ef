"""Shared fixtures: tiny configs on data that is always available (synthetic, digits)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedshift.algorithms.base import TrainDefaults
from fedshift.config import validate_config

ROOT = Path(__file__).resolve().parents[1]

#: the run settings an algorithm built by hand (outside the runner) is given
RUN = {"seed": 0, "train": TrainDefaults()}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep scenario caches of the tests out of the user's cache."""
    if "FEDSHIFT_CACHE" not in os.environ:
        monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def tiny_config(tmp_path: Path, **over) -> dict:
    """A raw config: synthetic data, MLP, a few clients and rounds (seconds on a CPU)."""
    cfg = {
        "name": "tiny",
        "seed": 0,
        "device": "cpu",
        "scenario": {
            "dataset": "synthetic",
            "dataset_options": {"n_train": 1200, "n_test": 400, "dim": 16, "num_classes": 4},
            "num_clients": 6,
            "label_shift": {"kind": "iid"},
            "concepts": ["identity"],
        },
        "model": {"name": "mlp", "width": 32},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 3, "batch_size": 32, "lr": 0.05},
        "eval": {"every": 1},
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }
    for key, value in over.items():
        node = cfg
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


@pytest.fixture
def tiny(tmp_path):
    def make(**over):
        return validate_config(tiny_config(tmp_path, **over))

    return make
