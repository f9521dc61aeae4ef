"""`fedshift reproduce`: rows of a paper table over seeds and a learning-rate grid, our mean ±
std beside the paper's in a markdown table, runs resumed instead of restarted, in parallel
processes, diverged rows marked."""

from __future__ import annotations

import json

import pytest
import typer
import yaml

from fedshift.cli import console
from fedshift.config import validate_config
from fedshift.core.errors import FedshiftError
from fedshift.studies.papers import TABLES, Variant
from fedshift.studies.reproduce import (
    Outcome,
    TableRun,
    plan_table,
    row_config,
    summarise_table,
    table_rows,
)
from tests.conftest import tiny_config
from tests.studies.conftest import make_table, reproduce, tiny_table


def curve_colours(png) -> set[str]:
    """Which of matplotlib's first line colours (C0..C3) a PNG has pixels of (the markers
    are filled with them)."""
    from PIL import Image

    with Image.open(png) as im:
        assert im.format == "PNG"
        pixels = set(im.convert("RGB").getdata())
    return {f"C{i}" for i in range(4) if to_rgb(f"C{i}") in pixels}


def to_rgb(colour: str) -> tuple[int, int, int]:
    from matplotlib.colors import to_rgb as rgb

    return tuple(round(255 * v) for v in rgb(colour))


@pytest.fixture
def table(tmp_path, monkeypatch):
    return make_table(tmp_path, monkeypatch)


