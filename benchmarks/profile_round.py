"""Where a round's time goes: client tasks + training + aggregation against evaluation, for
FedRC on Fashion-MNIST (its Table 1 scenario: 3 concepts, FMNIST-C styles, test-only clients
built from the official test set), on whatever device is present.

    python benchmarks/profile_round.py [--clients 60] [--k 4] [--rounds 4] [--device cpu]
        [--profile] [--out runs/bench/profile_round.json] [key=value ...]

Every round is evaluated (as the paper config does); the first round is a warm-up and is not
averaged. ``--profile`` adds cProfile's top functions of one evaluation. Needs Fashion-MNIST
(``FEDSHIFT_DATA`` or ``--data-dir``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

from fedshift.config import load_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import evaluate
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import (
    eval_batch_size,
    make_algorithm,
    make_executor,
    resolve_device,
    sim_config,
)

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "papers" / "fedrc" / "table1_fmnist.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=60, help="training clients (200 images each)")
    ap.add_argument("--k", type=int, default=4, help="FedRC's number of models")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, the first one a warm-up")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--profile", action="store_true", help="cProfile one evaluation")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. eval.batch_size=1024")
    ap.add_argument("--out", default="runs/bench/profile_round.json")
    args = ap.parse_args()

    overrides = (
        [
            f"scenario.num_clients={args.clients}",
            f"scenario.train_fraction_of_dataset={args.clients / 300:g}",
            f"algorithm.params.num_clusters={args.k}",
            f"train.rounds={args.rounds}",
            f"device={args.device}",
            "output.plots=false",
        ]
        + ([f"data_dir={args.data_dir}"] if args.data_dir else [])
        + args.overrides
    )
    cfg = load_config(CONFIG, overrides)
    device = resolve_device(cfg.device)
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir).to(device)
    algo = make_algorithm(cfg, data, device)
    sim = Simulator(algo, data, sim_config(cfg), make_executor(cfg, algo, data))
    state = sim.initial_state()
    rows = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        m = sim.run_round(state)
        rows.append(
            {
                "round": m["round"],
                "train_s": m["train_s"],
                "eval_s": m["eval_s"],
                "wall_s": round(time.perf_counter() - t0, 3),
            }
        )
        print(f"round {m['round']}: train {m['train_s']:.2f} s, evaluation {m['eval_s']:.2f} s")
    timed = rows[1:] or rows
    train = statistics.mean(r["train_s"] for r in timed)
    ev = statistics.mean(r["eval_s"] for r in timed)
    n_test_only = sum(c.num_test + c.num_train for c in data.test_clients)
    summary = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "clients": len(data.clients),
        "train_samples": sum(c.num_train for c in data.clients),
        "test_only_samples": n_test_only,
        "k": args.k,
        "eval_batch": eval_batch_size(cfg),
        "overrides": args.overrides,
        "mean_train_s": round(train, 3),
        "mean_eval_s": round(ev, 3),
        "eval_over_train": round(ev / train, 3),
        "rounds": rows,
    }
    print(
        f"{device}, {len(data.clients)} clients, K={args.k}: mean over rounds 2..{args.rounds}: "
        f"training {train:.2f} s, evaluation {ev:.2f} s (evaluation / training = {ev / train:.2f})"
    )
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        with torch.no_grad():
            evaluate(
                algo,
                state.server,
                state.clients,
                data,
                cfg.eval.train_metrics,
                cfg.eval.batch_size,
                test_states=state.test_clients,
            )
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        print(buf.getvalue())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
