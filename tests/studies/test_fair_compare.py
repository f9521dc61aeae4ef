"""Fair comparisons: training settings an algorithm takes from its reference code (shown, and
overridden by a config that sets them), a validation split carved from the training data, and
``compare --tune`` choosing each method's value on validation, never on test."""

import json

import pytest
import yaml

from fedshift.algorithms.registry import algorithm_defaults, experiment, resolved_train
from fedshift.config import validate_config
from fedshift.core.errors import FedshiftError
from fedshift.data.scenario import build_scenario
from fedshift.run.experiment import run_experiment, sim_config
from fedshift.studies.compare import training_notes
from fedshift.studies.reproduce import rule_text
from fedshift.studies.tune import parse_tune, tune_compare
from tests.conftest import tiny_config


def cfg_of(tmp_path, algorithm="fedavg", **over):
    return validate_config(tiny_config(tmp_path, algorithm={"name": algorithm}, **over))


# ---------------------------------------------------------------------- algorithm defaults


@pytest.mark.parametrize("algorithm", ["fedem", "fedrc", "feddaa", "fedrc-ft"])
def test_the_fedem_family_keeps_momentum_unless_the_config_says(tmp_path, algorithm):
    cfg = cfg_of(tmp_path, algorithm)
    assert algorithm_defaults(cfg) == {"keep_momentum": True}
    assert resolved_train(cfg).keep_momentum and sim_config(cfg).train.keep_momentum
    assert experiment(cfg)["train"]["keep_momentum"] is True
    off = cfg_of(tmp_path, algorithm, train__keep_momentum=False)
    assert algorithm_defaults(off) == {} and not sim_config(off).train.keep_momentum


def test_other_methods_resolve_as_before_and_old_run_configs_still_match(tmp_path):
    cfg = cfg_of(tmp_path, "ifca")
    assert algorithm_defaults(cfg) == {} and sim_config(cfg).train.keep_momentum is False
    saved = cfg.model_dump(mode="json")  # a config.yaml written before: the value explicit
    saved["train"]["keep_momentum"] = False
    assert experiment(validate_config(saved)) == experiment(cfg)
    saved["algorithm"]["name"] = "fedrc"  # an old FedRC run without momentum is another run
    assert experiment(validate_config(saved)) != experiment(cfg_of(tmp_path, "fedrc"))


def test_notes_name_the_defaults_and_a_difference(tmp_path):
    rc, ifca = cfg_of(tmp_path, "fedrc"), cfg_of(tmp_path, "ifca")
    lines = training_notes({"fedrc": rc, "ifca": ifca})
    assert len(lines) == 2 and "fedrc: train.keep_momentum=True" in lines[0]
    assert "different train.keep_momentum (fedrc True, ifca False)" in lines[1]
    same = cfg_of(tmp_path, "ifca", train__keep_momentum=True)
    explicit = cfg_of(tmp_path, "fedrc", train__keep_momentum=True)
    assert training_notes({"fedrc": explicit, "ifca": same}) == []


def test_a_run_records_and_prints_what_it_took(tmp_path, cli):  # noqa: F811
    raw = tiny_config(tmp_path, algorithm={"name": "fedem", "params": {"num_clusters": 2}})
    raw["train"]["rounds"] = 1
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = cli("run", str(path))
    assert res.code == 0, res.err
    assert "fedem: train.keep_momentum=True from its reference code" in res.out
    summary = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())
    assert summary["algorithm_defaults"] == {"keep_momentum": True}


# ---------------------------------------------------------------------- validation split


def test_validation_is_carved_from_training_and_scored_apart(tmp_path):
    plain = cfg_of(tmp_path)
    cfg = cfg_of(tmp_path, scenario__validation_fraction=0.25)
    assert plain.scenario.hash(0) == validate_config(tiny_config(tmp_path)).scenario.hash(0)
    a, b = build_scenario(plain.scenario, 0), build_scenario(cfg.scenario, 0)
    for c0, c in zip(a.clients, b.clients, strict=True):
        tr, va, te = (set(t.tolist()) for t in (c.train_idx, c.val_idx, c.test_idx))
        assert not (tr & va) and not (va & te) and tr | va == set(c0.train_idx.tolist())
        assert len(va) == round(0.25 * c0.num_train)
        assert c.label_hist.sum() == c.num_train
    view = b.validation_view()
    assert view.test_clients == [] and all(
        v.test_idx is c.val_idx for v, c in zip(view.clients, b.clients, strict=True)
    )
    hist = run_experiment(cfg).history
    assert (
        all("val_acc" in h for h in hist)
        and "val_acc" not in run_experiment(plain, overwrite=True).history[0]
    )


