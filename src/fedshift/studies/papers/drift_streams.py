"""The drift streams benchmark (``fedshift reproduce drift-streams --dataset <stream>``): the
synthetic concept-drift streams of the drift literature (SEA, SINE, Circle; generated,
:mod:`fedshift.data.sources.streams`) x FedAvg and the drift-aware methods, scored by the drift
measures of :mod:`fedshift.reporting.drift_report` against each scenario's truth.

One column per stream, each a standalone config ``configs/drift/streams/<stream>.yaml``: 10
clients on IID shares of 20000 generated points, all on concept 0 at round 1, half of them (a
random half) moved to another concept (another decision rule of the input) at round 11 of 30;
every client every round, evaluated every round. Rows of a column share data, seed, model,
local work and evaluation.

There are no paper numbers: it is our benchmark, at a CPU-feasible scale.
"""

from __future__ import annotations

from fedshift.studies.papers.table import PaperTable, Variant

#: the streams (columns) and their configs
STREAMS: dict[str, str] = {s: f"configs/drift/streams/{s}.yaml" for s in ("sea", "sine", "circle")}

#: the methods of every stream: (label, algorithm, hyper-parameters)
METHODS: list[tuple[str, str, dict]] = [
    ("FedAvg", "fedavg", {}),
    ("FedDAA", "feddaa", {}),
    ("FedDrift", "feddrift", {}),
    ("Flash", "flash", {}),
    ("FedCCFA", "fedccfa", {}),
    ("Oracle", "oracle", {}),
]

DRIFT_STREAMS = PaperTable(
    key="drift-streams",
    title="Drift streams: SEA, SINE and Circle x the drift-aware methods (no paper numbers)",
    protocol="last",
    metrics=(("local_acc", "local % (last round)"),),
    configs=dict(STREAMS),
    paper={s: {} for s in STREAMS},
    variants=tuple(Variant(label, algo, params) for label, algo, params in METHODS),
    drift=True,
    notes=(
        "No paper numbers: read each row against the other rows of its stream, which share "
        "data, seed, model, local work and evaluation.",
        "Local %: every client on its own current test split (labelled by its current "
        "concept's rule), with the model the method gives it; drift.md scores the whole "
        "timeline (accuracy AUC, detection, delay, false alarms, recovery) against the "
        "scenario's true concepts.",
    ),
)
