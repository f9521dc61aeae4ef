"""How each compared method copes with drift, scored against the scenario's truth.

For a scenario with a timeline, :func:`drift_rows` turns each run's ``metrics.jsonl`` records
into the measures of :mod:`fedshift.drift_metrics`:

- the truth is the true concept of every client at every round
  (:func:`fedshift.data.truth.concept_schedule`);
- a method's *reaction* at a round is a change of a client's cluster assignment (the
  ``clusters`` of an evaluation); a method without assignments (FedAvg, a personalised
  method) gives no reactions, so its detection measures are ``None``, not zero;
- the accuracy is ``local_acc`` (every client on its own current test split, the data that
  drifted), one curve over rounds, with NaN where no evaluation was made. Recovery is therefore
  measured once per distinct change round on that overall curve, not per client (the records
  hold no per-client accuracy), which understates a dip when few clients change.

Evaluate every round (``eval.every: 1``) for delays and recovery times in rounds; with a
sparser evaluation they are bounded by the evaluation interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedshift.data.federated import FederatedData
from fedshift.data.truth import concept_schedule
from fedshift.drift_metrics import drift_summary, reactions_from_assignments

#: the columns of the drift table: key, title, digits
COLUMNS = (
    ("accuracy_auc", "acc AUC %", 2),
    ("detection_rate", "detected", 2),
    ("mean_delay", "delay (rounds)", 2),
    ("false_alarms_per_100", "false alarms /100", 2),
    ("mean_recovery", "recovery (rounds)", 2),
    ("never_recovered", "never recovered", 0),
    ("changes", "changes", 0),
)


def run_arrays(
    history: list[dict[str, Any]], clients: int, rounds: int
) -> tuple[np.ndarray | None, np.ndarray]:
    """A run's cluster assignments ``[client, round]`` (-1 where unknown; None when no record
    has ``clusters`` for every client) and its ``local_acc`` per round (NaN where none)."""
    assign = np.full((clients, rounds), -1, dtype=int)
    acc = np.full(rounds, np.nan)
    seen = False
    for rec in history:
        r = int(rec["round"])
        if not 1 <= r <= rounds:
            continue
        if rec.get("local_acc") is not None:
            acc[r - 1] = float(rec["local_acc"])
        clusters = rec.get("clusters")
        if clusters is not None and len(clusters) == clients:
            assign[:, r - 1] = clusters
            seen = True
    return (assign if seen else None), acc


def run_drift(
    history: list[dict[str, Any]], truth: np.ndarray, tolerance: int = 5
) -> dict[str, Any]:
    """:func:`~fedshift.drift_metrics.drift_summary` of one run against ``truth``."""
    assign, acc = run_arrays(history, *truth.shape)
    flags = np.zeros(truth.shape, bool) if assign is None else reactions_from_assignments(assign)
    out = drift_summary(truth, flags, acc, tolerance=tolerance)
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
    truth = concept_schedule(data, rounds)
    return [{"run": name, **run_drift(h, truth, tolerance)} for name, h in histories.items()]


def cell(value: Any, digits: int) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if digits else str(int(value))


def drift_markdown(rows: list[dict[str, Any]]) -> str:
    """The drift table as markdown, with what its columns measure."""
    head = ["algorithm", *(t for _, t, _ in COLUMNS)]
    lines = [
        "Drift measures against the scenario's true concept per client and round "
        "(fedshift.studies.drift_report): acc AUC = time-weighted mean local accuracy; "
        "detected = share of concept changes followed by a change of the client's cluster "
        "before its next change; delay = rounds from a change to that reaction; false alarms "
        "= other reactions per 100 client-rounds; recovery = rounds until local accuracy is "
        "back within 2 points of its level before the change. n/a: the method has no cluster "
        "assignments (or nothing to measure).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [row["run"], *(cell(row.get(k), d) for k, _, d in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
