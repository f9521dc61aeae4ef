"""fedshift's executors against each other and against the physical limit, on whole runs.

For each algorithm and executor, one whole ``fedshift run`` of a config in its own process
(wall time, peak RSS from ``wait4``, and the run's own training and evaluation seconds from its
``summary.json``); then, in this process on the same cores, plain PyTorch training of the same
model over the same number of model-sample-steps (every sample of every local step, counted
once per model it trains: FedRC's K = 3 models train on each sample, IFCA's one) at the run's
batch and at batch 1024, with SGD of the run's momentum and weight decay on inputs already in
memory: the fastest a training loop of that arithmetic can go on these cores.

    python benchmarks/executors_vs_limit.py run OUT CONFIG [--algorithms fedavg,ifca,fedrc]
        [--executors sequential,batched] [--repeats 1] [OVERRIDE ...]
    python benchmarks/executors_vs_limit.py table OUT      # results.json -> markdown

The ratios: ``batched / sequential`` is sequential's training seconds over batched's (above 1:
batched is faster); ``train / limit`` is the plain-PyTorch seconds at batch 1024 over the run's
training seconds (1.0 would be the limit). Runs of different repeats alternate their executors,
so a machine that slows down does not favour one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def run_one(out: Path, config: str, algo: str, executor: str, rep: int, overrides: list[str]):
    name = f"{algo}-{executor}-r{rep}"
    cmd = [
        sys.executable, "-m", "fedshift.cli", "run", config, *overrides,
        "algorithm.params={}", f"algorithm.name={algo}", f"executor={executor}", f"name={name}",
        f"output.dir={out / 'runs'}", "output.plots=false", "--overwrite",
    ]  # fmt: skip
    env = {**os.environ, "FEDSHIFT_SUPERVISE": "0"}
    t0 = time.perf_counter()
    errfile = out / f"{name}.err"
    with open(errfile, "w") as fe:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=fe)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = errfile.read_text()
    errfile.unlink()
    if status != 0:
        raise SystemExit(f"{name} failed ({status}): {err[-2000:]}")
    summary = json.loads((out / "runs" / name / "summary.json").read_text())
    return {
        "algorithm": algo,
        "executor": executor,
        "repeat": rep,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "train_s": summary["train_s_total"],
        "eval_s": summary["eval_s_total"],
        "model_sample_steps": summary["model_sample_steps"],
        "memory_plan": summary.get("memory"),
    }


def run_settings(config: str, algo: str, overrides: list[str]):
    """The run's config, data, batch and SGD settings (the scenario is built, not trained)."""
    from fedshift.config import load_config
    from fedshift.data.scenario import build_scenario

    cfg = load_config(config, [*overrides, "algorithm.params={}", f"algorithm.name={algo}"])
    t = cfg.resolved_train()
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    sgd = {"lr": t.lr, "momentum": t.momentum, "weight_decay": t.weight_decay}
    return cfg, data, t.batch_size, sgd


def plain_seconds(cfg, data, samples: int, batch: int, sgd: dict) -> float:
    """Plain PyTorch: the run's model, ``samples`` samples in batches of ``batch``."""
    from fedshift.models import build_model
    from fedshift.runner import model_name

    m = cfg.model
    net = build_model(model_name(cfg), data.num_classes, data.input_shape, width=m.width)
    opt = torch.optim.SGD(net.parameters(), **sgd)
    x = torch.randn(batch, *data.input_shape)
    y = torch.randint(0, data.num_classes, (batch,))
    steps = max(1, samples // batch)
    net.train()
    for _ in range(3):  # warm-up
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) * samples / (steps * batch)


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    algos = args.algorithms.split(",")
    executors = args.executors.split(",")
    rows = []
    for rep in range(args.repeats):
        order = executors if rep % 2 == 0 else executors[::-1]
        for algo in algos:
            for ex in order:
                row = run_one(out, args.config, algo, ex, rep, args.overrides)
                print(json.dumps(row), flush=True)
                rows.append(row)
    limits = {}
    for algo in algos:
        samples = next(r["model_sample_steps"] for r in rows if r["algorithm"] == algo)
        cfg, data, batch, sgd = run_settings(args.config, algo, args.overrides)
        limits[algo] = {
            "model_sample_steps": samples,
            "batch": batch,
            "plain_run_batch_s": round(plain_seconds(cfg, data, samples, batch, sgd), 2),
            "plain_1024_s": round(plain_seconds(cfg, data, samples, 1024, sgd), 2),
        }
        print(algo, json.dumps(limits[algo]), flush=True)
    blob = {
        "config": args.config,
        "overrides": args.overrides,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "runs": rows,
        "limits": limits,
    }
    (out / "results.json").write_text(json.dumps(blob, indent=1))


def table(args) -> None:
    blob = json.loads((Path(args.out) / "results.json").read_text())
    runs, limits = blob["runs"], blob["limits"]
    by: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        by.setdefault((r["algorithm"], r["executor"]), []).append(r)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    n = max(len(v) for v in by.values())
    print(
        f"Whole runs of `{blob['config']}` {' '.join(blob['overrides'])} on {blob['threads']} "
        f"threads (torch {blob['torch']}); medians of {n} run(s) per cell; seconds of the run's "
        "own training and evaluation (summary.json), wall time of the process, peak RSS from "
        "wait4. limit: plain PyTorch over the same model-sample-steps at batch 1024.\n"
    )
    print(
        "| algorithm | executor | train s | eval s | wall s | peak RSS MB | model-sample-steps "
        "| plain at run's batch s | plain at 1024 s | limit / train |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    algos = list(dict.fromkeys(r["algorithm"] for r in runs))
    for algo in algos:
        lim = limits[algo]
        for ex in ("sequential", "batched"):
            rows = by.get((algo, ex))
            if not rows:
                continue
            tr = med(rows, "train_s")
            print(
                f"| {algo} | {ex} | {tr:.2f} | {med(rows, 'eval_s'):.2f} | {med(rows, 'wall_s'):.1f} "
                f"| {med(rows, 'peak_rss_mb'):,.0f} | {lim['model_sample_steps']:,} "
                f"| {lim['plain_run_batch_s']:.2f} | {lim['plain_1024_s']:.2f} "
                f"| {lim['plain_1024_s'] / tr:.2f} |"
            )
    print(
        "\n| algorithm | batched / sequential (training s) | batched / sequential (wall s) | "
        "per-repeat training ratios |"
    )
    print("|---|---|---|---|")
    for algo in algos:
        s, b = by.get((algo, "sequential")), by.get((algo, "batched"))
        if not (s and b):
            continue
        per = [x["train_s"] / y["train_s"] for x, y in zip(s, b, strict=False)]
        print(
            f"| {algo} | {med(s, 'train_s') / med(b, 'train_s'):.2f} | "
            f"{med(s, 'wall_s') / med(b, 'wall_s'):.2f} | {', '.join(f'{p:.2f}' for p in per)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("config")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--algorithms", default="fedavg,ifca,fedrc")
    r.add_argument("--executors", default="sequential,batched")
    r.add_argument("--repeats", type=int, default=1)
    t = sub.add_parser("table")
    t.add_argument("out")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else table(args)


if __name__ == "__main__":
    main()
