"""Shared helpers of the study tests: a tiny paper table and the reproduce command on it."""

from __future__ import annotations

import yaml

from fedshift.cli import studies
from fedshift.studies import papers
from fedshift.studies.papers import TABLES, PaperTable, Variant
from tests.conftest import tiny_config


def make_table(tmp_path, monkeypatch):
    """A one-dataset paper table over tiny runs, registered for the test; (table, its run dir)."""
    raw = tiny_config(
        tmp_path,
        scenario__test_fraction=0.0,
        scenario__test_clients={"enabled": True, "adapt_fraction": 0.0},
        model={"name": "mlp", "width": 16, "head_bias": False},
        eval={"every": 1, "personal": "active"},
        train={"rounds": 2, "participation": 0.5, "batch_size": 32, "lr": 0.05},
    )
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    t = tiny_table(path)
    monkeypatch.setattr(papers, "TABLES", {**TABLES, t.key: t})
    return t, tmp_path / "runs" / "tiny-table-tiny"


def reproduce(**kw):
    args = dict(
        overrides=None,
        dataset="tiny",
        rounds=None,
        rounds_per_step=None,
        clients=None,
        only=None,
        seeds=1,
        lr_grid=None,
        select_on=None,
        follow="code",
        jobs=1,
        fresh=False,
        report_only=False,
    )
    args.update(kw)
    return studies.reproduce("tiny-table", data_dir=None, **args)


def tiny_table(cfg_path) -> PaperTable:
    return PaperTable(
        key="tiny-table",
        title="a tiny FedNH-style table",
        protocol="last",
        configs={"tiny": str(cfg_path)},
        variants=(Variant("FedAvg", "fedavg"), Variant("FedNH", "fednh", {"rho": 0.5})),
        metrics=(("gm_acc", "GM %"), ("pm_v", "PM(V) %")),
        extras=(("pm_v_worst10", "PM(V) worst 10%"),),
        common_params={"weighting": "uniform", "num_clusters": 3},  # only where a field exists
        column_params={"tiny": {"FedNH": {"scale_init": 5.0}}},
        paper={"tiny": {"FedAvg": ("66.40 ±3.13", "63.10 ±1.33"), "FedNH": (None, "65.02")}},
        notes=("the rows differ in local work",),
    )
