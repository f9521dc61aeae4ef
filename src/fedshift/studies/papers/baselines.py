"""The standard baselines, each beside FedAvg on the scenario where its paper claims an advantage
(``fedshift reproduce baselines``): one base config (configs/papers/baselines/fmnist.yaml) and,
per row, the scenario as config overrides, so every method of a scenario has the same data,
seed, model, local work and evaluation as the FedAvg row of that scenario.

The scenarios, in brackets in each row's label:

- ``[P2 E5]``: pathological label skew (2 classes per client) and 5 local epochs, the setting
  of client drift that SCAFFOLD and FedDyn correct (their claim: closer to the centralised
  optimum than FedAvg); ``Central`` is that optimum's reference, one client holding all the
  training data with the same epochs per round.
- ``[D0.1]``: Dirichlet(0.1) label skew, one local epoch: MOON's and the server optimisers'
  setting (MOON, FedAvgM, FedAdam, FedYogi, FedAdagrad, and FedAdam on FedProx from the config);
  ``[D0.1 E5]`` the same with 5 local epochs, nearer MOON's 10 (with its code's ``mu`` 1 and
  its CIFAR-10 ``mu`` 5).
- ``[E1-5]``: Dirichlet(0.3), each client draws 1 to 5 local epochs per round
  (``train.local_epochs_max``): FedNova's objective inconsistency; ``FedAvg [E3]`` does the
  same mean work with equal epochs.
- ``[P2]``: pathological label skew, one local epoch, scored on local accuracy: the
  personalised methods (APFL, pFedMe, Per-FedAvg, LG-FedAvg, FedALA; Ditto and Local for
  reference).
- ``[2C]``: two contradicting concepts (labels y and 9 − y, half the clients each): StoCFL (at
  FedRC's code's merge threshold 0.15 and the StoCFL code's 0.65) and IFCA against FedAvg.
- ``[drift]``: a drift timeline of 3 steps of 10 rounds (a third concept appears and 30% of
  the clients switch at step 2; another 30% switch and the images turn upside down at step
  3): FedCCFA against FedDrift, Flash and A-FedAvg (FedCCFA's own baselines).

There are no paper numbers: the papers ran other datasets and scales; each row is read
against the FedAvg row of its scenario.
"""

from __future__ import annotations

from fedshift.studies.papers.table import PaperTable, Variant

P2E5 = ("scenario.label_shift={kind: pathological, classes_per_client: 2}", "train.local_epochs=5")
CENTRAL = (
    "scenario.num_clients=1",
    "scenario.label_shift={kind: iid}",
    "train.participation=1.0",
    "train.local_epochs=5",
)
D01: tuple[str, ...] = ()  # the base config's scenario
D01E5 = ("train.local_epochs=5",)  # MOON's setting: many local epochs (10 in the paper)
E15 = (
    "scenario.label_shift={kind: dirichlet, alpha: 0.3}",
    "train.local_epochs=1",
    "train.local_epochs_max=5",
)
E3 = ("scenario.label_shift={kind: dirichlet, alpha: 0.3}", "train.local_epochs=3")
P2 = ("scenario.label_shift={kind: pathological, classes_per_client: 2}",)
CONCEPTS = (
    "scenario.concepts=[identity, reverse]",
    "scenario.mix={types: [{fraction: 0.5, concepts: [0]}, {fraction: 0.5, concepts: [1]}]}",
    "scenario.label_shift={kind: iid}",
)
DRIFT = (
    "scenario.concepts=[identity, reverse, 'shift:1']",
    "scenario.label_shift={kind: dirichlet, alpha: 1.0}",
    "scenario.timeline={rounds_per_step: 10, assignment: switch, steps: [{concepts: [0, 1]}, "
    "{concepts: [0, 1, 2], switch: 0.3}, {concepts: [0, 1, 2], switch: 0.3, "
    "style: 'rotate:180'}]}",
    "train.participation=1.0",
    "train.rounds=30",  # the timeline's 3 x 10, whatever --rounds gives the other rows
)


