"""Settings that would be silently wrong are refused or kept apart: a drift scenario's unused
mix and feature_shift, a change-point file's content in the scenario's identity, and the rule
behind a bad client id."""

import pytest
import yaml

from fedshift.algorithms.registry import experiment
from fedshift.config import dump_config, validate_config
from fedshift.core.errors import ConfigError
from tests.conftest import tiny_config

DRIFT = {"rounds": 3, "events": [{"kind": "sudden", "at": 2, "to": 1}]}


def drift_cfg(tmp_path, drift=DRIFT, **over):
    return tiny_config(
        tmp_path, scenario__concepts=["identity", "reverse"], scenario__drift=drift, **over
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("mix", {"types": [{"fraction": 0.5}, {"fraction": 0.5, "feature": True}]}),
        ("feature_shift", {"styles": ["fog"], "severities": [3]}),
    ],
)
def test_drift_refuses_the_keys_it_does_not_read(tmp_path, key, value):
    with pytest.raises(ConfigError) as err:
        validate_config(drift_cfg(tmp_path, **{f"scenario__{key}": value}))
    msg = str(err.value)
    assert "\n" not in msg and f"{key} has no effect with drift" in msg
    assert f"remove scenario.{key}" in msg


def test_a_dumped_drift_config_validates_again(tmp_path):
    cfg = validate_config(drift_cfg(tmp_path))  # mix and feature_shift written as defaults
    assert validate_config(yaml.safe_load(dump_config(cfg))) == cfg


def test_a_negative_client_id_names_the_rule(tmp_path):
    drift = {"rounds": 3, "events": [{"kind": "sudden", "at": 2, "to": 1, "clients": [-1]}]}
    with pytest.raises(ConfigError) as err:
        validate_config(drift_cfg(tmp_path, drift))
    msg = str(err.value)
    assert "client ids are 0 or more" in msg and "valid number" not in msg, msg


def schedule_cfg(tmp_path, text="0 0 0 0 0 0\n1 1 1 1 1 1\n"):
    f = tmp_path / "x.cp"
    f.write_text(text)
    drift = {"rounds": 3, "schedule": {"file": str(f)}}
    return validate_config(drift_cfg(tmp_path, drift)), f


def test_a_change_point_file_content_is_part_of_the_scenario(tmp_path):
    cfg, f = schedule_cfg(tmp_path)
    before, ident = cfg.scenario_hash(), experiment(cfg)
    saved = validate_config(yaml.safe_load(dump_config(cfg)))  # what a run records
    assert saved.scenario.drift.schedule.sha256 is not None
    assert experiment(saved) == ident and saved.scenario_hash() == before
    f.write_text("0 0 0 0 0 0\n0 0 0 1 1 1\n")  # the file edited, its name kept
    assert cfg.scenario_hash() != before
    assert experiment(saved) != experiment(cfg)  # a sweep does not take the old run as this
