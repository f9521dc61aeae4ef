"""``compare`` as jobs (fedshift.studies.jobs): the same runs, whether they train in this
process, in local worker processes or on Ray."""

from __future__ import annotations

import pytest

from fedshift.config import validate_config
from fedshift.core.errors import FedshiftError
from fedshift.data.scenario import build_scenario
from fedshift.engine.metrics import TIMING_KEYS
from fedshift.studies.compare import compare
from tests.conftest import tiny_config


def _numbers(history: list[dict]) -> list[dict]:
    """A history without its wall times (the only values that differ between two runs)."""
    return [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]


def test_two_local_workers_give_the_same_histories_as_this_process(tmp_path):
    def cfg(where: str):
        return validate_config(tiny_config(tmp_path / where, name="cmp", train__rounds=2))

    here = compare(cfg("here"), ["fedavg", "local"])
    apart = compare(cfg("apart"), ["fedavg", "local"], workers=2)
    assert list(apart.histories) == ["fedavg", "local"]
    for name, hist in here.histories.items():
        assert _numbers(apart.histories[name]) == _numbers(hist), name
    table = (here.out_dir / "comparison.md").read_text().splitlines()
    other = (apart.out_dir / "comparison.md").read_text().splitlines()
    assert [r.rsplit("|", 2)[0] for r in table] == [r.rsplit("|", 2)[0] for r in other]


def test_a_callers_data_is_the_scenario_of_the_runs_in_this_process(tmp_path):
    base = validate_config(tiny_config(tmp_path, name="own", train__rounds=1))
    data = build_scenario(base.scenario, base.seed, base.data_dir)
    data.name = "the caller's"
    seen = []

    class Look:
        def on_start(self, sim, state):
            seen.append(sim.data)

        def on_round_end(self, sim, state, metrics):
            pass

        def on_end(self, sim, state):
            pass

    res = compare(base, ["fedavg", "local"], data=data, callbacks=lambda name: [Look()])
    assert res.data is data and len(seen) == 2 and all(d is data for d in seen)
    with pytest.raises(FedshiftError, match="listener"):
        compare(base, ["fedavg"], callbacks=lambda name: [], workers=2)
