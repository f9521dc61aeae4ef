"""Ray scaling: samples/s of a FedAvg round on 1 and 2 Ray actors against the batched executor
alone, and the Ray executor's overhead per round, on this machine.

    python benchmarks/ray_scaling.py [--clients 32] [--per-client 256] [--repeats 3]
        [--device cpu|cuda] [--out runs/bench/ray_scaling.json]

- *throughput*: one round of FedAvg on the Fashion-MNIST CNN (random data, batch 32, one local
  epoch), timed after a warm-up round; a sample is counted once per local step it is used in;
- *overhead*: the same round with every client's task set not to train (``train=False``): what is
  left is shipping the tasks (models) to the actors, scheduling, and streaming the results
  (models) back; also the bytes of one round's tasks as Ray serialises them.

On a CPU the batched executor alone uses all threads; each actor gets ``cores / actors`` of them
(``cpus_per_actor``). With a GPU, actors share it (``gpus_per_actor`` = 1 / actors).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time
from dataclasses import replace
from pathlib import Path

import torch

from fedshift.algorithms.base import ModelOps, RoundContext, TrainDefaults
from fedshift.algorithms.fedavg import FedAvg
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import RoundWork
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.executors.ray_executor import RayExecutor, RayExecutorSettings, portable
from fedshift.engine.ray_session import RaySettings, ray_session
from fedshift.models import build_model
from fedshift.tools.bench import random_data

SHAPE = (1, 28, 28)


def timed(executor, algo, jobs, work: RoundWork, repeats: int) -> float:
    """Mean seconds of a round (all results received) after one warm-up round."""
    list(executor.train(algo, jobs, work))
    t0 = time.perf_counter()
    for r in range(repeats):
        list(executor.train(algo, jobs, replace(work, round=2 + r)))
    return (time.perf_counter() - t0) / repeats


def table(summary: dict) -> str:
    """The markdown table of a results JSON: throughput against the batched executor alone and
    the time a round costs without training (serialising tasks, scheduling, results)."""
    base = summary["rows"][0]
    lines = [
        f"One FedAvg round, {summary['clients']} clients x {summary['per_client']} samples, batch "
        f"{summary['batch_size']}, {summary['device']} with {summary['cores']} cores; a round's "
        f"tasks serialise to {summary['task_bytes_per_round'] / 2**20:.2f} MiB.",
        "",
        "| executor | samples/s | vs batched alone | round s | round without training s | "
        "overhead above batched s |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        name = "batched alone" if not r["actors"] else f"Ray, {r['actors']} actor(s)"
        lines.append(
            f"| {name} | {r['sps']:,.0f} | {r['sps'] / base['sps']:.2f} | {r['round_s']:.2f} | "
            f"{r['idle_round_s']:.2f} | {r['idle_round_s'] - base['idle_round_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--per-client", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="runs/bench/ray_scaling.json")
    ap.add_argument("--from-json", type=Path, help="measure nothing: the markdown table of a JSON")
    args = ap.parse_args()
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return

    device = torch.device(args.device)
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    data = random_data(args.clients, args.per_client, SHAPE, device)
    ops = ModelOps(lambda: build_model("fmnist_cnn", 10, SHAPE), device)
    algo = FedAvg(FedAvg.Params(), ops, 10, seed=0, train=TrainDefaults())
    server = algo.init_server_state([algo.ops.init(0)])
    views = [client_data(data, c) for c in data.clients]
    jobs = [(algo.client_task(server, {}, v, RoundContext(1)), v) for v in views]
    idle = [(replace(t, train=False), v) for t, v in jobs]
    one = RoundWork.of(
        lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=args.batch_size, drop_last=True
    )
    work = args.clients * (args.per_client // args.batch_size) * args.batch_size
    rows = []

    t = timed(BatchedExecutor(chunk_size=64), algo, jobs, one, args.repeats)
    t_idle = timed(BatchedExecutor(chunk_size=64), algo, idle, one, args.repeats)
    rows.append(
        {"executor": "batched", "actors": 0, "round_s": t, "sps": work / t, "idle_round_s": t_idle}
    )
    print(f"batched alone ({cores} threads): {work / t:,.0f} samples/s, round {t:.3f} s")

    payload = len(pickle.dumps(portable(jobs)))
    with ray_session(RaySettings(num_cpus=cores, num_gpus=1 if device.type == "cuda" else 0)):
        for n in (1, 2):
            gpu = 1.0 / n if device.type == "cuda" else 0.0
            settings = RayExecutorSettings(
                actors=n, cpus_per_actor=max(1, cores // n), gpus_per_actor=gpu
            )
            with RayExecutor(algo, data, settings) as ex:
                t = timed(ex, algo, jobs, one, args.repeats)
                t_idle = timed(ex, algo, idle, one, args.repeats)
            rows.append(
                {
                    "executor": "ray",
                    "actors": n,
                    "round_s": t,
                    "sps": work / t,
                    "idle_round_s": t_idle,
                }
            )
            print(
                f"ray, {n} actor(s) x {max(1, cores // n)} threads: {work / t:,.0f} samples/s "
                f"({work / t / rows[0]['sps']:.2f} x batched), round {t:.3f} s; overhead of a "
                f"round without training {t_idle:.3f} s (batched alone: {rows[0]['idle_round_s']:.3f} s)"
            )
    summary = {
        "device": str(device),
        "cores": cores,
        "clients": args.clients,
        "per_client": args.per_client,
        "batch_size": args.batch_size,
        "samples_per_round": work,
        "task_bytes_per_round": payload,
        "rows": rows,
    }
    print(f"one round's tasks as Ray serialises them: {payload / 2**20:.2f} MiB")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