def _rows(tag: str, overrides: tuple[str, ...], rows: list[tuple]) -> list[Variant]:
    """Rows ``(label, algorithm, params[, extra overrides])`` of one scenario."""
    out = []
    for label, algo, params, *extra in rows:
        more = tuple(extra[0]) if extra else ()
        out.append(Variant(f"{label} [{tag}]", algo, params or {}, overrides + more))
    return out


#: (tag, the scenario's overrides, its rows: (label, algorithm, params[, more overrides]))
SCENARIOS: list[tuple[str, tuple[str, ...], list[tuple]]] = [
    ("P2 E5", P2E5, [
        ("FedAvg", "fedavg", None),
        ("FedProx", "fedprox", None),
        ("SCAFFOLD", "scaffold", None),
        ("SCAFFOLD-I", "scaffold", {"option": "I"}),
        ("FedDyn", "feddyn", None),
        # diagnostics of SCAFFOLD-I's collapse: every client every round (no stale c_i)
        ("FedAvg all-clients", "fedavg", None, ("train.participation=1.0",)),
        ("SCAFFOLD-I all-clients", "scaffold", {"option": "I"}, ("train.participation=1.0",)),
    ]),
    ("P2 E5", CENTRAL, [("Central", "fedavg", None)]),
    ("D0.1", D01, [
        ("FedAvg", "fedavg", None),
        ("MOON", "moon", None),
        ("FedAvgM", "fedavgm", None),
        ("FedAdam", "fedadam", None),
        ("FedYogi", "fedyogi", None),
        ("FedAdagrad", "fedadagrad", None),
        ("FedProx+Adam", "fedprox", None, ("train.server_optimizer={kind: adam, lr: 0.01}",)),
    ]),
    ("D0.1 E5", D01E5, [
        ("FedAvg", "fedavg", None),
        ("MOON", "moon", None),
        ("MOON mu=5", "moon", {"mu": 5.0}),
    ]),
    ("E1-5", E15, [("FedAvg", "fedavg", None), ("FedNova", "fednova", None)]),
    ("E3", E3, [("FedAvg", "fedavg", None)]),
    ("P2", P2, [
        ("FedAvg", "fedavg", None),
        ("SCAFFOLD-I", "scaffold", {"option": "I"}),
        ("Local", "local", None),
        ("Ditto", "ditto", None),
        ("APFL", "apfl", None),
        ("pFedMe", "pfedme", None),
        ("Per-FedAvg FO", "per-fedavg-fo", None),
        ("Per-FedAvg HF", "per-fedavg-hf", None),
        ("LG-FedAvg", "lg-fedavg", None),
        ("FedALA", "fedala", None),
    ]),
    ("2C", CONCEPTS, [
        ("FedAvg", "fedavg", None),
        ("IFCA", "ifca", {"num_clusters": 2}),
        ("StoCFL", "stocfl", None),
        ("StoCFL tau=0.65", "stocfl", {"tau": 0.65}),
    ]),
    ("drift", DRIFT, [
        ("FedAvg", "fedavg", None),
        ("FedCCFA", "fedccfa", None),
        ("FedDrift", "feddrift", None),
        ("Flash", "flash", None),
        ("A-FedAvg", "afedavg", None),
    ]),
]  # fmt: skip


BASELINES = PaperTable(
    key="baselines",
    title="Standard baselines vs FedAvg, each on its paper's scenario (no paper numbers)",
    protocol="last",
    metrics=(("global_acc", "global %"), ("local_acc", "local %")),
    extras=(("ari_concept", "ARI concept"),),
    configs={"fmnist": "configs/papers/baselines/fmnist.yaml"},
    paper={"fmnist": {}},
    variants=tuple(v for tag, overrides, rows in SCENARIOS for v in _rows(tag, overrides, rows)),
    notes=(
        "No paper numbers: read each row against the FedAvg row of the same scenario (the "
        "tag in brackets); rows of one scenario share data, seed, model, local work and "
        "evaluation.",
        "Global %: the global model (or a cluster/personal model where the method has no "
        "global one) on the held-out test clients; local %: each training client's own test "
        "split with the model the method gives it (its personal model where it has one).",
        "[drift] rows are read at the last round, after both drifts.",
    ),
)
