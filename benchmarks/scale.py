"""Memory and time against the number of clients: FedRC's Table 1 Fashion-MNIST config
(``configs/papers/fedrc/table1_fmnist.yaml``: 60,000 training images split over the clients,
the FEMNIST CNN, K = 3, kept momentum, evaluation every round) at several populations, a few
rounds each, per executor, with the run's default settings (memory.budget auto).

Each run is a ``fedshift run`` in its own process: its peak RSS comes from ``wait4``, its
seconds per round (training, evaluation) from ``metrics.jsonl``, its checkpoints (seconds,
client state written) and memory plan from ``summary.json``, the bytes of its store folder
from the disk.

    python benchmarks/scale.py run OUT [--clients 30,100,300,1000] [--executors
        sequential,batched] [--rounds 3] [OVERRIDE ...]
    python benchmarks/scale.py table OUT        # results.json -> markdown (stdout)
    python benchmarks/scale.py plot OUT         # results.json -> OUT/scale.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import overrides_args  # benchmarks/, beside this script

CONFIG = "configs/papers/fedrc/table1_fmnist.yaml"


def folder_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 1)


def run_one(out: Path, clients: int, executor: str, rounds: int, overrides: list[str]) -> dict:
    name = f"n{clients}-{executor}"
    cmd = [
        sys.executable, "-m", "fedshift.cli", "run", CONFIG, f"scenario.num_clients={clients}",
        f"train.rounds={rounds}", f"executor={executor}", f"name={name}",
        f"output.dir={out / 'runs'}", "output.plots=false", "--overwrite", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "FEDSHIFT_SUPERVISE": "0"}  # the training process is the child
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(logs / f"{name}.out", "w") as fo, open(logs / f"{name}.err", "w") as fe:
        proc = subprocess.Popen(cmd, env=env, stdout=fo, stderr=fe)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out_text, err = (logs / f"{name}.out").read_text(), (logs / f"{name}.err").read_text()
    run = out / "runs" / name
    if status != 0:
        raise SystemExit(f"{name} failed ({status}): {err[-3000:]}")
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    store_mb = folder_mb(run / "store") if (run / "store").exists() else 0.0
    shutil.rmtree(run / "store", ignore_errors=True)  # gigabytes on disk: measured, not kept
    (run / "checkpoint.pt").unlink(missing_ok=True)
    plan_line = next((x for x in out_text.splitlines() if "memory: peak" in x), "")
    return {
        "clients": clients,
        "executor": executor,
        "rounds": rounds,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "train_s": [r["train_s"] for r in rows],
        "eval_s": [r["eval_s"] for r in rows],
        "checkpoints": summary.get("checkpoints", []),
        "client_store": summary.get("client_store"),
        "memory_plan": summary.get("memory"),
        "store_folder_mb": store_mb,
        "global_acc_last": rows[-1].get("global_acc"),
        "plan_line": plan_line,
    }


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    blob = json.loads(path.read_text()) if path.exists() else {"runs": []}
    blob.update(config=CONFIG, overrides=args.overrides)
    done = {(r["clients"], r["executor"]) for r in blob["runs"]}
    for n in (int(c) for c in args.clients.split(",")):
        for ex in args.executors.split(","):
            if (n, ex) in done:
                continue
            row = run_one(out, n, ex, args.rounds, args.overrides)
            print(json.dumps({k: v for k, v in row.items() if k != "memory_plan"}), flush=True)
            blob["runs"].append(row)
            path.write_text(json.dumps(blob, indent=1))  # each run kept as it finishes


def table(args) -> None:
    blob = json.loads((Path(args.out) / "results.json").read_text())
    print(
        f"`{blob['config']}` at each population, {blob['runs'][0]['rounds']} rounds, "
        + (
            f"overrides `{' '.join(blob['overrides'])}`"
            if blob.get("overrides")
            else "default settings"
        )
        + "; peak RSS of the training process (wait4); seconds per round: mean of the "
        "rounds' own training and evaluation (metrics.jsonl), checkpoint: mean over the run's "
        "checkpoints (summary.json); store: client state the run kept in memory by its plan "
        "and what its store folder holds on disk at the end.\n"
    )
    print(
        "| clients | executor | peak RSS MB | budget MB | plan's estimate MB | in memory MB "
        "| on disk MB | train s/round | eval s/round | checkpoint s | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(blob["runs"], key=lambda r: (r["executor"], r["clients"])):
        plan = r["memory_plan"] or {}
        ck = [c["s"] for c in r["checkpoints"]]
        print(
            f"| {r['clients']:,} | {r['executor']} | {r['peak_rss_mb']:,.0f} "
            f"| {plan.get('budget_mb', 0):,.0f} | {plan.get('estimate_mb', 0):,.0f} "
            f"| {r['client_store']['peak_resident_mb']:,.0f} | {r['store_folder_mb']:,.0f} "
            f"| {sum(r['train_s']) / len(r['train_s']):.1f} "
            f"| {sum(r['eval_s']) / len(r['eval_s']):.1f} "
            f"| {sum(ck) / max(1, len(ck)):.1f} | {r['wall_s']:.0f} |"
        )
    print()
    for ex in ("sequential", "batched"):
        rows = sorted((r for r in blob["runs"] if r["executor"] == ex), key=lambda r: r["clients"])
        if len(rows) < 2:
            continue
        lo, hi = rows[0], rows[-1]
        n = hi["clients"] - lo["clients"]

        def slope(f, lo=lo, hi=hi, n=n) -> float:
            return (f(hi) - f(lo)) / n

        print(
            f"- {ex}, per client added from {lo['clients']:,} to {hi['clients']:,} clients: peak "
            f"RSS {slope(lambda r: r['peak_rss_mb']):+.1f} MB, the plan's estimate "
            f"{slope(lambda r: r['memory_plan']['estimate_mb']):+.1f} MB, client state in "
            f"memory {slope(lambda r: r['client_store']['peak_resident_mb']):+.1f} MB"
        )
    print()
    plan = blob["runs"][0]["memory_plan"]["per_client_mb"]
    print(
        "Per client, declared by the algorithm's hooks (memory plan): "
        + ", ".join(f"{k} {v} MB" for k, v in plan.items())
    )


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blob = json.loads((Path(args.out) / "results.json").read_text())
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for ex, mark in (("sequential", "o-"), ("batched", "s--")):
        rows = sorted((r for r in blob["runs"] if r["executor"] == ex), key=lambda r: r["clients"])
        if not rows:
            continue
        n = [r["clients"] for r in rows]
        a.plot(n, [r["peak_rss_mb"] / 1024 for r in rows], mark, label=f"{ex}: peak RSS")
        b.plot(n, [sum(r["train_s"]) / len(r["train_s"]) for r in rows], mark,
               label=f"{ex}: training")  # fmt: skip
        b.plot(n, [sum(r["eval_s"]) / len(r["eval_s"]) for r in rows], mark, alpha=0.5,
               label=f"{ex}: evaluation")  # fmt: skip
    budgets = sorted({(r["clients"], r["memory_plan"]["budget_mb"]) for r in blob["runs"]})
    a.plot([c for c, _ in budgets], [m / 1024 for _, m in budgets], ":", color="grey",
           label="memory budget (auto)")  # fmt: skip
    states = sorted({(r["clients"], r["clients"] * r["memory_plan"]["per_client_mb"]["momentum"])
                     for r in blob["runs"]})  # fmt: skip
    a.plot([c for c, _ in states], [m / 1024 for _, m in states], "-.", color="tab:red",
           alpha=0.5, label="all clients' kept momentum")  # fmt: skip
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("clients")
        ax.legend(fontsize=8)
    a.set_ylabel("GiB")
    a.set_ylim(0, max(8, max(r["peak_rss_mb"] for r in blob["runs"]) / 1024 * 1.2))
    a.set_title("memory: flat once the budget is reached")
    b.set_ylabel("seconds per round")
    b.set_title("time per round")
    fig.suptitle("FedRC, Table 1 Fashion-MNIST config (60,000 images, K = 3, kept momentum)")
    fig.tight_layout()
    fig.savefig(Path(args.out) / "scale.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--clients", default="30,100,300,1000")
    r.add_argument("--executors", default="sequential,batched")
    r.add_argument("--rounds", type=int, default=3)
    for name in ("table", "plot"):
        sub.add_parser(name).add_argument("out")
    args = overrides_args.parse(ap)  # overrides may also come after the options
    {"run": run, "table": table, "plot": plot}[args.cmd](args)


if __name__ == "__main__":
    main()
