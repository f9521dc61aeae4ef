"""The DFL critics' own estimates per round, read from finished runs' ``metrics.jsonl``.

    python benchmarks/dfl_mi_rounds.py RUN_DIR [RUN_DIR ...] [--rounds 2,10,20,50,100]

Prints a markdown table: for every run, ``mi_s`` = Î(E_s; E_c) + log 4 and ``mi_c`` =
Î(E_c; E_c^G) + log 4 (the mean over that round's clients of their critics' estimates after
local training; 0: independent, at most log 4 = 1.386) and the local accuracy, at the given
rounds (the nearest evaluated round at or before each).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedshift.reporting.tables import run_names


def at_rounds(run: Path, rounds: list[int]) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out = []
    for r in rounds:
        before = [h for h in rows if h["round"] <= r]
        out.append(before[-1] if before else {})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--rounds", default="2,10,20,50,100")
    args = ap.parse_args()
    rounds = [int(r) for r in args.rounds.split(",")]
    names = run_names(args.runs)
    print("| run | value | " + " | ".join(f"round {r}" for r in rounds) + " |")
    print("|---|---|" + "---|" * len(rounds))
    for run in args.runs:
        hist = at_rounds(run, rounds)
        for key, title in (("mi_s", "Î_s+log4"), ("mi_c", "Î_c+log4"), ("local_acc", "acc %")):
            cells = [
                "-" if key not in h else f"{h[key]:.3f}" if key != "local_acc" else f"{h[key]:.2f}"
                for h in hist
            ]
            print(f"| {names[run]} | {title} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
