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
batched is faster); ``limit / train`` is the faster plain-PyTorch time (the run's batch or
1024) over the run's training seconds (1.0 would be the limit); ``stacked / train`` is the
same for plain PyTorch training the round's models at once (``stacked_seconds``). Runs of
different repeats alternate their executors, so a machine that slows down does not favour one.
``limits OUT`` measures the limits again for an existing ``results.json``.
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

import overrides_args  # benchmarks/, beside this script
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
    from fedshift.algorithms.registry import resolved_train
    from fedshift.config import load_config
    from fedshift.data.scenario import build_scenario

    cfg = load_config(config, [*overrides, "algorithm.params={}", f"algorithm.name={algo}"])
    t = resolved_train(cfg)
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    sgd = {"lr": t.lr, "momentum": t.momentum, "weight_decay": t.weight_decay}
    return cfg, data, t.batch_size, sgd


def plain_seconds(cfg, data, samples: int, batch: int, sgd: dict) -> float:
    """Plain PyTorch: the run's model, ``samples`` samples in batches of ``batch``."""
    from fedshift.models import build_model
    from fedshift.run.experiment import model_name

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


def stacked_seconds(cfg, data, samples: int, batch: int, n: int, sgd: dict) -> float | None:
    """Plain PyTorch's own recipe for training ``n`` independent models at once
    (``torch.func.stack_module_state`` + ``vmap(grad(functional_call))``, SGD by ``_foreach``
    ops), each at the run's batch: the limit for per-client weights, which a single shared model
    at batch 1024 does not have (every step reads and writes ``n`` models' weights, and each
    weight gradient sums over ``batch`` samples only). None for convolutional models, which the
    batched executor trains in a loop on CPU, and for models with buffers."""
    from torch.func import functional_call, grad, stack_module_state, vmap

    from fedshift.engine.executors.batched import has_conv
    from fedshift.models import build_model
    from fedshift.run.experiment import model_name

    nets = [
        build_model(model_name(cfg), data.num_classes, data.input_shape, width=cfg.model.width)
        for _ in range(n)
    ]
    if has_conv(nets[0]) or any(True for _ in nets[0].buffers()):
        return None
    params, _ = stack_module_state(nets)
    base = nets[0]

    def loss(p, x, y):
        return torch.nn.functional.cross_entropy(functional_call(base, p, (x,)), y)

    step_grads = vmap(grad(loss))
    keys = list(params)
    ps = [params[k].detach() for k in keys]
    bufs = [torch.zeros_like(p) for p in ps]
    x = torch.randn(n, batch, *data.input_shape)
    y = torch.randint(0, data.num_classes, (n, batch))
    lr, mom, wd = sgd["lr"], sgd["momentum"], sgd["weight_decay"]

    def step():
        g = step_grads(dict(zip(keys, ps, strict=True)), x, y)
        gs = [g[k] for k in keys]
        if wd:
            torch._foreach_add_(gs, ps, alpha=wd)
        torch._foreach_mul_(bufs, mom)
        torch._foreach_add_(bufs, gs)
        torch._foreach_add_(ps, bufs, alpha=-lr)

    steps = max(1, samples // (n * batch))
    for _ in range(3):  # warm-up
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) * samples / (steps * n * batch)


def measure_limits(config: str, overrides: list[str], rows: list[dict]) -> dict:
    """Per algorithm: plain PyTorch at the run's batch and at 1024, and stacked (above) over
    as many models as the run trains at once (clients of a round x models per sample)."""
    limits = {}
    algos = list(dict.fromkeys(r["algorithm"] for r in rows))
    samples = {a: next(r["model_sample_steps"] for r in rows if r["algorithm"] == a) for a in algos}
    least = min(samples.values())
    for algo in algos:
        cfg, data, batch, sgd = run_settings(config, algo, overrides)
        per_round = max(1, round(cfg.scenario.num_clients * cfg.train.participation))
        n = per_round * max(1, round(samples[algo] / least))
        stacked = stacked_seconds(cfg, data, samples[algo], batch, n, sgd)
        limits[algo] = {
            "model_sample_steps": samples[algo],
            "batch": batch,
            "plain_run_batch_s": round(plain_seconds(cfg, data, samples[algo], batch, sgd), 2),
            "plain_1024_s": round(plain_seconds(cfg, data, samples[algo], 1024, sgd), 2),
            "stacked_models": n,
            "stacked_s": None if stacked is None else round(stacked, 2),
        }
        print(algo, json.dumps(limits[algo]), flush=True)
    return limits


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
    limits = measure_limits(args.config, args.overrides, rows)
    blob = {
        "config": args.config,
        "overrides": args.overrides,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "runs": rows,
        "limits": limits,
    }
    (out / "results.json").write_text(json.dumps(blob, indent=1))


def limits(args) -> None:
    """Measure the limits again for the runs of an existing results.json (same cores)."""
    path = Path(args.out) / "results.json"
    blob = json.loads(path.read_text())
    blob["limits"] = measure_limits(blob["config"], blob["overrides"], blob["runs"])
    blob["threads"], blob["torch"] = torch.get_num_threads(), torch.__version__
    path.write_text(json.dumps(blob, indent=1))


def _stacked(lim: dict) -> str:
    s = lim.get("stacked_s")
    return "-" if s is None else f"{s:.2f} ({lim['stacked_models']})"


def _limit(lim: dict) -> float:
    return min(lim["plain_run_batch_s"], lim["plain_1024_s"])


def _ratio(num: float | None, den: float) -> str:
    return "-" if num is None else f"{num / den:.2f}"


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
        "wait4. limit: plain PyTorch over the same model-sample-steps, the faster of the run's "
        "batch and batch 1024 (a CNN on CPU is slower at 1024). stacked: "
        "plain PyTorch training as many independent models at once as the run trains in a "
        "round (torch.func, the run's batch each), the limit for per-client weights; - where "
        "the batched executor does not vmap the model (convolutions on CPU).\n"
    )
    print(
        "| algorithm | executor | train s | eval s | wall s | peak RSS MB | model-sample-steps "
        "| plain at run's batch s | plain at 1024 s | limit / train | stacked s (models) "
        "| stacked / train |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
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
                f"| {_limit(lim) / tr:.2f} | {_stacked(lim)} "
                f"| {_ratio(lim.get('stacked_s'), tr)} |"
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
    for name in ("table", "limits"):
        sub.add_parser(name).add_argument("out")
    args = overrides_args.parse(ap)  # overrides may also come after the options
    {"run": run, "table": table, "limits": limits}[args.cmd](args)


if __name__ == "__main__":
    main()
