"""The ground truth per round (:mod:`fedshift.data.truth`) against the declared timeline of
``configs/examples/drift_switch.yaml`` (at a reduced size): constant within a step, changes at
step boundaries only, the configured ``switch`` share of clients changes at each boundary, and
it is each step's ``Client.concept``; a static scenario is constant; ``fedshift scenario``
draws ``timeline.png``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.config import load_config, validate_config
from fedshift.data.scenario import build_scenario
from fedshift.data.truth import (
    concept_changes,
    concept_schedule,
    round_steps,
    step_boundaries,
    style_schedule,
)
from tests.conftest import tiny_config

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "examples" / "drift_switch.yaml"
K = 10
SMALL = [
    f"scenario.num_clients={K}",
    "scenario.train_fraction_of_dataset=0.02",
    "scenario.test_clients.max_samples=200",
    # Fashion-MNIST where the shared data is (CI); scikit-learn's digits elsewhere
    *([] if os.environ.get("FEDSHIFT_DATA") else ["scenario.dataset=digits"]),
]


@pytest.fixture(scope="module")
def drift():
    cfg = load_config(EXAMPLE, SMALL)
    return cfg, build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)


def test_schedule_follows_the_declared_steps(drift):
    cfg, data = drift
    tl = cfg.scenario.timeline
    T, rps, R = len(tl.steps), tl.rounds_per_step, cfg.train.rounds
    assert len(tl.steps) * rps == cfg.train.rounds
    sched = concept_schedule(data, R)
    assert sched.shape == (K, R) and sched.dtype.kind == "i"
    for t in range(1, T + 1):
        block = sched[:, (t - 1) * rps : t * rps]  # rounds (t-1)*rps+1 .. t*rps
        assert (block == block[:, :1]).all(), f"concept changes within step {t}"
        assert block[:, 0].tolist() == [c.concept for c in data.steps[t - 1]]
        assert set(block[:, 0].tolist()) <= set(tl.steps[t - 1].concepts)
    changes = concept_changes(sched)
    boundaries = [t * rps + 1 for t in range(1, T)]
    assert step_boundaries(data, R) == boundaries
    assert set(np.flatnonzero(changes.any(axis=0)) + 1) <= set(boundaries)
    for t, b in enumerate(boundaries, start=2):  # the switch rule of timeline.py
        prev = sched[:, b - 2]
        gone = sum(c not in tl.steps[t - 1].concepts for c in prev.tolist())
        assert gone == 0  # the example keeps every concept: exactly the share moves
        assert changes[:, b - 1].sum() == round(tl.steps[t - 1].switch * K), f"boundary {b}"
        assert changes[:, b - 1].tolist() == [c.drifted for c in data.steps[t - 1]]
    assert round_steps(data, R).tolist() == [data.step_of_round(r) for r in range(1, R + 1)]


def test_schedule_leaves_the_data_at_its_step(drift):
    cfg, data = drift
    step, clients = data.step, data.clients
    concept_schedule(data, cfg.train.rounds)
    style_schedule(data, cfg.train.rounds)
    assert data.step == step == 1 and data.clients is clients
    later = data.at_step(3)
    assert (concept_schedule(later, 7) == concept_schedule(data, 7)).all()  # not the step's
    assert later.step == 3 and data.step == 1


def test_rounds_past_the_timeline_stay_in_the_last_step_and_styles_follow_it(drift):
    cfg, data = drift
    tl, R = cfg.scenario.timeline, cfg.train.rounds
    sched = concept_schedule(data, R + 5)
    assert (sched[:, R:] == sched[:, R - 1 : R]).all()
    assert (concept_schedule(data) == sched[:, :R]).all()  # default: T x rounds_per_step
    styles = style_schedule(data, R)
    assert styles.shape == (K, R)
    assert set(styles[:, 0]) == {"clean"} and set(styles[:, -1]) == {"rotate(180)"}
    assert tl.steps[-1].style == "rotate:180"


def test_static_scenario_is_its_concepts_repeated(tmp_path):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            scenario__concepts=["identity", "reverse"],
            scenario__mix={"types": [{"fraction": 1.0, "concepts": [0, 1]}]},
        )
    )
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    sched = concept_schedule(data, 4)
    assert sched.shape == (len(data.clients), 4)
    assert len(set(sched[:, 0].tolist())) == 2  # both concepts are there
    for r in range(4):
        assert sched[:, r].tolist() == [c.concept for c in data.clients]
    assert not concept_changes(sched).any() and step_boundaries(data, 4) == []
    with pytest.raises(ValueError, match="rounds"):
        concept_schedule(data)


def test_scenario_command_writes_the_timeline_figure(tmp_path):
    out = tmp_path / "figs" / "scenario.png"
    res = CliRunner().invoke(app, ["scenario", str(EXAMPLE), *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    png = out.with_name("timeline.png")
    assert png.stat().st_size > 5000 and "timeline" in res.output
    static = tmp_path / "static.yaml"
    static.write_text(yaml.safe_dump(tiny_config(tmp_path)))
    res = CliRunner().invoke(app, ["scenario", str(static), "--out", str(tmp_path / "s.png")])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "timeline.png").exists()
