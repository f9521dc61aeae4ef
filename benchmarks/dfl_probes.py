"""What the branches of finished DFL runs (and FedAvg's extractor) carry, as a markdown table.

    python benchmarks/dfl_probes.py RUN_DIR [RUN_DIR ...] [--per-client 300]

For every run: linear-probe accuracy (held-out half, %) of the colour domain (the client id,
20 colours: chance 5%) and of the digit (chance about 10%) from each branch's features on the
clients' test images, and a fresh critic's Î(E_s; E_c) + log 4 (0: independent, up to 1.386)
beside the run's own critics' last logged estimates (``mi_s``, ``mi_c``). Nothing is trained
in the runs themselves; the probes only read their checkpoints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedshift.probes import branch_features, fresh_critic_mi, linear_probe


def probe_run(run_dir: Path, per_client: int) -> dict:
    f = branch_features(run_dir, per_client)
    rows = {}
    for branch in [k for k in ("inv", "spec", "body") if k in f]:
        rows[branch] = {
            "colour": linear_probe(f[branch], f["client"]),
            "digit": linear_probe(f[branch], f["y"]),
        }
    out = {"branches": rows}
    if "spec" in f:
        out["fresh_mi_s"] = fresh_critic_mi(f["spec"], f["inv"])
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out["run_mi_s"] = last[-1].get("mi_s") if last else None
    out["run_mi_c"] = last[-1].get("mi_c") if last else None
    out["local_acc"] = last[-1].get("local_acc") if last else None
    out["round"] = last[-1].get("round") if last else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--per-client", type=int, default=300)
    args = ap.parse_args()
    print(
        "| run | round | local acc % | branch | colour probe % | digit probe % | "
        "fresh critic Î_s+log4 | run's mi_s / mi_c |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        r = probe_run(run, args.per_client)
        fresh = "-" if "fresh_mi_s" not in r else f"{r['fresh_mi_s']:.3f}"
        own = "-" if r["run_mi_s"] is None else f"{r['run_mi_s']:.3f} / {r['run_mi_c']:.3f}"
        for branch, v in r["branches"].items():
            print(
                f"| {run.name} | {r['round']} | {r['local_acc']:.2f} | {branch} | "
                f"{v['colour']:.1f} | {v['digit']:.1f} | {fresh} | {own} |"
            )


if __name__ == "__main__":
    main()
