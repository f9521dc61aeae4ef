"""What the branches of finished DFL runs (and FedAvg's extractor) carry, as a markdown table.

    python benchmarks/dfl_probes.py RUN_DIR [RUN_DIR ...] [--per-client 300] [--initial] [--json F]
    python benchmarks/dfl_probes.py --from-json F      # the table again, from the figures

For every run: linear-probe accuracy (held-out half, %) of the colour domain (the client id,
20 colours: chance 5%) and of the digit (chance about 10%) from each branch's features on the
clients' test images, a fresh critic's Î(E_s; E_c) + log 4 (0: independent, up to 1.386)
beside the run's own critics' last logged estimates (``mi_s``, ``mi_c``), and the final
models' accuracy on the clients' train and test splits (the generalisation gap), and what a
colour swap does (each client's test images repainted in the colour half-way round the hue
circle): the relative change of each branch's features and the run's accuracy on the
repainted images.
``--initial`` adds, per run, the same probes on its untrained initial network (the control:
what the architecture carries before any training). Nothing is trained in the runs
themselves; the probes only read their checkpoints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedshift.reporting.tables import run_names
from fedshift.tools.probes import (
    branch_features,
    colour_swap,
    fresh_critic_mi,
    linear_probe,
    train_and_test_accuracy,
)


def probe_run(run_dir: Path, per_client: int, initial: bool = False) -> dict:
    f = branch_features(run_dir, per_client, initial=initial)
    rows = {}
    for branch in [k for k in ("inv", "spec", "body") if k in f]:
        rows[branch] = {
            "colour": linear_probe(f[branch], f["client"]),
            "digit": linear_probe(f[branch], f["y"]),
        }
    swap = colour_swap(run_dir, per_client, initial=initial)
    for branch in rows:
        rows[branch]["swap_change"] = swap[f"change_{branch}"]
    out = {"branches": rows, "acc_swapped": swap.get("acc_swapped")}
    if "spec" in f:
        out["fresh_mi_s"] = fresh_critic_mi(f["spec"], f["inv"])
    if initial:
        return {**out, "round": 0}
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out.update(train_and_test_accuracy(run_dir))
    out["run_mi_s"] = last[-1].get("mi_s") if last else None
    out["run_mi_c"] = last[-1].get("mi_c") if last else None
    out["round"] = last[-1].get("round") if last else None
    return out


def _f(v, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


HEADER = (
    "| run | round | train acc % | test acc % | gap | acc, colours swapped % | branch | "
    "colour probe % | digit probe % | feature change, colours swapped % | "
    "fresh critic Î_s+log4 | run's mi_s / mi_c |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table(every: dict) -> str:
    """The markdown table of probed runs (name -> ``probe_run``'s figures)."""
    lines = [HEADER]
    for name, r in every.items():
        fresh = _f(r.get("fresh_mi_s"), ".3f")
        own = "-" if r.get("run_mi_s") is None else f"{r['run_mi_s']:.3f} / {r['run_mi_c']:.3f}"
        gap = None if r.get("train_acc") is None else r["train_acc"] - r["local_acc"]
        for branch, v in r["branches"].items():
            lines.append(
                f"| {name} | {r['round']} | {_f(r.get('train_acc'))} | "
                f"{_f(r.get('local_acc'))} | {_f(gap)} | {_f(r.get('acc_swapped'))} | "
                f"{branch} | {v['colour']:.1f} | {v['digit']:.1f} | "
                f"{v['swap_change']:.1f} | {fresh} | {own} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--per-client", type=int, default=300)
    ap.add_argument("--initial", action="store_true", help="also probe each initial network")
    ap.add_argument("--json", type=Path, help="also write every figure to this file")
    ap.add_argument(
        "--from-json", type=Path, help="print the table of a --json file, probe nothing"
    )
    args = ap.parse_args()
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return
    every = {}
    names = run_names(args.runs)
    for run in args.runs:
        for initial in (False, True) if args.initial else (False,):
            name = f"{names[run]} (initial network)" if initial else names[run]
            every[name] = probe_run(run, args.per_client, initial)
    print(table(every))
    if args.json:
        args.json.write_text(json.dumps(every, indent=2) + "\n")


if __name__ == "__main__":
    main()
