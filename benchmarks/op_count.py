"""How many tensor operations a round costs as the number of clients grows (torch.profiler).

    python benchmarks/op_count.py OUT.json [--clients 100,300] [--algorithms fedavg,fedrc]
    python benchmarks/op_count.py --table OUT.json      # markdown

The demo config (``configs/quickstart.yaml``) with ``vectorize=vmap`` and one chunk holding
every client (``chunk_size=1000``), evaluated every round, run twice per setting: for one round
and for two. The round's count is the difference of the two runs' ``aten::`` events (the
operators the profiler records, nested ones included), so set-up and the first round's one-off
work cancel out. An engine that works per chunk has a count that grows with the chunks, not
with the clients; ``top`` lists the operators that grow most.

It counts operators, not time: a count that grows with the clients means per-client Python
work, whose cost shows most on a GPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

from fedshift.config import load_config
from fedshift.run.experiment import run_experiment


def count(clients: int, algorithm: str, rounds: int, out: Path) -> collections.Counter:
    from torch.profiler import ProfilerActivity, profile

    cfg = load_config(
        "configs/quickstart.yaml",
        [
            f"scenario.num_clients={clients}",
            f"train.rounds={rounds}",
            f"algorithm.name={algorithm}",
            "vectorize=vmap",
            "chunk_size=1000",
            "eval.every=1",
            f"name=ops-{algorithm}-{clients}-{rounds}",
            f"output.dir={out}",
            "output.plots=false",
        ],
    )
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_experiment(cfg, overwrite=True)
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def measure(clients: list[int], algorithms: list[str]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in algorithms:
            for n in clients:
                one, two = count(n, algorithm, 1, Path(tmp)), count(n, algorithm, 2, Path(tmp))
                diff = {k: two[k] - one[k] for k in two}
                top = sorted(diff.items(), key=lambda kv: -kv[1])[:5]
                rows.append(
                    {"algorithm": algorithm, "clients": n, "ops": sum(diff.values()), "top": top}
                )
    return rows


def table(path: Path) -> str:
    rows = json.loads(path.read_text())
    lines = [
        "| algorithm | clients | aten ops in round 2 | per client | most frequent |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        top = ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in r["top"][:3])
        lines.append(
            f"| {r['algorithm']} | {r['clients']} | {r['ops']} | "
            f"{r['ops'] / r['clients']:.1f} | {top} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--clients", default="100,300")
    p.add_argument("--algorithms", default="fedavg")
    p.add_argument("--table", action="store_true", help="print OUT.json as markdown")
    a = p.parse_args()
    if not a.table:
        rows = measure([int(x) for x in a.clients.split(",")], a.algorithms.split(","))
        a.out.write_text(json.dumps(rows, indent=1))
    print(table(a.out))


if __name__ == "__main__":
    main()
