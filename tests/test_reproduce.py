"""`fedshift reproduce`: rows of a paper table run on one scenario, our numbers beside the
paper's in a markdown table, and an interrupted reproduction resumes instead of restarting."""

from __future__ import annotations

import json

import pytest
import typer
import yaml

from fedshift import cli, papers
from fedshift.papers import TABLES, PaperTable, Variant
from tests.conftest import tiny_config


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
    )


@pytest.fixture
def table(tmp_path, monkeypatch):
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
    args = dict(overrides=None, dataset="tiny", rounds=None, clients=None, only=None)
    args.update(kw)
    return cli.reproduce("tiny-table", fresh=args.pop("fresh", False), data_dir=None, **args)


def test_reproduce_writes_table_with_paper_numbers_and_resumes(table):
    spec, out = table
    assert reproduce() in (None, 0)
    md = (out / "table.md").read_text()
    assert "| FedAvg |" in md and "66.40 ±3.13" in md and "65.02" in md
    assert "GM % (ours)" in md and "PM(V) worst 10%" in md and "minutes" in md
    assert (out / "curves.png").stat().st_size > 0
    cfg = yaml.safe_load((out.parent / "tiny-table-tiny" / "fednh" / "config.yaml").read_text())
    # row params: the variant's, the column's and the common ones the algorithm knows
    assert cfg["algorithm"]["params"] == {"weighting": "uniform", "rho": 0.5, "scale_init": 5.0}
    metrics = out / "fednh" / "metrics.jsonl"
    before = metrics.read_text()
    rows = [json.loads(x) for x in before.splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and "gm_acc" in rows[-1]
    # a second call reuses the finished runs (same settings): nothing is re-trained
    assert reproduce(rounds=2) in (None, 0)
    assert metrics.read_text() == before
    # more rounds: the finished run is a different config, so it starts again from round 1
    assert reproduce(rounds=3, only="FedNH") in (None, 0)
    assert [json.loads(x)["round"] for x in metrics.read_text().splitlines()] == [1, 2, 3]


@pytest.mark.parametrize("kw", [{"only": "FedMagic"}, {"dataset": "imagenet"}])
def test_reproduce_rejects_unknown_rows_and_columns(table, kw, capsys):
    with pytest.raises(typer.Exit) as err:
        reproduce(**kw)
    assert err.value.exit_code == 2
    assert next(iter(kw.values())) in capsys.readouterr().err  # names the bad value


@pytest.mark.parametrize("key", sorted(TABLES))
def test_every_row_of_every_shipped_table_validates(key):
    spec = TABLES[key]
    for column, path in spec.configs.items():
        base = cli._load(str(cli._find_config(path)), [], None)
        for v in spec.variants:
            cfg = cli._variant_config(base, spec, column, v, key)
            assert cfg.algorithm.name == v.algorithm
        for label, values in spec.paper.get(column, {}).items():
            assert label in [v.label for v in spec.variants], label
            assert len(values) == len(spec.metrics)