def test_reproduce_writes_table_with_paper_numbers_and_resumes(table):
    spec, out = table
    assert reproduce() in (None, 0)
    md = (out / "table.md").read_text()
    assert "| FedAvg |" in md and "66.40 ±3.13" in md and "65.02" in md
    assert "\n- the rows differ in local work\n" in md  # the table's notes, under it
    summary = json.loads((out / "fedavg" / "lr0.05-seed0" / "summary.json").read_text())
    assert f"ours: synthetic ({summary['data_source']})" in md  # where the data came from
    assert "GM % (ours)" in md and "PM(V) worst 10%" in md and "minutes" in md
    assert curve_colours(out / "curves.png") == {"C0", "C1"}  # a line per row: FedAvg, FedNH
    cfg = yaml.safe_load((out / "fednh" / "lr0.05-seed0" / "config.yaml").read_text())
    # row params: the variant's, the column's and the common ones the algorithm knows
    assert cfg["algorithm"]["params"] == {"weighting": "uniform", "rho": 0.5, "scale_init": 5.0}
    metrics = out / "fednh" / "lr0.05-seed0" / "metrics.jsonl"
    before = metrics.read_text()
    rows = [json.loads(x) for x in before.splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and "gm_acc" in rows[-1]
    # a second call reuses the finished runs (same settings): nothing is re-trained
    assert reproduce(rounds=2) in (None, 0)
    assert metrics.read_text() == before
    # more rounds: the finished run is a different config, so it starts again from round 1
    assert reproduce(rounds=3, only="FedNH") in (None, 0)
    assert [json.loads(x)["round"] for x in metrics.read_text().splitlines()] == [1, 2, 3]


def test_a_columns_overrides_reach_its_runs_and_the_command_line_overrides_them(
    tmp_path, monkeypatch
):
    import dataclasses

    from fedshift.studies import papers

    spec, out = make_table(tmp_path, monkeypatch)
    spec = dataclasses.replace(spec, column_overrides={"tiny": ("train.batch_size=16",)})
    monkeypatch.setattr(papers, "TABLES", {**papers.TABLES, spec.key: spec})
    config = out / "fedavg" / "lr0.05-seed0" / "config.yaml"
    assert reproduce(only="FedAvg") in (None, 0)
    assert yaml.safe_load(config.read_text())["train"]["batch_size"] == 16
    assert reproduce(only="FedAvg", overrides=["train.batch_size=8"]) in (None, 0)
    assert yaml.safe_load(config.read_text())["train"]["batch_size"] == 8


def test_report_only_regenerates_the_table_from_the_runs_files(table, capsys):
    spec, out = table
    assert reproduce() in (None, 0)
    md = (out / "table.md").read_text()
    for ckpt in out.glob("*/*/checkpoint.pt"):  # committed artifacts carry no checkpoint
        ckpt.unlink()
    assert reproduce(report_only=True) in (None, 0)
    assert (out / "table.md").read_text() == md
    metrics = out / "fedavg" / "lr0.05-seed0" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    rows[-1]["gm_acc"] = 12.345  # the table is read from the file, not from anywhere else
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert reproduce(report_only=True) in (None, 0)
    assert "12.35" in (out / "table.md").read_text()
    (out / "fednh" / "lr0.05-seed0" / "summary.json").unlink()
    with pytest.raises(typer.Exit) as err:
        reproduce(report_only=True)
    assert err.value.exit_code == 2 and "no finished run of FedNH" in capsys.readouterr().err


@pytest.mark.parametrize("kw", [{"only": "FedMagic"}, {"dataset": "imagenet"}])
def test_reproduce_rejects_unknown_rows_and_columns(table, kw, capsys):
    with pytest.raises(typer.Exit) as err:
        reproduce(**kw)
    assert err.value.exit_code == 2
    assert next(iter(kw.values())) in capsys.readouterr().err  # names the bad value


def test_a_row_label_with_the_only_separator_is_refused():
    """``--only`` splits on commas, so a label with one could never be selected."""
    with pytest.raises(ValueError, match="comma"):
        Variant("FedAvg + FT (20, local)", "fedavg-ft")


@pytest.mark.parametrize("follow", ["code", "paper"])
@pytest.mark.parametrize("key", sorted(TABLES))
def test_every_row_of_every_shipped_table_validates(key, follow):
    spec = TABLES[key]
    for column, path in spec.configs.items():
        base = console.load(str(console.find_config(path)), spec.column_overrides.get(column), None)
        for v in spec.variants:
            cfg = row_config(base, spec, column, v, follow=follow)
            assert cfg.algorithm.name == v.algorithm
        for label, values in spec.paper.get(column, {}).items():
            assert label in [v.label for v in spec.variants], label
            assert len(values) == len(spec.metrics)


def test_feddaa_table2_reads_table1_runs_and_the_readings_never_share_a_directory():
    t1, t2, t3 = (TABLES[f"feddaa-table{i}"] for i in (1, 2, 3))
    base = console.load(str(console.find_config(t1.configs["fmnist"])), [], None)

    def where(spec, follow="code"):
        return {
            j.label: (j.cfg.output.dir, j.cfg.name, j.cfg)
            for j in plan_table(spec, "fmnist", base, follow=follow)
        }

    one, two = where(t1), where(t2)
    assert {k: v[:2] for k, v in one.items()} == {k: v[:2] for k, v in two.items()}
    assert all(one[k][2] == two[k][2] for k in one)  # the same settings: resumed, not redone
    paper = where(t1, "paper")
    assert {j.row for j in plan_table(t1, "fmnist", base)} == set(paper)  # the paper's by default
    both = {j.label: j.row for j in plan_table(t1, "fmnist", base, follow="both")}
    assert both["FedAvg (re-split)"] == both["FedAvg"] == "FedAvg"
    code_rows = {k for k in both if k not in paper}
    assert "FedDAA (true count, re-split)" in code_rows and len(code_rows) == len(paper)
    assert {k: v[1] for k, v in one.items()}.keys() == code_rows
    assert all(paper[both[k]][1] != one[k][1] for k in one)  # never the same directory
    told = one["FedDAA (true count, re-split)"][2]
    assert told.algorithm.params["cluster_count"] == "truth"
    assert told.scenario.timeline.split == "per_load"
    assert paper["FedDAA"][2].scenario.timeline.split == "fixed"
    assert paper["FedDAA"][2].algorithm.params.get("cluster_count", "ncd") == "ncd"
    assert "feddaa-true-count-re-split" in one["FedDAA (true count, re-split)"][1]
    names = {v[1] for v in where(t3).values()}
    assert "wo-ncd-re-split/lr0.06-seed1" in names
    assert not any("/" in n.split("/lr")[0] for n in names)


def test_fednh_table2_reads_table1s_runs_and_prints_the_spread_across_clients():
    t1, t2 = TABLES["fednh-table1"], TABLES["fednh-table2"]
    base = console.load(str(console.find_config(t1.configs["cifar10"])), [], None)

    def where(spec):
        return {
            j.label: (j.cfg.output.dir, j.cfg.name, j.cfg)
            for j in plan_table(spec, "cifar10", base)
        }

    one, two = where(t1), where(t2)
    assert set(two) == set(one) - {"CReFF"}  # the paper's Table 2 has no CReFF row
    assert all(two[k][:2] == one[k][:2] and two[k][2] == one[k][2] for k in two)
    assert [k for k, _ in t2.metrics] == ["pm_l", "pm_l_std"]
    # the paper's means are Table 1's PM(L) at Dir(0.3); its ± is across clients, not seeds
    for col in t2.paper:
        for label, (mean, spread) in t2.paper[col].items():
            assert t1.paper[col][label][2].split(" ±")[0] == mean
            assert "±" not in spread and float(spread) > 0


def test_the_header_names_the_setting_most_rows_share_not_the_first_rows(tmp_path):
    from fedshift.studies.reproduce import common_setting

    def run(label, rounds):
        cfg = validate_config(tiny_config(tmp_path, train={"rounds": rounds}))
        return TableRun(label, 0.1, 0, cfg, "")

    jobs = [run("Local", 20), run("FedAvg", 60), run("FedNH", 60)]
    assert common_setting(jobs) is jobs[1].cfg  # Local's own 20 rounds stay in its row
    assert common_setting(jobs[:1] + [run("X", 5)]) is jobs[0].cfg  # a tie: the first


def test_feddaa_tables_take_the_papers_lr_grid_table5_label_drift_table4_sampling_rates():
    from fedshift.studies.reproduce import parse_lr_grid

    t1, t5 = TABLES["feddaa-table1"], TABLES["feddaa-table5"]
    assert parse_lr_grid(t1, "paper") == [0.01, 0.03, 0.06, 0.1]
    assert parse_lr_grid(t1, "0.01,0.03") == parse_lr_grid(t1, "[0.01, 0.03]") == [0.01, 0.03]
    with pytest.raises(FedshiftError, match="--lr-grid '0.01,x': give comma-separated numbers"):
        parse_lr_grid(t1, "0.01,x")
    base = console.load(str(console.find_config(t5.configs["fmnist"])), [], None)
    jobs = {j.label: j.cfg for j in plan_table(t5, "fmnist", base)}
    assert set(jobs) == {"DP = 0.5", "DP = 1", "DP = 2"}
    shift = jobs["DP = 0.5"].scenario.label_shift
    assert (shift.kind, shift.alpha) == ("dirichlet_equal", 0.5)
    assert jobs["DP = 2"].scenario.label_shift.alpha == 2.0
    t4 = TABLES["feddaa-table4"]
    base = console.load(str(console.find_config(t4.configs["fmnist"])), [], None)
    jobs = {j.label: j.cfg for j in plan_table(t4, "fmnist", base)}
    assert {k: c.train.participation for k, c in jobs.items()} == {
        "SR = 0.2": 0.2,
        "SR = 0.5": 0.5,
        "SR = 0.8": 0.8,
        "SR = 1": 1.0,
    }
    assert all(c.train.lr == 0.06 and c.algorithm.name == "feddaa" for c in jobs.values())
    # under a learning-rate grid the row's own lr is replaced, and its variant text says so
    t1_base = console.load(str(console.find_config(t1.configs["fmnist"])), [], None)
    own = {j.label: j.options for j in plan_table(t1, "fmnist", t1_base, labels=["FedDAA"])}
    grid = plan_table(t1, "fmnist", t1_base, labels=["FedDAA"], lr_grid=[0.1])
    assert own == {"FedDAA": "train.lr=0.06"} and grid[0].cfg.train.lr == 0.1
    assert grid[0].options == "defaults"


# ---------------------------------------------------------------------- seeds and lr grid


def outcome(cfg, label, lr, seed, acc, status="finished"):
    hist = [] if acc is None else [{"round": 5, "gm_acc": acc, "pm_v": acc / 2, "elapsed_s": 60}]
    return Outcome(TableRun(label, lr, seed, cfg, "defaults"), status, hist)


def test_summary_picks_the_best_mean_lr_and_aggregates_its_seeds(tmp_path):
    spec = tiny_table(tmp_path / "x.yaml")
    cfg = validate_config(tiny_config(tmp_path))
    outs = [
        outcome(cfg, "FedAvg", 0.1, 0, 50.0),
        outcome(cfg, "FedAvg", 0.1, 1, 70.0),  # mean 60
        outcome(cfg, "FedAvg", 0.01, 0, 64.0),
        outcome(cfg, "FedAvg", 0.01, 1, None, "diverged"),  # mean 64 over its finished seed
        outcome(cfg, "FedNH", 0.1, 0, None, "diverged"),
        outcome(cfg, "FedNH", 0.1, 1, None, "diverged"),
    ]
    rows = {r.label: r for r in summarise_table(spec, outs, select_on="gm_acc")}
    avg = rows["FedAvg"]
    assert avg.lr == 0.01 and avg.seeds == 1 and avg.diverged == 1
    assert avg.values["gm_acc"] == (64.0, 0.0, 1)
    assert avg.per_lr[0.1] == (60.0, 10.0, 2, 0)  # population std of {50, 70}
    assert rows["FedNH"].lr is None and rows["FedNH"].diverged == 2
    # selecting on another metric can pick another lr; ties go to the smaller lr
    outs[2] = outcome(cfg, "FedAvg", 0.01, 0, 60.0)
    assert {r.label: r.lr for r in summarise_table(spec, outs)}["FedAvg"] == 0.01
    cols, cells = table_rows(spec, "tiny", summarise_table(spec, outs))
    nh = next(c for c in cells if c[0] == "FedNH")
    assert "diverged" in nh[cols.index("GM % (ours)")] and "2 diverged" in nh[cols.index("seeds")]


def test_a_row_without_the_selection_metric_is_ranked_on_the_next_metric_not_diverged(tmp_path):
    spec = tiny_table(tmp_path / "x.yaml")
    cfg = validate_config(tiny_config(tmp_path))

    def proto(lr, pm_v):  # no global model: no gm_acc at all
        hist = [{"round": 5, "pm_v": pm_v, "elapsed_s": 60}]
        return Outcome(TableRun("FedProto", lr, 0, cfg, "defaults"), "finished", hist)

    (row,) = summarise_table(spec, [proto(0.1, 30.0), proto(0.01, 40.0)], select_on="gm_acc")
    assert row.lr == 0.01 and row.seeds == 1 and row.diverged == 0
    assert row.values["pm_v"] == (40.0, 0.0, 1)
    cols, (cells,) = table_rows(spec, "tiny", [row])
    assert cells[cols.index("GM % (ours)")] == "n/a"
    assert cells[cols.index("PM(V) % (ours)")] == "40.00"


def test_reproduce_seeds_and_lr_grid_in_parallel_marks_diverged_runs(table):
    spec, out = table
    assert reproduce(seeds=2, lr_grid="0.05,1e7", jobs=2, only="FedAvg") in (None, 0)
    for name in ("lr0.05-seed0", "lr0.05-seed1", "lr1e+07-seed0", "lr1e+07-seed1"):
        assert (out / "fedavg" / name / "metrics.jsonl").is_file(), name
    assert (
        json.loads((out / "fedavg" / "lr1e+07-seed0" / "summary.json").read_text())["status"]
        == "diverged"
    )
    md = (out / "table.md").read_text()
    row = next(x for x in md.splitlines() if x.startswith("| FedAvg |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "0.05" and "±" in cells[3] and cells[-3] == "2"  # lr, GM, seeds
    assert "Learning rate: lr per row from {0.05, 1e+07}" in md
    assert "2 diverged" in md  # the every-lr table shows the diverged grid point
    plans = plan_table(spec, "tiny", console.load(str(spec.configs["tiny"]), [], None), seeds=2)
    assert [j.seed for j in plans] == [0, 1, 0, 1]


def test_the_lr_rule_says_when_rows_ran_at_their_own_learning_rates():
    from fedshift.studies.reproduce import rule_text

    spec = TABLES["feddaa-table1"]
    assert rule_text(spec, None, [0.03, 0.06, 0.1], grid=False).startswith("each row's own")
    assert rule_text(spec, None, [0.05], grid=False) == "one learning rate (0.05)"
    assert rule_text(spec, None, [0.01, 0.1]).startswith("lr per row from {0.01, 0.1}")


def test_the_papers_method_is_compared_with_each_row_by_the_spread_and_seed_by_seed(tmp_path):
    """FedNH (the table's method) against FedAvg over three seeds: the difference of the means,
    the spread (the sum of the population stds), the verdict and the seeds paired by seed."""
    import dataclasses

    from fedshift.reporting.summary import MeanStd
    from fedshift.studies.table_text import gap_verdict, markdown, method_table

    spec = dataclasses.replace(tiny_table(tmp_path / "x.yaml"), method="FedNH")
    cfg = validate_config(tiny_config(tmp_path))
    nh = [60.0, 62.0, 64.0]  # mean 62, std 1.633
    avg = [50.0, 63.0, 52.0]  # mean 55, std 5.715: FedNH ahead by 7 < 7.35, in 2 seeds of 3
    outs = [outcome(cfg, "FedNH", 0.1, s, a) for s, a in enumerate(nh)]
    outs += [outcome(cfg, "FedAvg", 0.1, s, a) for s, a in enumerate(avg)]
    rows = summarise_table(spec, outs, select_on="gm_acc")
    t = method_table(spec, rows)
    assert t is not None and [c[0] for c in t.rows] == ["FedAvg"]
    (cells,) = t.rows
    gm = cells[1:5]
    assert gm[0] == "+7.00" and gm[1] == "7.35" and gm[2] == "within the spread"
    assert gm[3] == "2/3"
    # a lower FedAvg seed 1 (45 instead of 63) puts the gap beyond the spread
    outs[4] = outcome(cfg, "FedAvg", 0.1, 1, 45.0)
    (cells,) = method_table(spec, summarise_table(spec, outs, select_on="gm_acc")).rows
    assert cells[3] == "ahead by more than the spread" and cells[4] == "3/3"
    text = markdown(spec, "tiny", summarise_table(spec, outs), "header", "rule")
    assert "FedNH against each row" in text and "ahead by more than the spread" in text
    # the rule itself, both directions, and under two seeds no verdict
    assert gap_verdict(MeanStd(50, 1, 3), MeanStd(55, 1, 3)) == "behind by more than the spread"
    assert gap_verdict(MeanStd(56, 1, 3), MeanStd(55, 1, 3)) == "within the spread"
    assert gap_verdict(MeanStd(70, 0, 1), MeanStd(55, 1, 3)) == "n/a"
    # one seed of the method: no comparison table at all
    assert method_table(spec, summarise_table(spec, outs[:1] + outs[3:])) is None


def test_a_tables_method_must_be_one_of_its_rows(tmp_path):
    import dataclasses

    with pytest.raises(ValueError, match="'FedX' is not a row"):
        dataclasses.replace(tiny_table(tmp_path / "x.yaml"), method="FedX")


def test_fedrc_component_tables_run_the_option_each_row_names():
    """Tables 10, 11 and 15 differ from FedRC in one option a row: the noise ξ on the uploaded
    label statistics, the shared feature extractor, hard prediction (TeHC) and training (TrHC);
    every row keeps Table 1's code profile and K = 3, on the 100-client CIFAR-10 config."""
    params = {}
    for key in ("fedrc-table10", "fedrc-table11", "fedrc-table15"):
        t = TABLES[key]
        assert t.configs["cifar10"].endswith("cifar10_100clients.yaml")
        base = console.load(str(console.find_config(t.configs["cifar10"])), [], None)
        assert base.scenario.num_clients == 100 and base.model.name == "mobilenet_v2"
        for job in plan_table(t, "cifar10", base):
            p = job.cfg.algorithm.params
            assert p["num_clusters"] == 3 and p["test_prior"] == "none"
            params[(key, job.label)] = (job.cfg.algorithm.name, p)
    noise = {k[1]: p["noise_std"] for k, (_, p) in params.items() if k[0] == "fedrc-table10"}
    assert noise == {"FedRC": 0.0, "ξ = 10": 10.0, "ξ = 25": 25.0, "ξ = 50": 50.0, "ξ = 100": 100.0}
    assert params[("fedrc-table11", "FedRC (shared feature extractor)")][0] == "fedrc-shared"
    assert params[("fedrc-table11", "FedRC")][0] == "fedrc"
    hard = {
        k[1]: (p.get("hard_predict", False), p.get("hard_train", False))
        for k, (_, p) in params.items()
        if k[0] == "fedrc-table15"
    }
    assert hard == {
        "FedRC": (False, False),
        "FedRC + TeHC": (True, False),
        "FedRC + TrHC": (True, True),
    }


def test_a_row_folder_spells_out_letters_outside_ascii_and_keeps_the_others():
    from fedshift.studies.reproduce import row_slug

    t10 = TABLES["fedrc-table10"]
    assert [row_slug(v.label) for v in t10.variants] == [
        "fedrc",
        "xi--10",
        "xi--25",
        "xi--50",
        "xi--100",
    ]  # "ξ = 10" was "10": a bare number, and a folder that hid what it ran
    assert row_slug("FedDAA (true count, re-split)") == "feddaa-true-count-re-split"
    assert row_slug("FedRC + TeHC") == "fedrc--tehc" and row_slug("w/o NCD") == "wo-ncd"
    assert row_slug("ρ = 0.5") == "rho--05"


def test_fedrc_setting_tables_make_their_columns_label_noise_imbalance_and_model_counts():
    """Tables 9, 12, 13 and 14: what tells their columns apart reaches every row's config."""
    import numpy as np

    from fedshift.data.static import _client_types

    def rows(key, column):
        spec = TABLES[key]
        over = spec.column_overrides.get(column)
        base = console.load(str(console.find_config(spec.configs[column])), over, None)
        return base, {v.label: row_config(base, spec, column, v) for v in spec.variants}

    for column, kind in [("pairflip", "symmetric"), ("fmnist-symflip", "pair")]:
        _, cfgs = rows("fedrc-table13", column)  # the paper's names are the usual ones swapped
        assert {
            (c.scenario.label_noise.kind, c.scenario.label_noise.rate) for c in cfgs.values()
        } == {(kind, 0.2)}
    _, clean = rows("fedrc-table9", "cifar10")
    assert all(c.scenario.label_noise is None for c in clean.values())
    assert {k: c.algorithm.params.get("num_clusters") for k, c in clean.items()} == {
        "FedAvg": None,
        "FeSEM": 2,
        "FedEM": 2,
        "FedRC": 2,
    }
    for column, k in [("cifar10", 3), ("cifar10-5", 5), ("fmnist-5", 5)]:
        _, cfgs = rows("fedrc-table14", column)
        assert {c.algorithm.params["num_clusters"] for c in cfgs.values()} == {k}
    for column, counts in [("cifar10", [80, 10, 10]), ("fmnist", [240, 30, 30])]:
        base, _ = rows("fedrc-table12", column)
        types = _client_types(base.scenario, np.random.default_rng(0))
        assert np.bincount([c for c, _ in types], minlength=3).tolist() == counts
    with pytest.raises(ValueError, match="lacks"):
        make_table_with_column_overrides = TABLES["fedrc-table9"].__class__
        make_table_with_column_overrides(
            **{**TABLES["fedrc-table9"].__dict__, "column_overrides": {"cifar100": ("seed=1",)}}
        )


def test_reproduce_over_two_seeds_prints_and_writes_the_method_against_each_row(
    table, monkeypatch, capsys
):
    import dataclasses

    from fedshift.studies import papers

    spec, out = table
    monkeypatch.setitem(papers.TABLES, spec.key, dataclasses.replace(spec, method="FedNH"))
    assert reproduce(seeds=2) in (None, 0)
    printed = capsys.readouterr().out
    assert "FedNH against each row" in printed
    md = (out / "table.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("| FedAvg |") and "/2 |" in x)
    assert line.count("/2") == 2  # seeds ahead, for each of the table's two metrics
    cost = next(x for x in md.splitlines() if x.startswith("Cost: "))
    assert cost.startswith("Cost: 4 of 4 runs finished, ") and " MB." in cost
