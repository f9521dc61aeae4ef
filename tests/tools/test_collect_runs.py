"""benchmarks/collect_runs.py: what it keeps of a run's files has no machine path, and a run
collected twice (a results folder's run copied into another) reads the same."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location(
        "collect_runs", ROOT / "benchmarks/collect_runs.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_data_source_is_cut_to_the_data_folder_once():
    scrub = _module().scrub
    once = scrub({"data_source": "/home/someone/data/mnist/raw"})
    assert once["data_source"] == "<data folder>/mnist/raw"
    assert scrub(dict(once)) == once  # collected again: unchanged
    both = scrub({"data_source": "digits: /a/b/mnist/raw; /c/d/svhn/x (three)"})
    assert both["data_source"] == "digits: <data folder>/mnist/raw; <data folder>/svhn/x (three)"
