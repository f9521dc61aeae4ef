"""FedRC's Table 13 question on a small scenario: do clustered methods take noisy clients for a
concept of their own?

    python benchmarks/label_noise_table.py run runs/label-noise [--seeds 0 1 2] [--rounds 40]
        [--settings pair symmetric control]
    python benchmarks/collect_runs.py runs/label-noise benchmarks/results/cpu2_label_noise
    python benchmarks/label_noise_table.py render benchmarks/results/cpu2_label_noise > table.md

``run`` trains FedRC, IFCA, FeSEM and FedEM with K = 4 models (one more than there are
concepts, so a spare cluster is free for the noisy clients) on the built-in ``digits`` dataset:
18 clients with IID labels, three concepts (y, C-1-y, (y+1) mod C; six clients each) and half
of the clients noisy (``scenario.label_noise``: pair flips y -> (y+1) mod C, and symmetric
flips to a uniformly random other class, each at rate 0.2; a control marks the same clients
noisy at rate 0, so nothing flips), an MLP of width 64, 5 local epochs, SGD lr 0.05 with
momentum 0.9, every client every round, evaluated every 5 rounds.
Every run is a normal run folder (``<out>/<setting>/seed<seed>/<method>/``).

``render`` reads each run's ``config.yaml`` and ``metrics.jsonl`` (the last evaluation's cluster
of every client), rebuilds the scenario from the config for its truth (concept and noisy/clean
per client) and prints a markdown table, mean ± std over seeds, per setting and method:

- ARI of the clusters against the concepts (``ari_concept``) and against noisy/clean
  (``ari_noise``): high against concepts and near 0 against noise is the wished-for outcome;
- *noisy split off*: the share of noisy clients whose cluster holds no clean client of their
  own concept (the noisy clients were taken for a concept of their own);
- global accuracy (test-only clients, clean labels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

METHODS = (("FedRC", "fedrc"), ("IFCA", "ifca"), ("FeSEM", "fesem"), ("FedEM", "fedem"))
RATE = 0.2
#: (folder, label_noise.kind, rate): the control marks the same clients noisy but flips nothing,
#: so its ARI vs noisy and split-off share are what chance and the scenario give without noise
SETTINGS = (("pair", "pair", RATE), ("symmetric", "symmetric", RATE), ("control", "pair", 0.0))
NOISY_SHARE = 0.5
#: one model more than there are concepts: a spare cluster noisy clients could be put in
NUM_CLUSTERS = 4


def run_config(setting: str, algorithm: str, seed: int, rounds: int, out: Path) -> dict[str, Any]:
    """The raw config of one run (``setting``: a folder name of :data:`SETTINGS`)."""
    kind, rate = next((k, r) for name, k, r in SETTINGS if name == setting)
    return {
        "name": algorithm,
        "seed": seed,
        "device": "cpu",
        "scenario": {
            "dataset": "digits",
            "num_clients": 18,
            "label_shift": {"kind": "iid"},
            "concepts": ["identity", "reverse", "shift:1"],
            "mix": {"types": [{"fraction": 1.0, "concepts": [0, 1, 2]}]},
            "label_noise": {"kind": kind, "rate": rate, "clients": NOISY_SHARE},
            "test_fraction": 0.1,
            "test_clients": {"enabled": True, "adapt_fraction": 0.5},
        },
        "model": {"name": "mlp", "width": 64},
        "algorithm": {"name": algorithm, "params": {"num_clusters": NUM_CLUSTERS}},
        "train": {
            "rounds": rounds,
            "local_epochs": 5,
            "batch_size": 32,
            "lr": 0.05,
            "momentum": 0.9,
        },
        "eval": {"every": 5},
        "output": {"dir": str(out / setting / f"seed{seed}"), "plots": False},
    }


def run(out: Path, seeds: list[int], rounds: int, settings: list[str]) -> None:
    """Train every (setting, seed, method) into ``out``."""
    from fedshift.config import validate_config
    from fedshift.run.experiment import run_experiment

    for setting in settings:
        for seed in seeds:
            for label, algorithm in METHODS:
                cfg = validate_config(run_config(setting, algorithm, seed, rounds, out))
                res = run_experiment(cfg, overwrite=True)
                last = res.history[-1]
                print(
                    f"{setting} seed {seed} {label}: ari_concept={last.get('ari_concept'):.3f} "
                    f"ari_noise={last.get('ari_noise'):.3f} global={last['global_acc']:.2f}",
                    flush=True,
                )


def split_off_share(clusters: list[int], concept: list[int], noisy: list[bool]) -> float:
    """The share of noisy clients whose cluster holds no clean client of their concept."""
    clean_in = {(a, k) for a, k, n in zip(clusters, concept, noisy, strict=True) if not n}
    hits = [(a, k) not in clean_in for a, k, n in zip(clusters, concept, noisy, strict=True) if n]
    return sum(hits) / len(hits) if hits else float("nan")


def measure(run_dir: Path) -> dict[str, float]:
    """The clustering measures of one finished run (its last evaluation) against its truth."""
    from fedshift.config import validate_config
    from fedshift.data.scenario import build_scenario

    cfg = validate_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
    data = build_scenario(cfg.scenario, cfg.seed)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = [e for e in map(json.loads, lines) if "clusters" in e][-1]
    concept = [c.concept for c in data.clients]
    noisy = [c.noisy for c in data.clients]
    return {
        "ari_concept": last["ari_concept"],
        "ari_noise": last["ari_noise"],
        "split_off": 100.0 * split_off_share(last["clusters"], concept, noisy),
        "global_acc": last["global_acc"],
    }


def cell(values: list[float], digits: int) -> str:
    """Mean ± population std over seeds (the mean alone for one seed)."""
    text = f"{statistics.fmean(values):.{digits}f}"
    text = text.lstrip("-") if float(text) == 0 else text  # no "-0.00"
    if len(values) < 2:
        return text
    return f"{text} ±{statistics.pstdev(values):.{digits}f}"


def render(folder: Path) -> str:
    """The markdown table of every run under ``folder``."""
    rows = []
    seeds_seen: set[str] = set()
    for setting, _, rate in SETTINGS:
        for label, algorithm in METHODS:
            runs = sorted((folder / setting).glob(f"seed*/{algorithm}"))
            if not runs:
                continue
            seeds_seen |= {r.parent.name for r in runs}
            got = [measure(r) for r in runs]
            rows.append(
                [setting, f"{rate:g}", label]
                + [cell([g["ari_concept"] for g in got], 2), cell([g["ari_noise"] for g in got], 2)]
                + [cell([g["split_off"] for g in got], 1), cell([g["global_acc"] for g in got], 2)]
            )
    cols = [
        "noise",
        "rate",
        "method",
        "ARI vs concept",
        "ARI vs noisy",
        "noisy split off %",
        "global acc %",
    ]
    head = (
        f"Label noise on half of 18 digits clients (3 concepts), K = {NUM_CLUSTERS} models, "
        f"the last evaluation; mean ± std over {len(seeds_seen)} seed(s). The control marks "
        "the same clients noisy at rate 0 (nothing flips). Noisy split off: the share of noisy "
        "clients whose cluster holds no clean client of their concept."
    )
    table = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    return head + "\n\n" + "\n".join(table) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The command line; its exit code (2: no such folder). It returns, never exits, because
    ``fedshift results check`` runs ``render`` in its own process."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="train every method into a runs folder")
    p_run.add_argument("out", type=Path)
    p_run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p_run.add_argument("--rounds", type=int, default=40)
    names = [name for name, _, _ in SETTINGS]
    p_run.add_argument("--settings", nargs="+", choices=names, default=names)
    p_render = sub.add_parser("render", help="print the markdown table of a folder's runs")
    p_render.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.seeds, args.rounds, args.settings)
    else:
        if not args.folder.is_dir():
            print(f"{args.folder}: no such folder", file=sys.stderr)
            return 2
        sys.stdout.write(render(args.folder))
    return 0


if __name__ == "__main__":
    if main():  # an error; success returns, so that an in-process caller goes on
        raise SystemExit(2)
