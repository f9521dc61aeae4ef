"""The ground truth of a scenario per round: which concept (and feature style) every client
truly has at every round 1..R, the time step of every round, and where a client's concept
changes.

A drift scenario is step-wise: round ``r`` belongs to the step
:meth:`~fedshift.data.federated.FederatedData.step_of_round` gives (``(r - 1) //
rounds_per_step + 1`` for a timeline, :mod:`~fedshift.data.timeline`; the step in force for
``scenario.drift``, :mod:`~fedshift.data.drift`, whose steps start wherever some client's data
changes), rounds past the last step stay in it, and a client's truth at a round is its record
of that step (``data.steps``). A scenario without time repeats its static
clients over the rounds. The functions here only read the data: its current step and clients
are left as they were. Diagnostics and plots (:func:`fedshift.reporting.plots.plot_timeline`) compare
what an algorithm found against these arrays.
"""

from __future__ import annotations

import numpy as np

from fedshift.data.federated import Client, FederatedData


def _rounds(data: FederatedData, rounds: int | None) -> int:
    """``rounds``, or the timeline's T x rounds_per_step when it is None."""
    if rounds is None:
        if not data.steps:
            raise ValueError("a scenario without a timeline needs the number of rounds")
        rounds = (
            data.num_steps * data.rounds_per_step
            if data.step_starts is None
            else (
                data.drift_onsets.shape[1]
                if data.drift_onsets is not None
                else data.step_starts[-1]
            )
        )
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    return int(rounds)


def round_steps(data: FederatedData, rounds: int | None = None) -> np.ndarray:
    """The (1-based) time step of rounds 1..R, int [R]; all 0 without a timeline."""
    R = _rounds(data, rounds)
    if not data.steps:
        return np.zeros(R, dtype=np.int64)
    return np.array([data.step_of_round(r) for r in range(1, R + 1)], dtype=np.int64)


def _records(data: FederatedData, rounds: int | None) -> list[list[Client]]:
    """The client records in force at every round (a list per round, clients in cid order);
    read from ``data.steps`` without moving the data to another step."""
    if not data.steps:
        return [data.clients] * _rounds(data, rounds)
    return [data.steps[t - 1] for t in round_steps(data, rounds)]


def concept_schedule(data: FederatedData, rounds: int | None = None) -> np.ndarray:
    """The true concept of every client at every round, int [clients, rounds]: column ``r - 1``
    is round ``r``. ``rounds`` defaults to the timeline's T x rounds_per_step; a scenario
    without a timeline needs it and gets its static concepts repeated."""
    per_round = _records(data, rounds)
    return np.array([[c.concept for c in clients] for clients in per_round], dtype=np.int64).T


def style_schedule(data: FederatedData, rounds: int | None = None) -> np.ndarray:
    """The feature style of every client at every round, str [clients, rounds] (the style's
    label without its severity, e.g. ``clean``, ``rotate(180)``, ``fog``)."""
    per_round = _records(data, rounds)
    labels = [[c.style.label().split("/")[0] for c in clients] for clients in per_round]
    return np.array(labels, dtype=object).T


def concept_changes(schedule: np.ndarray) -> np.ndarray:
    """Where a client's concept differs from its concept the round before, bool [clients,
    rounds] (round 1 never counts as a change)."""
    out = np.zeros(schedule.shape, dtype=bool)
    out[:, 1:] = schedule[:, 1:] != schedule[:, :-1]
    return out


def step_boundaries(data: FederatedData, rounds: int | None = None) -> list[int]:
    """The rounds that start a new time step (2nd step onwards) within rounds 1..R."""
    steps = round_steps(data, rounds)
    return [int(i) + 2 for i in np.flatnonzero(steps[1:] != steps[:-1])]  # index i: round i+1


def onset_schedule(data: FederatedData, rounds: int) -> np.ndarray | None:
    """The drift onsets of every client, bool [clients, rounds] (``scenario.drift``: every
    event's onset, also of drifts that change no concept, cut or padded to ``rounds``); None
    for a timeline, whose onsets are its concept changes."""
    if data.drift_onsets is None:
        return None
    out = np.zeros((len(data.clients), rounds), dtype=bool)
    n = min(rounds, data.drift_onsets.shape[1])
    out[:, :n] = data.drift_onsets[:, :n]
    return out


def truth_record(data: FederatedData, rounds: int) -> dict:
    """The truth of a drift scenario as plain data for a run's summary: the concept of every
    client per round and, where the scenario has them, each client's onset rounds."""
    onsets = onset_schedule(data, rounds)
    return {
        "concepts": concept_schedule(data, rounds).tolist(),
        "onsets": None if onsets is None else [(np.flatnonzero(o) + 1).tolist() for o in onsets],
    }


def truth_arrays(record: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """(concept per client and round, onsets or None) back from :func:`truth_record`."""
    truth = np.asarray(record["concepts"], dtype=np.int64)
    if record.get("onsets") is None:
        return truth, None
    onsets = np.zeros(truth.shape, dtype=bool)
    for c, rounds in enumerate(record["onsets"]):
        onsets[c, np.asarray(rounds, dtype=np.int64) - 1] = True
    return truth, onsets


def noise_truth(data: FederatedData) -> np.ndarray:
    """Whether every training client has label noise (``scenario.label_noise``), bool
    [clients] in cid order; all False without label noise. A noisy client's flipped samples
    are its :attr:`~fedshift.data.federated.Client.noise` record."""
    return np.array([c.noisy for c in data.clients], dtype=bool)
