"""The verdict on DFL's mechanism: each rule fails on the figure it reads, the larger critic
family and the better probe decide, a rule that does not apply neither passes nor fails a run,
and the verdict names the options under which the term worked."""

from __future__ import annotations

import pytest

from fedshift.tools.dfl_verdict import (
    dependence,
    digit_from,
    game_gap,
    holds,
    invariance_checks,
    mechanism,
    readable,
    within_checks,
)


def probe(sep=0.05, concat=0.08, ceiling=(1.30, 1.25), es=(12.0, 14.0)) -> dict:
    """A run's probe figures as benchmarks/dfl_probes.py writes them (the fields read here)."""

    def family(within, top):
        return {"within": {"mean": within}, "ceiling": {"mean": top}, "null": {"mean": 0.0}}

    return {
        "critics": {"separable": family(sep, ceiling[0]), "concat": family(concat, ceiling[1])},
        "digit": {"E_s": {"linear": {"mean": es[0]}, "mlp": {"mean": es[1]}}},
    }


def attributes(ratio: float, drop: float, net: str) -> dict:
    return {"attributes": {net: {"sensitivity": {"ratio": ratio}, "transfer": {"drop": drop}}}}


def test_the_larger_family_and_the_better_probe_decide():
    p = probe(sep=0.05, concat=0.40, ceiling=(0.8, 1.1), es=(12.0, 31.0))
    assert dependence(p) == 0.40
    assert readable(p) == 1.1
    assert digit_from(p) == 31.0


def test_a_disentangled_run_passes_every_rule():
    checks = within_checks([probe(), probe(sep=0.07)], [0.10, 0.12], "separable", [probe(0.6, 0.7)])
    assert [c.ok for c in checks] == [True] * 5
    assert holds(checks)
    assert checks[0].value == pytest.approx(0.08)  # the mean over seeds of the larger family
    assert checks[1].value == pytest.approx(0.08 / 0.7)


@pytest.mark.parametrize(
    ("run", "game", "control", "failing"),
    [
        (probe(sep=0.05, concat=0.20), 0.1, probe(0.9, 0.9), 0),  # concat finds dependence
        (probe(sep=0.10, concat=0.12), 0.1, probe(0.3, 0.4), 1),  # not a quarter of the control's
        (probe(ceiling=(0.8, 0.9)), 0.1, probe(0.9, 0.9), 2),  # critics that cannot read high
        (probe(es=(12.0, 25.0)), 0.1, probe(0.9, 0.9), 3),  # E_s still carries the digit
        (probe(sep=0.05), 0.25, probe(0.9, 0.9), 4),  # the game's critic far from its optimum
        (probe(sep=0.10, concat=0.1), -0.1, probe(0.9, 0.9), 4),  # ... also below it
    ],
)
def test_each_rule_fails_on_its_own_figure(run, game, control, failing):
    checks = within_checks([run], [game], "separable", [control])
    assert [i for i, c in enumerate(checks) if c.ok is False] == [failing]
    assert not holds(checks)


def test_a_rule_that_does_not_apply_is_not_counted():
    """A CLUB run logs no JSD game read-out, and a variant may lack its control."""
    checks = within_checks([probe()], [None], "separable", [])
    assert checks[4].ok is None and checks[4].value is None
    assert checks[1].ok is None
    assert holds(checks)
    assert "| n/a |" in checks[4].line()
    assert game_gap(probe(sep=0.2), 0.5, "concat") == pytest.approx(0.5 - 0.08)
    assert game_gap(probe(), 0.5, "club") is None


def test_invariance_is_read_against_fedavgs_body():
    body = attributes(0.8, 10.0, "body")
    assert holds(invariance_checks(attributes(0.3, 1.5, "inv"), body))
    ratio, drop = invariance_checks(attributes(0.5, 1.5, "inv"), body)
    assert ratio.ok is False and ratio.value == pytest.approx(0.625) and drop.ok is True
    ratio, drop = invariance_checks(attributes(0.3, 2.5, "inv"), body)
    assert ratio.ok is True and drop.ok is False


