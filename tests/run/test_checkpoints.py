"""When a run writes its checkpoint: every N rounds, or by cost (``output.checkpoint_every``)."""

from __future__ import annotations

import pytest

from fedshift.config import validate_config
from fedshift.core.errors import ConfigError
from fedshift.run.experiment import run_experiment
from fedshift.run.folder import AUTO_CHEAP_S, AUTO_FACTOR, RunRecorder, checkpoint_due
from tests.conftest import tiny_config


def test_fixed_interval_and_the_last_round():
    due = [r for r in range(1, 11) if checkpoint_due(3, r, 10, 0.0, 0.0)]
    assert due == [3, 6, 9, 10]  # every third round, and the last one always


def test_auto_writes_every_round_while_checkpoints_are_cheap():
    cheap = AUTO_CHEAP_S / 2
    assert checkpoint_due("auto", 1, 100, 0.0, None)  # the first one, whatever it costs
    assert all(checkpoint_due("auto", r, 100, 0.001, cheap) for r in range(2, 99))


def test_auto_spaces_costly_checkpoints_to_a_tenth_of_the_time():
    cost = 20.0  # seconds a checkpoint takes (gigabytes of client momentum)
    assert not checkpoint_due("auto", 7, 100, AUTO_FACTOR * cost - 0.1, cost)
    assert checkpoint_due("auto", 7, 100, AUTO_FACTOR * cost, cost)
    assert checkpoint_due("auto", 100, 100, 0.0, cost)  # the last round still writes


class _Sim:
    class cfg:  # noqa: N801 - stands in for the simulator's config
        rounds = 6


class _State:
    def __init__(self, rnd: int) -> None:
        self.round, self.history, self.clients, self.momentum = rnd, [], {}, {}


class _Run:
    """A RunDir whose checkpoints take ``cost`` seconds on a fake clock."""

    def __init__(self, clock: list[float], cost: float) -> None:
        self.clock, self.cost, self.saved = clock, cost, []

    def write_metrics(self, history) -> None:
        pass

    def save_checkpoint(self, state, meta) -> None:
        self.clock[0] += self.cost
        self.saved.append(state.round)


@pytest.mark.parametrize(
    ("cost", "round_s", "expected"), [(0.01, 1.0, [1, 2, 3, 4, 5, 6]), (5.0, 20.0, [1, 4, 6])]
)
def test_the_recorder_measures_what_a_checkpoint_costs(monkeypatch, cost, round_s, expected):
    """Cheap: every round. 5 s checkpoints after 20 s rounds: the next one once 50 s have
    passed since the last ended (rounds 2 and 3 end 20 and 40 s after it, round 4 at 60 s)."""
    clock = [0.0]
    monkeypatch.setattr("fedshift.run.folder.time.perf_counter", lambda: clock[0])
    run = _Run(clock, cost)
    rec = RunRecorder(run, {}, "auto")
    rec.on_start(_Sim, _State(0))
    for r in range(1, 7):
        clock[0] += round_s
        rec.on_round_end(_Sim, _State(r), None)
    assert run.saved == expected


def test_config_accepts_auto_or_positive_rounds(tmp_path):
    assert validate_config(tiny_config(tmp_path)).output.checkpoint_every == "auto"
    assert (
        validate_config(tiny_config(tmp_path, output__checkpoint_every=5)).output.checkpoint_every
        == 5
    )
    for bad in (0, -1, "often"):
        with pytest.raises(ConfigError, match="output.checkpoint_every"):
            validate_config(tiny_config(tmp_path, output__checkpoint_every=bad))


def test_a_run_resumed_from_an_older_checkpoint_ends_as_an_uninterrupted_one(tmp_path):
    """With checkpoints every 2 rounds, a run stopped after round 3 resumes from round 2 (its
    metrics.jsonl already held round 3) and ends with the uninterrupted run's metrics."""
    full = run_experiment(validate_config(tiny_config(tmp_path, name="full", train__rounds=5)))
    cfg = validate_config(
        tiny_config(tmp_path, name="cut", train__rounds=5, output__checkpoint_every=2)
    )

    class Stop(Exception):
        pass

    class StopAfter3:
        def on_start(self, sim, state):
            pass

        def on_round_end(self, sim, state, metrics):
            if state.round == 3:
                raise Stop

        def on_end(self, sim, state):
            pass

    with pytest.raises(Stop):
        run_experiment(cfg, callbacks=[StopAfter3()])
    res = run_experiment(cfg, resume=True)
    assert [h["round"] for h in res.history] == [h["round"] for h in full.history]
    for a, b in zip(full.history, res.history, strict=True):
        for key in ("local_acc", "global_acc", "train_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), (a["round"], key)


def test_compare_reuses_finished_runs_and_fresh_trains_again(tmp_path):
    """A second `compare` of the same settings reuses the finished runs (their checkpoints are
    not rewritten, the table is the same); ``fresh`` trains every algorithm again."""
    from fedshift.studies.compare import compare

    base = validate_config(tiny_config(tmp_path, name="cmp", train__rounds=2))
    first = compare(base, ["fedavg", "local"])
    ckpt = tmp_path / "runs" / "cmp" / "fedavg" / "checkpoint.pt"
    stamp = ckpt.stat().st_mtime_ns
    again = compare(base, ["fedavg", "local"])
    assert ckpt.stat().st_mtime_ns == stamp
    assert again.rows() == first.rows()
    compare(base, ["fedavg", "local"], fresh=True)
    assert ckpt.stat().st_mtime_ns != stamp
