"""A tuning grid trained as one job against its runs one after another.

The demo config (``configs/quickstart.yaml``, with a validation split) under
``compare --tune lr=0.02,0.05,0.1 --seeds 2`` for each of FedAvg, IFCA and FedRC: six runs per
method, trained one after another (``lockstep=False``) and as one job (the default,
:mod:`fedshift.engine.executors.lockstep`). Each (method, mode) runs in its own process, so
its peak RSS is its own; the record holds the wall time, the peak RSS, the runs' summed model
sample-steps and every run's metrics, so ``--table`` can say whether each run's numbers are
the same both ways. The limit: plain PyTorch training the demo's MLP at batch 1024 on random
inputs in the same process, the grid's sample-steps at that speed.

    python benchmarks/grid_one_job.py OUT.json [--rounds 60] [--methods fedavg,ifca,fedrc]
    python benchmarks/grid_one_job.py OUT.json --table
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

TIMING = {"train_s", "eval_s", "elapsed_s"}
GRID = {"train.lr": [0.02, 0.05, 0.1]}


def one(method: str, lockstep: bool, rounds: int, folder: str) -> dict:
    """One method's grid in one mode (in this process)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    from fedshift.cli.console import load
    from fedshift.core.errors import DivergedError
    from fedshift.run.folder import RunDir
    from fedshift.studies.tune import tune_compare

    over = [
        f"train.rounds={rounds}",
        "scenario.validation_fraction=0.1",
        f"output.dir={folder}/{method}/{'one_job' if lockstep else 'one_by_one'}",
        "output.plots=false",
    ]
    base = load("configs/quickstart.yaml", over, None)
    t0 = time.perf_counter()
    with contextlib.suppress(DivergedError):  # a diverged run stops there in both modes
        tune_compare(base, [method], GRID, seeds=2, fresh=True, lockstep=lockstep)
    wall = time.perf_counter() - t0
    runs = sorted(Path(base.output.dir).glob(f"{base.name}-tune/*/*/{method}/summary.json"))
    metrics, steps, diverged = {}, 0, []
    for s in runs:
        d = RunDir(s.parent)
        summary = json.loads(s.read_text())
        steps += summary.get("model_sample_steps", 0)
        if summary.get("status") == "diverged":
            diverged.append(f"{s.parent.parent.parent.name}/{s.parent.parent.name}")
        rows = [{k: v for k, v in m.items() if k not in TIMING} for m in d.read_metrics()]
        metrics[str(s.parent.relative_to(base.output.dir))] = rows
    # the limit: plain PyTorch, the demo's MLP (784-128-10) at batch 1024, random inputs
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x, y = torch.randn(20, 1024, 784), torch.randint(0, 10, (20, 1024))

    def epoch() -> None:
        for s in range(20):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x[s]), y[s]).backward()
            opt.step()

    epoch()
    t1 = time.perf_counter()
    for _ in range(3):
        epoch()
    sps = 3 * 20 * 1024 / (time.perf_counter() - t1)
    return {
        "method": method,
        "lockstep": lockstep,
        "runs": len(runs),
        "rounds": rounds,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sample_steps": steps,
        "plain_sps": round(sps, 1),
        "limit_s": round(steps / sps, 2),
        "metrics": metrics,
        "diverged": diverged,
    }


def table(records: list[dict]) -> str:
    out = [
        "| method | runs | one after another s | as one job s | speed-up | plain PyTorch s (limit) "
        "| one job / limit | peak RSS MB (after / one job) | runs with the same metrics "
        "| diverged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["method"], r["lockstep"]): r for r in records}
    for method in dict.fromkeys(r["method"] for r in records):
        a, b = by.get((method, False)), by.get((method, True))
        if a is None or b is None:
            continue
        ka = {k.split("/", 1)[1]: v for k, v in a["metrics"].items()}
        kb = {k.split("/", 1)[1]: v for k, v in b["metrics"].items()}
        same = sum(ka[k] == kb.get(k) for k in ka)
        out.append(
            f"| {method} | {b['runs']} | {a['wall_s']:.1f} | {b['wall_s']:.1f} | "
            f"{a['wall_s'] / b['wall_s']:.2f}x | {b['limit_s']:.1f} | "
            f"{b['limit_s'] / b['wall_s']:.2f} | {a['peak_rss_mb']:.0f} / {b['peak_rss_mb']:.0f} | "
            f"{same} of {len(ka)} | {', '.join(b.get('diverged', [])) or 'none'} |"
        )
    ta = sum(by[(m, False)]["wall_s"] for m, lk in by if not lk and (m, True) in by)
    tb = sum(by[(m, True)]["wall_s"] for m, lk in by if lk and (m, False) in by)
    out.append(f"| all | | {ta:.1f} | {tb:.1f} | {ta / tb:.2f}x | | | | | |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--methods", default="fedavg,ifca,fedrc")
    ap.add_argument("--folder", default="runs/grid_one_job")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "LOCKSTEP"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    if args.one:
        rec = one(args.one[0], args.one[1] == "1", args.rounds, args.folder)
        print(json.dumps(rec))
        return
    records = json.loads(args.out.read_text()) if args.out.exists() else []
    for method in args.methods.split(","):
        for lockstep in (False, True):
            cmd = [sys.executable, __file__, str(args.out), "--rounds", str(args.rounds),
                   "--folder", args.folder, "--one", method, "1" if lockstep else "0"]  # fmt: skip
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rec = json.loads(line.strip().splitlines()[-1])
            records = [r for r in records if (r["method"], r["lockstep"]) != (method, lockstep)]
            records.append(rec)
            args.out.write_text(json.dumps(records))
            print(method, "one job" if lockstep else "one by one", rec["wall_s"], "s", flush=True)
    print(table(records))


if __name__ == "__main__":
    main()