# ---------------------------------------------------------------------- tuning


def test_tune_chooses_on_validation_and_reports_test_there(tmp_path):
    base = cfg_of(tmp_path, scenario__validation_fraction=0.2, train__rounds=2, eval__every=2)
    t = tune_compare(base, ["fedavg", "fedprox"], parse_tune(["lr=0.001,0.2"]), seeds=2)
    record = json.loads((t.out_dir / "tune.json").read_text())
    for row in t.rows:
        mine = [g for g in record["scores"] if g["method"] == row["method"]]
        best = max(mine, key=lambda g: g["val"][0])
        assert row["chosen"] == best["point"] and row["val"][2] == 2  # two seeds
        assert row["local_acc"][0] == pytest.approx(best["local"][0])
    assert {r["chosen"] for r in t.rows} == {"lr=0.2"}  # 0.001 barely moves in 2 rounds
    assert "chosen on validation accuracy" in (t.out_dir / "tune.md").read_text()
    assert t.notes == []  # FedAvg and FedProx take no reference defaults


def test_a_value_that_diverges_is_counted_and_not_chosen(tmp_path):
    """lr 1e6 diverges in both seeds: the grid table counts them, the choice is the other
    value, and the command does not stop (it used to raise the first diverged run)."""
    base = cfg_of(tmp_path, scenario__validation_fraction=0.2, train__rounds=2, eval__every=1)
    t = tune_compare(base, ["fedavg"], parse_tune(["lr=0.05,1e6"]), seeds=2)
    assert [r["chosen"] for r in t.rows] == ["lr=0.05"]
    counts = {g["point"]: g["diverged"] for g in t.grid_rows}
    assert counts == {"lr=0.05": 0, "lr=1000000.0": 2}
    with pytest.raises(FedshiftError, match="every value diverged"):
        tune_compare(base, ["fedavg"], parse_tune(["lr=1e6"]), seeds=1)


def test_tune_errors_are_one_line(tmp_path):
    with pytest.raises(FedshiftError, match="validation_fraction"):
        tune_compare(cfg_of(tmp_path), ["fedavg"], {"train.lr": [0.1]})
    with pytest.raises(FedshiftError, match="key=v1,v2"):
        parse_tune(["lr"])
    assert parse_tune(["lr=0.1,1e-2", "algorithm.params.mu=1"]) == {
        "train.lr": [0.1, 0.01],
        "algorithm.params.mu": [1],
    }


def test_a_tune_grid_in_brackets_is_the_list_of_values(tmp_path, cli):  # noqa: F811
    assert parse_tune(["lr=[0.1,0.2]"]) == parse_tune(["lr=0.1,0.2"]) == {"train.lr": [0.1, 0.2]}
    assert parse_tune(["algorithm.params.mu=[1, 1e-2]"]) == {"algorithm.params.mu": [1, 0.01]}
    for bad in (["lr=[0.1,0.2"], ["lr=[]"], ["lr=0.1]"]):
        with pytest.raises(FedshiftError, match="--tune") as err:
            parse_tune(bad)
        assert "\n" not in str(err.value)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    res = cli("compare", str(path), "--tune", "lr=[0.1,0.2")
    assert res.code == 2 and "unbalanced brackets" in res.err and "Traceback" not in res.err


