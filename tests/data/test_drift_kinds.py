"""Drift at any round (``scenario.drift``): each kind's ground truth against its declared
schedule, the data each client then holds, the engine's checks and availability, and a run
killed and resumed across a round-level drift event."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from fedshift.config import load_config, validate_config
from fedshift.config.drift import DriftConfig
from fedshift.core.errors import ConfigError
from fedshift.data.concepts import LabelMap
from fedshift.data.drift_plan import compile_plan, read_change_points
from fedshift.data.scenario import build_scenario
from fedshift.engine.simulator import Simulator, check_rounds, sample_clients
from fedshift.run.experiment import make_algorithm, sim_config
from fedshift.studies.papers.drift_bench import KINDS
from fedshift.studies.report import drift_rows_of
from tests.conftest import assert_resume_equals_uninterrupted, run_cli, tiny_config

ROOT = Path(__file__).resolve().parents[2]
C = 4
MAPS = [LabelMap("identity", (0, 1, 2, 3)), LabelMap("reverse", (3, 2, 1, 0))]


def plan(events, rounds=10, K=4, start=(0,), **kw):
    cfg = DriftConfig(rounds=rounds, start=list(start), events=events, **kw)
    return compile_plan(cfg, K, list(MAPS), seed=0)


# ---------------------------------------------------------------------- the plan (truth)


def test_sudden_and_staggered_onsets():
    p = plan([{"kind": "sudden", "at": 4, "to": 1, "clients": [1, 3]}])
    want = np.zeros((4, 10), int)
    want[[1, 3], 3:] = 1
    assert (p.truth() == want).all() and (p.onset == (want == 1) & (np.arange(10) == 3)).all()
    s = plan([{"kind": "sudden", "at": [3, 8], "to": 1, "clients": 1.0}], K=6)
    first = [int(np.argmax(row)) + 1 for row in s.truth()]  # each client's own round
    assert all(3 <= r <= 8 for r in first) and len(set(first)) > 1
    assert (s.truth().sum(axis=1) == 10 - np.array(first) + 1).all()


def test_gradual_ramps_the_share_of_the_new_concept():
    p = plan([{"kind": "gradual", "at": 3, "over": 4, "to": 1, "clients": [0]}])
    assert p.share[0].tolist() == [0, 0, 0.25, 0.5, 0.75, 0, 0, 0, 0, 0]
    assert p.concept_new[0, 2:5].tolist() == [1, 1, 1] and p.concept[0, 5:].tolist() == [1] * 5
    assert p.truth()[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]  # half or more: new


def test_incremental_rotation_grows_in_levels_and_keeps_the_concept():
    p = plan([{"kind": "incremental", "at": 3, "over": 4, "style": "rotate:80", "levels": 2,
               "clients": [2]}])  # fmt: skip
    styles = [p.styles[i] for i in p.style[2]]
    assert styles == ["clean"] * 2 + ["rotate:40"] * 2 + ["rotate:80"] * 6
    assert (p.truth() == 0).all() and p.final_styles == ["clean", "rotate:80"]
    assert p.onset[2].tolist() == [False, False, True] + [False] * 7


def test_recurrent_in_turn_and_at_random():
    p = plan([{"kind": "recurrent", "at": 3, "concepts": [1, 0], "period": 2, "clients": [0]}])
    assert p.truth()[0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0]
    r = plan([{"kind": "recurrent", "at": 2, "concepts": [0, 1], "switch_prob": 0.5}], rounds=40)
    flips = (r.truth()[:, 2:] != r.truth()[:, 1:-1]).mean()
    assert 0.3 < flips < 0.7  # about half the rounds


def test_label_swap_makes_a_swapped_concept():
    p = plan([{"kind": "label_swap", "at": 5, "pairs": [[0, 2]], "clients": [1, 2]}],
             start=(0, 1))  # fmt: skip
    bases = {int(p.truth()[k, 3]) for k in (1, 2)}
    assert len(p.maps) == 2 + len(bases)  # each base concept gets its own swapped map
    for k in (1, 2):
        base, new = p.truth()[k, 3], p.truth()[k, 4]
        m, b = p.maps[new].mapping, p.maps[base].mapping
        swap = {0: 2, 2: 0}  # the client's labels 0 and 2 are exchanged
        assert list(m) == [swap.get(v, v) for v in b] and m != b


def test_label_drift_moves_to_the_second_partition():
    p = plan([{"kind": "label", "at": 4, "over": 2, "clients": [3]}])
    assert p.unit[3, :3].tolist() == [3, 3, 3] and p.unit_new[3, 3] == 7 and p.share[3, 3] == 0.5
    assert p.unit[3, 4:].tolist() == [7] * 6 and (p.truth() == 0).all()
    assert p.uses_second_partition


def test_participation_follows_the_concept_and_ends():
    p = plan([
        {"kind": "sudden", "at": 3, "to": 1, "clients": [0, 1]},
        {"kind": "participation", "at": 5, "until": 8, "rate": 0.0, "concept": 1},
    ])  # fmt: skip
    off = ~p.available
    assert off[[0, 1], 4:7].all() and off.sum() == 6  # concept-1 clients, rounds 5..7
    assert not p.onset[:, 4].any()  # no data changed


def test_change_point_file_is_a_schedule(tmp_path):
    f = tmp_path / "x.cp"
    f.write_text("0 0 1\n1 0 1\n1 1 0\n")
    assert read_change_points(f).tolist() == [[0, 0, 1], [1, 0, 1], [1, 1, 0]]
    p = plan([], rounds=7, K=3, schedule={"file": str(f), "rounds_per_row": 2})
    assert p.truth()[0].tolist() == [0, 0, 1, 1, 1, 1, 1]  # rows stretched, the last kept
    assert p.truth()[2].tolist() == [1, 1, 1, 1, 0, 0, 0]
    with pytest.raises(ConfigError, match=r"3 columns .*num_clients is 4"):
        plan([], rounds=7, K=4, schedule={"file": str(f)})


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "is a directory"),
        (b"0 1\n\xff\xfe 0\n", "not UTF-8 text"),
        (b"0 1\n" + b"9" * 40 + b" 0\n", "concept id 9999.* is too large"),
    ],
)
def test_a_bad_change_point_file_is_one_line(tmp_path, content, match):
    f = tmp_path / "x.cp"
    f.mkdir() if content is None else f.write_bytes(content)
    with pytest.raises(ConfigError, match=match) as err:
        read_change_points(f)
    assert "\n" not in str(err.value)


def test_an_edited_change_point_file_is_refused_on_resume(tmp_path):
    f = tmp_path / "x.cp"
    f.write_text("0 0 0 0 0 0\n1 1 1 1 1 1\n")
    drift = {"rounds": 3, "schedule": {"file": str(f)}}
    raw = tiny_config(tmp_path, scenario__concepts=["identity", "reverse"], scenario__drift=drift)
    raw["train"].pop("rounds")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert run_cli("run", "c.yaml", cwd=tmp_path).returncode == 0
    f.write_text("0 0 0 0 0 0\n0 0 0 1 1 1\n")  # edited between the kill and the resume
    res = run_cli("run", "--resume", tmp_path / "runs" / "tiny", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "has changed since the run recorded it" in lines[0], lines


@pytest.mark.parametrize(
    "section, match",
    [
        ({"rounds": 10, "events": [{"kind": "sudden", "at": 12, "to": 1}]}, "after the last"),
        ({"rounds": 10, "events": [{"kind": "sudden", "at": 1, "to": 1}]}, "round 2 or later"),
        ({"rounds": 10, "events": [{"kind": "recurrent", "at": 3, "concepts": [0, 1]}]}, "one of"),
        ({"rounds": 10, "events": [{"kind": "sudden", "at": 3, "to": 1, "clients": 0}]}, "share"),
        ({"rounds": 10, "events": [{"kind": "drift", "at": 3}]}, "sudden"),
    ],
)
def test_bad_sections_name_the_problem(section, match):
    with pytest.raises(ValidationError, match=match):
        DriftConfig(**section)


def test_config_level_checks(tmp_path):
    drift = {"rounds": 6, "events": [{"kind": "sudden", "at": 3, "to": 2}]}
    with pytest.raises(ConfigError, match="concept 2 but only 1"):
        validate_config(tiny_config(tmp_path, scenario__drift=drift))
    raw = tiny_config(tmp_path, scenario__drift={**drift, "events": []})
    raw["train"]["rounds"] = 4
    with pytest.raises(ConfigError, match="drift.rounds is = 6"):
        validate_config(raw)


def test_shipped_kind_configs_are_the_benchmark_rows():
    base = yaml.safe_load((ROOT / "configs/drift/bench.yaml").read_text())
    for kind, section in KINDS.items():
        raw = yaml.safe_load((ROOT / f"configs/drift/{kind}.yaml").read_text())
        want = {"rounds": 30, "start": [0], **section}
        assert json.loads(json.dumps(raw["scenario"].pop("drift"))) == json.loads(json.dumps(want))
        del base["scenario"]["drift"], raw["name"]
        base.pop("name", None)
        assert raw == base, kind
        base = yaml.safe_load((ROOT / "configs/drift/bench.yaml").read_text())
        load_config(ROOT / f"configs/drift/{kind}.yaml")  # validates


# ---------------------------------------------------------------------- the data


def drift_config(tmp_path, events, algorithm="fedavg", params=None, start=(0,), **over):
    return validate_config(
        tiny_config(
            tmp_path,
            scenario={
                "dataset": "digits",
                "num_clients": 6,
                "concepts": ["identity", "reverse"],
                "test_fraction": 0.2,
                "test_clients": {"enabled": False},
                "drift": {"rounds": 8, "start": list(start), "events": events},
            },
            model={"name": "mlp", "width": 32},
            algorithm={"name": algorithm, "params": params or {}},
            train={"batch_size": 16, "lr": 0.05, "participation": 1.0},
            **over,
        )
    )


def test_records_hold_the_planned_data(tmp_path):
    cfg = drift_config(tmp_path, [
        {"kind": "gradual", "at": 3, "over": 4, "to": 1, "clients": [0]},
        {"kind": "label", "at": 4, "clients": [1]},
        {"kind": "incremental", "at": 5, "over": 2, "style": "rotate:90", "clients": [2]},
        {"kind": "participation", "at": 6, "rate": 0.0, "clients": [3]},
    ])  # fmt: skip
    data = build_scenario(cfg.scenario, cfg.seed)
    assert data.step_starts == [1, 3, 4, 5, 6]  # where some client's data changes
    rec = lambda r, k: data.steps[data.step_of_round(r) - 1][k]  # noqa: E731
    for r, share in ((2, 0.0), (3, 0.25), (4, 0.5), (5, 0.75), (6, 1.0), (8, 1.0)):
        c = rec(r, 0)
        raw = data.raw_label[c.train_idx.numpy()]
        flipped = (c.y_train.numpy() != raw).mean()  # reverse maps every label elsewhere
        assert flipped == pytest.approx(share, abs=0.02), r
    before, after = rec(3, 1), rec(4, 1)
    assert not set(before.train_idx.tolist()) & set(after.train_idx.tolist())  # other samples
    assert after.prev.train_idx is before.train_idx  # prev: the data it held before
    assert rec(5, 1).prev is None  # none where the data did not change
    assert rec(4, 2).style.label() == "clean" and rec(5, 2).style.label() == "rotate(45)"
    assert rec(8, 2).style.label() == "rotate(90)" and rec(8, 2).concept == 0
    assert data.available(5) == list(range(6)) and 3 not in data.available(6)
    assert data.available(99) == data.available(8)  # rounds past the plan stay in its last


def test_checks_run_at_changes_or_every_k(tmp_path):
    cfg = drift_config(tmp_path, [{"kind": "sudden", "at": [3, 6], "to": 1}])
    data = build_scenario(cfg.scenario, cfg.seed)
    starts = data.step_starts
    assert check_rounds(data, 8) == {r: i for i, r in enumerate(starts)}
    every = check_rounds(data, 8, every=3)  # rounds 1, 4, 7, whether or not the data changed
    assert list(every) == [1, 4, 7]
    assert every[4] == 1 and every[7] == data.step_of_round(4)  # the step of the last check
    algo = make_algorithm(drift_config(tmp_path, [], "feddaa", {"check_every": 3}), data, "cpu")
    assert Simulator(algo, data, sim_config(cfg)).checks == every
    seen = []
    orig = algo.start_step
    algo.start_step = lambda s, u, ctx: seen.append(ctx.round) or orig(s, u, ctx)
    Simulator(algo, data, sim_config(cfg)).run()
    assert seen == [1, 4, 7]


def test_sampling_draws_only_available_clients():
    got = sample_clients(10, 0.5, seed=0, rnd=3, available=[1, 4, 6, 7])
    assert len(got) == 2 and set(got) <= {1, 4, 6, 7}
    assert sample_clients(10, 1.0, seed=0, rnd=3, available=[]) == []
    assert sample_clients(10, 0.3, 0, 3) == sample_clients(10, 0.3, 0, 3, list(range(10)))


@pytest.mark.parametrize("algorithm, stop_at", [("feddaa", 3), ("feddrift", 4)])
def test_kill_and_resume_across_a_round_level_event(tmp_path, algorithm, stop_at):
    events = [{"kind": "sudden", "at": 4, "to": 1, "clients": 0.5},
              {"kind": "gradual", "at": 5, "over": 3, "to": 1, "clients": [0]}]  # fmt: skip
    full = assert_resume_equals_uninterrupted(drift_config(tmp_path, events, algorithm), stop_at)
    assert len(full.history[-1]["local_acc_clients"]) == 6
    t = np.array(full.summary["truth"]["concepts"])  # the run records the declared truth
    assert (t[:, :3] == 0).all() and t[:, 3].sum() == 3 and (t[0, 5:] == 1).all()
    (row,) = drift_rows_of([str(full.run_dir)])  # `fedshift report` scores it from its files
    assert row["changes"] == int((t[:, 1:] != t[:, :-1]).sum()) and row["detected"] is not None


@pytest.mark.parametrize("algorithm", ["feddaa", "feddrift"])
def test_checks_only_see_the_clients_whose_data_changed(tmp_path, algorithm):
    """At a check, a client whose data did not change is no drift (FedDAA's flag) and adds no
    new piece of data (FedDrift's history), so it does not train on a copy of its data."""
    cfg = drift_config(tmp_path, [{"kind": "sudden", "at": 3, "to": 1, "clients": [0, 1]}],
                       algorithm)  # fmt: skip
    data = build_scenario(cfg.scenario, cfg.seed)
    state = Simulator(make_algorithm(cfg, data, "cpu"), data, sim_config(cfg)).run()
    for k in range(2, 6):
        if algorithm == "feddaa":
            assert state.clients[k]["drifted"] is False
        else:
            assert list(state.clients[k]["data"]) == [1]
    if algorithm == "feddrift":
        assert all(list(state.clients[k]["data"]) == [1, 2] for k in (0, 1))