def test_the_verdict_names_what_worked():
    assert mechanism(True, {"CLUB": False}) == "works"
    assert mechanism(False, {"CLUB": True, "warm-up": False, "stage 2": True}) == (
        "works only with CLUB or stage 2"
    )
    assert mechanism(False, {"CLUB": False}) == "not reproduced"


# ------------------------------------------------------------------ the drivers on tiny runs


def _script(name: str, argv: list[str], capsys) -> str:
    """Run ``benchmarks/<name>`` in this process with ``argv``; its standard output."""
    import runpy
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / name
    old = sys.argv
    sys.argv = [str(path), *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = old
    return capsys.readouterr().out


@pytest.mark.slow
def test_probe_and_verdict_drivers_on_tiny_runs(tmp_path, capsys):
    """Three tiny runs on a two-colour scenario (DFL, its beta_s = 0 control, FedAvg) probed by
    benchmarks/dfl_probes.py and judged by benchmarks/dfl_mechanism.py: every run and the
    untrained network get their rows, and the tables print the figures of probes.json."""
    import json
    import shutil

    from fedshift.config import validate_config
    from fedshift.run.experiment import run_experiment
    from tests.conftest import tiny_config

    runs = {
        "dfl": {"name": "dfl"},
        "dfl-beta_s-0": {"name": "dfl", "params": {"beta_s": 0.0}},
        "fedavg": {"name": "fedavg"},
    }
    folder = tmp_path / "results"
    for variant, algorithm in runs.items():
        raw = tiny_config(
            tmp_path,
            name=variant,
            scenario={"dataset": "digits", "num_clients": 4, "attributes": {"kind": "color", "colors_per_client": 2}},
            model={"name": "convbn_cnn"},
            algorithm=algorithm,
            train={"rounds": 1, "batch_size": 16, "lr": 0.05, "local_steps": 2, "momentum": 0.0},
        )  # fmt: skip
        run_experiment(validate_config(raw))
        shutil.copytree(tmp_path / "runs" / variant, folder / "two-colours" / variant / "seed0")
    small = ["--per-client", "24", "--steps", "20", "--batch", "16", "--hidden", "16"]
    small += ["--probe-steps", "10"]
    small += ["--colour-images", "6", "--colours", "0,1,2", "--tail", "3"]
    dfl = folder / "two-colours" / "dfl" / "seed0"
    out = _script(
        "dfl_probes.py", [str(dfl), "--initial", *small, "--json", str(tmp_path / "a.json")], capsys
    )
    assert "two-colours/dfl/seed0 (initial network)" in out
    rest = [str(folder / "two-colours" / v / "seed0") for v in ("dfl-beta_s-0", "fedavg")]
    _script("dfl_probes.py", [*rest, *small, "--json", str(tmp_path / "b.json")], capsys)
    merge = ["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert "4 runs from 2 files" in _script(
        "dfl_probes.py", [*merge, "--json", str(folder / "probes.json")], capsys
    )

    figures = json.loads((folder / "probes.json").read_text())
    report = _script("dfl_mechanism.py", [str(folder)], capsys)
    within = figures["two-colours/dfl/seed0"]["critics"]["separable"]["within"]["mean"]
    assert f"| two-colours/dfl/seed0 | DFL, the paper's objective | {within:.3f} |" in report
    assert "| two-colours/dfl/seed0 untrained | untrained network |" in report
    assert "| two-colours/dfl-beta_s-0/seed0 | DFL, `beta_s=0.0` (control) |" in report
    assert "E_c's colour / content distance over FedAvg's body's" in report
    assert "The MI term within clients: **" in report and "E_c colour-invariant: **" in report
    body = figures["two-colours/fedavg/seed0"]["attributes"]["body"]["sensitivity"]["ratio"]
    assert f"| two-colours/fedavg/seed0: body | {body:.3f} |" in report


def test_the_verdict_driver_names_a_missing_or_misnamed_probe_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        _script("dfl_mechanism.py", [str(tmp_path)], capsys)
    assert err.value.code == 2 and "has no probes.json" in capsys.readouterr().err
    (tmp_path / "probes.json").write_text('{"seed0": {}}')
    with pytest.raises(SystemExit):
        _script("dfl_mechanism.py", [str(tmp_path)], capsys)
    assert "names 'seed0': runs are named SETTING/VARIANT/seedN" in capsys.readouterr().err
