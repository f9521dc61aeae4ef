"""How each compared method copes with drift, scored against the scenario's truth.

For a scenario with a timeline, :func:`drift_rows` turns each run's ``metrics.jsonl`` records
into the measures of :mod:`fedshift.reporting.drift_measures`:

- the truth is the true concept of every client at every round
  (:func:`fedshift.data.truth.concept_schedule`);
- a method's *reaction* at a round is a change of a client's cluster assignment (the
  ``clusters`` of an evaluation); a method without assignments (FedAvg, a personalised
  method) gives no reactions, so its detection measures are ``None``, not zero;
- the accuracy is every client's own on its current test split (``local_acc_clients``, which
  the simulator records in drift scenarios), NaN where no evaluation was made: recovery is
  measured per client from each of its drift onsets (concept changes, and for
  ``scenario.drift`` every event's onset, also of drifts that change no concept), forgetting
  per client on its returning concepts, the AUC on the mean over clients. Records without
  per-client accuracy fall back to the overall ``local_acc``, once per distinct round.

Evaluate every round (``eval.every: 1``) for delays and recovery times in rounds; with a
sparser evaluation they are bounded by the evaluation interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedshift.data.federated import FederatedData
from fedshift.data.truth import concept_schedule, onset_schedule
from fedshift.reporting.drift_measures import drift_summary, reactions_from_assignments
from fedshift.reporting.summary import Table, markdown

#: the columns of the drift table: key, title, digits
COLUMNS = (
    ("accuracy_auc", "acc AUC %", 2),
    ("detection_rate", "detected", 2),
    ("mean_delay", "delay (rounds)", 2),
    ("false_alarms_per_100", "false alarms /100", 2),
    ("mean_recovery", "recovery (rounds)", 2),
    ("never_recovered", "never recovered", 0),
    ("mean_forgetting", "forgetting (points)", 2),
    ("changes", "changes", 0),
)


def run_arrays(
    history: list[dict[str, Any]], clients: int, rounds: int
) -> tuple[np.ndarray | None, np.ndarray]:
    """A run's cluster assignments ``[client, round]`` (-1 where unknown; None when no record
    has ``clusters`` for every client) and its accuracy: per client ``[client, round]`` when
    every record has ``local_acc_clients``, else ``local_acc`` per round (NaN where none)."""
    assign = np.full((clients, rounds), -1, dtype=int)
    per_client = all(len(rec.get("local_acc_clients") or []) == clients for rec in history)
    acc = np.full((clients, rounds) if per_client and history else rounds, np.nan)
    seen = False
    for rec in history:
        r = int(rec["round"])
        if not 1 <= r <= rounds:
            continue
        if acc.ndim == 2:
            acc[:, r - 1] = [np.nan if v is None else v for v in rec["local_acc_clients"]]
        elif rec.get("local_acc") is not None:
            acc[r - 1] = float(rec["local_acc"])
        clusters = rec.get("clusters")
        if clusters is not None and len(clusters) == clients:
            assign[:, r - 1] = clusters
            seen = True
    return (assign if seen else None), acc


def run_drift(
    history: list[dict[str, Any]],
    truth: np.ndarray,
    tolerance: int = 5,
    onsets: np.ndarray | None = None,
) -> dict[str, Any]:
    """:func:`~fedshift.reporting.drift_measures.drift_summary` of one run against ``truth`` (recovery
    from ``onsets`` when given)."""
    assign, acc = run_arrays(history, *truth.shape)
    flags = np.zeros(truth.shape, bool) if assign is None else reactions_from_assignments(assign)
    out = drift_summary(truth, flags, acc, tolerance=tolerance, onsets=onsets)
    if assign is None:  # no assignments: no reactions to score, not "none detected"
        for key in ("detected", "missed", "detection_rate", "mean_delay", "false_alarms_per_100"):
            out[key] = None
    return out


def drift_rows(
    histories: dict[str, list[dict[str, Any]]],
    data: FederatedData,
    rounds: int,
    tolerance: int = 5,
) -> list[dict[str, Any]]:
    """One row per method: its drift measures against the scenario's true concepts."""
    truth, onsets = scenario_truth(data, rounds)
    return [
        {"run": name, **run_drift(h, truth, tolerance, onsets)} for name, h in histories.items()
    ]


def scenario_truth(data: FederatedData, rounds: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The true concept per client and round, and the drift onsets (``scenario.drift``: every
    event's, cut or padded to ``rounds``; None for a timeline, whose onsets are its changes)."""
    return concept_schedule(data, rounds), onset_schedule(data, rounds)


def cell(value: Any, digits: int) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if digits else str(int(value))


def drift_table(rows: list[dict[str, Any]], title: str = "", first: str = "algorithm") -> Table:
    """Each run's drift measures (rows of :func:`run_drift` with its ``run``), one row a run."""
    cells = [[r["run"], *(cell(r.get(k), d) for k, _, d in COLUMNS)] for r in rows]
    return Table([first, *(t for _, t, _ in COLUMNS)], cells, title, (first,))


def drift_markdown(rows: list[dict[str, Any]]) -> str:
    """The drift table as markdown, with what its columns measure."""
    return markdown(
        "Drift measures against the scenario's true concept per client and round "
        "(fedshift.reporting.drift_report): acc AUC = time-weighted mean local accuracy; "
        "detected = share of concept changes followed by a change of the client's cluster "
        "before its next change; delay = rounds from a change to that reaction; false alarms "
        "= other reactions per 100 client-rounds; recovery = rounds until a client's accuracy "
        "is back within 2 points of its level before a drift onset; forgetting = accuracy "
        "lost on a returning concept since its last visit. n/a: the method has no cluster "
        "assignments (or nothing to measure).",
        drift_table(rows),
    )