@pytest.mark.parametrize(
    "spec, words",
    [
        ("lr=,", "--tune 'lr=,': the list of values for lr is empty"),
        ("lr=[]", "--tune 'lr=[]': the list of values for lr is empty"),
        ("algorithm.params.mu=", "the list of values for algorithm.params.mu is empty"),
        ("lr=0.1,", "--tune 'lr=0.1,': an empty value in the list of lr"),
    ],
)
def test_an_empty_tune_list_is_named_not_the_validation_split(tmp_path, cli, spec, words):
    """The config has no validation split either: the --tune value is the first mistake."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    line = cli("compare", str(path), "--tune", spec).error()
    assert words in line and "e.g. lr=0.01,0.05,0.1" in line, line
    assert "validation_fraction" not in line, line


def test_reproduce_says_where_its_lr_was_chosen():
    from fedshift.studies.papers import TABLES

    spec = TABLES["fedrc-table1"]
    assert "chosen on a test metric" in rule_text(spec, None, [0.01, 0.1])
    assert "chosen on validation" in rule_text(spec, "val_acc", [0.01, 0.1])


def test_the_choice_follows_validation_even_where_test_disagrees(tmp_path, monkeypatch):
    """Runs whose validation and test accuracies rank the grid the other way round: the choice
    is validation's, and the reported test accuracy is the chosen value's, worse or not."""
    from fedshift.studies import jobs

    def fake(cfg, **kw):
        val, test = {0.1: (80.0, 50.0), 0.2: (70.0, 90.0)}[cfg.train.lr]
        rec = {"round": 3, "val_acc": val + cfg.seed, "local_acc": test, "global_acc": test}
        data = type("D", (), {"clients": []})()
        return type("R", (), {"history": [rec], "data": data, "summary": {}})()

    monkeypatch.setattr(jobs, "run_experiment", fake)  # where every study's runs run
    base = cfg_of(tmp_path, scenario__validation_fraction=0.2)
    t = tune_compare(base, ["fedavg"], {"train.lr": [0.1, 0.2]}, seeds=2)
    (row,) = t.rows
    assert row["chosen"] == "lr=0.1" and row["val"][:2] == (80.5, 0.5)
    assert row["local_acc"][0] == 50.0 and row["global_acc"][0] == 50.0


def test_the_paper_tables_and_the_demo_train_as_before():
    """Every row of every reproduced table, under both profiles, and the demo's config either
    sets the keys an algorithm has defaults for or runs an algorithm without any: none of them
    takes a setting it did not have before (their numbers are unchanged)."""
    from fedshift.cli.console import find_config
    from fedshift.config import load_config
    from fedshift.studies.papers import TABLES
    from fedshift.studies.reproduce import plan_table

    taken = []
    for key, spec in TABLES.items():
        for col, path in spec.configs.items():
            base = load_config(find_config(path))
            for follow in ("paper", "code"):
                for job in plan_table(spec, col, base, follow=follow):
                    if algorithm_defaults(job.cfg):
                        taken.append((key, col, follow, job.label))
    assert taken == []
    from fedshift.studies.compare import algorithm_configs

    demo = load_config(find_config("configs/quickstart.yaml"))  # scripts/demo.sh's compare
    cfgs = algorithm_configs(demo, ["fedavg", "ifca", "fedrc"])
    assert all(algorithm_defaults(c) == {} for c in cfgs.values())
    assert {resolved_train(c).keep_momentum for c in cfgs.values()} == {True}  # as it sets


def test_seeds_without_tune_is_a_one_line_error(tmp_path, cli):  # noqa: F811
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    res = cli("compare", str(path), "--seeds", "3")
    assert res.code == 2 and "--seeds goes with --tune" in res.err


def test_tune_refuses_seed_as_a_grid_key_and_zero_seeds(tmp_path, cli):  # noqa: F811
    base = cfg_of(tmp_path, scenario__validation_fraction=0.1)
    with pytest.raises(FedshiftError, match="use --seeds|with --seeds N"):
        tune_compare(base, ["fedavg"], parse_tune(["seed=5,6"]), seeds=1)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, scenario__validation_fraction=0.1)))
    line = cli("compare", path, "--tune", "seed=5,6", "--seeds", "1").error()
    assert "--tune seed" in line and "--seeds N" in line
    for n in ("0", "-1"):
        line = cli("compare", path, "--tune", "lr=0.1,0.2", "--seeds", n).error()
        assert f"--seeds must be at least 1, got {n}" in line
    assert not (tmp_path / "runs").exists()  # nothing ran
