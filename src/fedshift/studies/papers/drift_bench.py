"""The drift benchmark (``fedshift reproduce drift-bench``): every drift kind of
``scenario.drift`` x the drift-aware methods, on one base (configs/drift/bench.yaml: 10
Fashion-MNIST clients, 30 rounds, every client every round, evaluated every round), scored by
the drift measures of :mod:`fedshift.reporting.drift_report` against each scenario's truth.

Each kind drifts half of the clients (a random half) from round 11 unless it says otherwise;
the files ``configs/drift/<kind>.yaml`` hold the same scenarios as standalone configs (a test
keeps them equal). Rows of one kind share data, seed, model, local work and evaluation.

There are no paper numbers: it is our benchmark, at a CPU-feasible scale.
"""

from __future__ import annotations

import json

from fedshift.studies.papers.table import PaperTable, Variant

#: kind -> its scenario.drift section (the base's rounds)
KINDS: dict[str, dict] = {
    "sudden": {"events": [{"kind": "sudden", "at": 11, "to": 1, "clients": 0.5}]},
    "gradual": {"events": [{"kind": "gradual", "at": 11, "over": 8, "to": 1, "clients": 0.5}]},
    "incremental": {
        "events": [
            {
                "kind": "incremental",
                "at": 11,
                "over": 10,
                "style": "rotate:120",
                "levels": 5,
                "clients": 0.5,
            }
        ]
    },  # fmt: skip
    "recurrent": {
        "events": [{"kind": "recurrent", "at": 9, "concepts": [1, 0], "period": 6, "clients": 0.5}]
    },
    "staggered": {"events": [{"kind": "sudden", "at": [6, 25], "to": 1, "clients": 0.5}]},
    "label_swap": {
        "events": [
            {"kind": "label_swap", "at": 11, "pairs": [[0, 1], [2, 3], [4, 5]], "clients": 0.5}
        ]
    },  # fmt: skip
    "label": {"events": [{"kind": "label", "at": 11, "clients": 0.5}]},
    "participation": {
        "start": [0, 1],
        "events": [{"kind": "participation", "at": 11, "concept": 1, "rate": 0.2}],
    },
}

#: the methods of every kind: (label, algorithm, hyper-parameters)
METHODS: list[tuple[str, str, dict]] = [
    ("FedAvg", "fedavg", {}),
    ("FedDAA", "feddaa", {}),
    ("FedDrift", "feddrift", {}),
    ("Flash", "flash", {}),
    ("A-FedAvg", "afedavg", {}),
    ("FedCCFA", "fedccfa", {}),
    ("Oracle", "oracle", {}),
]

#: kinds with FedDAA and FedDrift rows that check every 5 rounds instead of at every change
CHECK_EVERY = ("gradual", "staggered", "label_swap")


def drift_override(kind: str, rounds: int = 30) -> str:
    """The config override that sets a kind's scenario.drift section."""
    return "scenario.drift=" + json.dumps({"rounds": rounds, "start": [0], **KINDS[kind]})


def _variants() -> tuple[Variant, ...]:
    out = []
    for kind in KINDS:
        ov = (drift_override(kind),)
        rows = list(METHODS)
        if kind in CHECK_EVERY:
            rows.insert(2, ("FedDAA check5", "feddaa", {"check_every": 5}))
            rows.insert(4, ("FedDrift check5", "feddrift", {"check_every": 5}))
        out += [Variant(f"{label} [{kind}]", algo, params, ov) for label, algo, params in rows]
    return tuple(out)


DRIFT_BENCH = PaperTable(
    key="drift-bench",
    title="Drift benchmark: each drift kind x the drift-aware methods (no paper numbers)",
    protocol="last",
    metrics=(("local_acc", "local % (last round)"),),
    configs={"fmnist": "configs/drift/bench.yaml"},
    paper={"fmnist": {}},
    variants=_variants(),
    drift=True,
    notes=(
        "No paper numbers: read each row against the rows of the same kind (in brackets), "
        "which share data, seed, model, local work and evaluation.",
        "Local %: every client on its own current test split, with the model the method "
        "gives it; drift.md scores the whole timeline (accuracy AUC, detection, delay, false "
        "alarms, recovery, forgetting) against the scenario's true concepts.",
    ),
)
