"""Drift metrics against the scenario's truth, on hand-built arrays whose answers are worked out
by hand in each test: delays, misses, false alarms, recovery, the accuracy AUC, forgetting on
returning concepts, and the summary that puts them together (NaNs and empty cases included)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedshift.reporting.drift_measures import (
    accuracy_auc,
    change_points,
    detection_delays,
    drift_summary,
    false_alarms_per_100,
    forgetting,
    pre_drift_level,
    reactions_from_assignments,
    recovery_time,
)

NAN = math.nan


def flags_at(shape: tuple[int, int], *client_rounds: tuple[int, int]) -> np.ndarray:
    """A flag grid with reactions at the given (client, 1-based round) pairs."""
    f = np.zeros(shape, dtype=bool)
    for c, r in client_rounds:
        f[c, r - 1] = True
    return f


def test_change_points_are_one_based_rounds_per_client():
    truth = [[0, 0, 0, 0, 1, 1, 1, 1], [2, 2, 3, 3, 3, 2, 2, 2], [1] * 8]
    # client 0: concept differs from the round before at round 5; client 1 at rounds 3 and 6
    assert change_points(truth) == [(0, 5), (1, 3), (1, 6)]
    assert change_points([[4] * 6]) == []
    with pytest.raises(ValueError, match="2-D"):
        change_points([0, 0, 1])


def test_reactions_from_assignments_ignore_unknowns_and_the_first_assignment():
    assign = [[0, 0, 1, 1, -1, 1, 2], [-1, 3, 3, -1, -1, 4, 4]]
    want = [
        [False, False, True, False, False, False, True],  # 0->1 at round 3; 1,-1,1 is no change
        [False, False, False, False, False, True, False],  # first known (3) is no reaction; 3->4
    ]
    assert reactions_from_assignments(assign).tolist() == want


def test_delay_is_rounds_from_change_to_first_reaction():
    truth = [[0, 0, 0, 0, 1, 1, 1, 1]]  # change at round 5
    det = detection_delays(truth, flags_at((1, 8), (0, 7), (0, 8)))
    assert det.detected == [(0, 5, 2)] and det.missed == []  # first reaction (7) counts: 7 - 5
    assert det.mean_delay == 2.0 and det.detection_rate == 1.0
    # a reaction at the change round itself is a delay of 0; one before it is no detection
    assert detection_delays(truth, flags_at((1, 8), (0, 5))).detected == [(0, 5, 0)]
    assert detection_delays(truth, flags_at((1, 8), (0, 4))).missed == [(0, 5)]


def test_a_reaction_after_the_next_change_belongs_to_that_change():
    truth = [[0, 0, 1, 1, 1, 2, 2, 2]]  # changes at rounds 3 and 6
    det = detection_delays(truth, flags_at((1, 8), (0, 7)))
    assert det.missed == [(0, 3)] and det.detected == [(0, 6, 1)]
    assert det.mean_delay == 1.0 and det.detection_rate == 0.5
    # a reaction in the round before the next change still counts for the first one
    assert detection_delays(truth, flags_at((1, 8), (0, 5))).detected == [(0, 3, 2)]


def test_horizon_bounds_the_delay_inclusively():
    truth = [[0, 0, 0, 0, 1, 1, 1, 1, 1]]  # change at 5, reaction at 8: delay 3
    flags = flags_at((1, 9), (0, 8))
    assert detection_delays(truth, flags, horizon=2).missed == [(0, 5)]
    assert detection_delays(truth, flags, horizon=3).detected == [(0, 5, 3)]


def test_no_changes_and_never_detected():
    none = detection_delays([[1, 1, 1], [2, 2, 2]], flags_at((2, 3), (0, 2)))
    assert none.detected == [] and none.missed == []
    assert none.mean_delay is None and none.detection_rate is None
    never = detection_delays([[0, 1, 1], [0, 0, 2]], np.zeros((2, 3), bool))
    assert never.missed == [(0, 2), (1, 3)] and never.mean_delay is None
    assert never.detection_rate == 0.0


def test_false_alarms_are_reactions_outside_every_tolerance_window():
    truth = [[0, 0, 0, 0, 1, 1, 1, 1, 1, 1], [0] * 10]  # client 0 changes at round 5
    # (0,7): 5 <= 7 <= 5+2, attributable; (0,8): past the window; (0,4): before the change;
    # (1,3): client 1 never changes -> 3 false alarms over 2 * 10 client-rounds
    flags = flags_at((2, 10), (0, 5), (0, 7), (0, 8), (0, 4), (1, 3))
    assert false_alarms_per_100(truth, flags, tolerance=2) == pytest.approx(100 * 3 / 20)
    # the window is inclusive: with tolerance 3, round 8 (= 5 + 3) is attributable
    assert false_alarms_per_100(truth, flags, tolerance=3) == pytest.approx(100 * 2 / 20)


def test_a_flag_with_no_change_is_one_false_alarm_and_a_reaction_at_the_change_none():
    assert false_alarms_per_100([[0, 0, 0, 0]], flags_at((1, 4), (0, 2))) == 25.0
    assert false_alarms_per_100([[0, 1, 1, 1]], flags_at((1, 4), (0, 2)), tolerance=0) == 0.0
    assert false_alarms_per_100([[0, 1, 1, 1]], np.zeros((1, 4), bool)) == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        false_alarms_per_100([[0, 1, 1]], np.zeros((1, 4), bool))


def test_recovery_time_of_a_dip_and_recover_curve():
    acc = [80, 80, 80, 80, 60, 70, 79, 81, 80]  # change at round 5
    # level = mean(80, 80, 80) = 80; first round at >= 78 from round 5 on is round 7 (79)
    assert recovery_time(acc, 5, window=3, within=2.0) == 2
    # stricter: >= 80.5 first at round 8 (81)
    assert recovery_time(acc, 5, window=3, within=-0.5) == 3
    # exactly `within` points below the level counts as back: 78 >= 80 - 2
    assert recovery_time([80, 80, 80, 50, 78], 4) == 1
    # never dipped: accuracy at the change round is already back -> 0
    assert recovery_time([70, 70, 69, 71], 3, window=2) == 0


def test_recovery_time_uses_only_evaluated_rounds():
    acc = [70, 80, 90, NAN, 50, NAN, 85]  # change at 5
    # the 2 evaluated rounds before round 5 are rounds 2 and 3: level 85; round 6 is skipped,
    # round 7 (85 >= 83) recovers
    assert pre_drift_level(acc, 5, window=2) == 85.0
    assert recovery_time(acc, 5, window=2) == 2
    assert pre_drift_level(acc, 5, window=10) == 80.0  # fewer evaluated rounds than the window


def test_never_recovers_and_no_level_to_recover_to():
    assert recovery_time([80, 80, 80, 50, 60, 70], 4) is None
    # recovery after the end round (e.g. the next change) does not count
    acc = [80, 80, 80, 50, 60, 80]
    assert recovery_time(acc, 4) == 2
    assert recovery_time(acc, 4, end_round=6) is None
    assert pre_drift_level([NAN, NAN, 50], 3) is None
    with pytest.raises(ValueError, match="no evaluated round"):
        recovery_time([NAN, NAN, 50], 3)


def test_accuracy_auc_is_normalised_by_the_span():
    assert accuracy_auc([80.0] * 10) == pytest.approx(80.0)
    assert accuracy_auc([0.0, 100.0]) == pytest.approx(50.0)
    # NaNs are skipped: (60 + 100) / 2 over the span 1..4
    assert accuracy_auc([60, NAN, NAN, 100]) == pytest.approx(80.0)
    # uneven spacing: (60+100)/2 * 1 + 100 * 2 = 280 over 3 rounds
    assert accuracy_auc([60, 100, NAN, 100]) == pytest.approx(280 / 3)
    assert accuracy_auc([50, 100], rounds=[10, 20]) == pytest.approx(75.0)
    assert accuracy_auc([NAN, 42.0, NAN]) == 42.0
    assert accuracy_auc([NAN, NAN]) is None


def test_forgetting_on_a_returning_concept():
    concepts = [0, 0, 0, 1, 1, 0, 0]
    acc = [70, 80, 90, 50, 60, 75, 85]
    # concept 0 is left at 90 (round 3) and met again at 75 (round 6): forgot 15 points
    assert forgetting(acc, concepts) == [(6, 0, 15.0)]
    assert forgetting([80, 60, 70, 65], [0, 1, 0, 1]) == [(3, 0, 10.0), (4, 1, -5.0)]
    assert forgetting([70, 80, 90], [0, 0, 0]) == []


def test_forgetting_uses_the_last_and_first_evaluated_rounds():
    # left at 80 (round 2 unevaluated), returned at round 4, first evaluated at round 5 (70)
    assert forgetting([80, NAN, 50, NAN, 70], [0, 0, 1, 0, 0]) == [(4, 0, 10.0)]
    # a return never evaluated is left out
    assert forgetting([80, 50, NAN], [0, 1, 0]) == []


TRUTH = [[0, 0, 0, 0, 1, 1, 0, 0], [0] * 8]  # client 0 changes at rounds 5 and 7
FLAGS = flags_at((2, 8), (0, 6), (1, 3))  # round 6 detects the change at 5; (1, 3) false alarm


def test_drift_summary_per_client():
    acc = [[80, 80, 80, 80, 60, 79, 70, NAN], [70] * 8]
    # change at 5: level 80, round 6 (79 >= 78) recovers -> 1. change at 7: level
    # mean(80, 60, 79) = 73, round 7 70 < 71 and round 8 unevaluated -> never.
    # forgetting: concept 0 left at 80 (round 4), met again at 70 (round 7) -> 10.
    # mean curve: 75 x4, 65, 74.5, 70, 70 -> trapezoid 75*3 + 70 + 69.75 + 72.25 + 70 = 507 / 7
    got = drift_summary(TRUTH, FLAGS, acc, tolerance=1)
    assert got == {
        "changes": 2,
        "onsets": 2,
        "detected": 1,
        "missed": 1,
        "detection_rate": 0.5,
        "mean_delay": 1.0,
        "false_alarms_per_100": 100 / 16,
        "recovered": 1,
        "never_recovered": 1,
        "recovery_unmeasurable": 0,
        "mean_recovery": 1.0,
        "accuracy_auc": pytest.approx(507 / 7),
        "returns": 1,
        "mean_forgetting": 10.0,
    }


def test_drift_summary_overall_curve_and_unmeasurable_recovery():
    got = drift_summary(TRUTH, FLAGS, [80, 80, 80, 80, 60, 79, 70, 70], tolerance=1)
    assert (got["recovered"], got["never_recovered"], got["mean_recovery"]) == (1, 1, 1.0)
    assert got["returns"] is None and got["mean_forgetting"] is None
    # a change at round 2 with round 1 unevaluated has no level: counted apart
    got = drift_summary([[0, 1, 1]], np.zeros((1, 3), bool), [[NAN, 50, 60]])
    assert (got["recovery_unmeasurable"], got["recovered"], got["never_recovered"]) == (1, 0, 0)
    assert got["mean_recovery"] is None and got["accuracy_auc"] == pytest.approx(55.0)
    assert (got["missed"], got["detection_rate"], got["false_alarms_per_100"]) == (1, 0.0, 0.0)
