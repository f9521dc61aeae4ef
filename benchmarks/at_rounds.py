"""Chosen metrics of runs at chosen rounds, from their ``metrics.jsonl``.

    python benchmarks/at_rounds.py RUN_DIR [RUN_DIR ...] --rounds 30,60 --keys global_acc,ari_concept

Prints a markdown table: one row per run, one column per round, each cell the values of the
keys at that round joined by " / " ("-" where the run did not evaluate that round or lacks the
key). Works on runs that stopped early (no ``summary.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedshift.reporting.tables import run_names


def by_round(run: Path) -> dict[int, dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {int(r["round"]): r for r in map(json.loads, filter(None, lines))}


def cell(entry: dict | None, keys: list[str]) -> str:
    def one(key: str) -> str:
        v = None if entry is None else entry.get(key)
        return "-" if not isinstance(v, float | int) else f"{v:.2f}"

    return " / ".join(one(k) for k in keys)


def table(runs: list[Path], rounds: list[int], keys: list[str]) -> str:
    names = run_names(runs)
    lines = [
        f"| run ({' / '.join(keys)}) | " + " | ".join(f"r{r}" for r in rounds) + " |",
        "|---" * (len(rounds) + 1) + "|",
    ]
    for run in runs:
        seen = by_round(run)
        lines.append(
            f"| {names[run]} | " + " | ".join(cell(seen.get(r), keys) for r in rounds) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--rounds", required=True, help="comma-separated rounds, e.g. 30,60")
    ap.add_argument("--keys", default="global_acc", help="comma-separated metric names")
    a = ap.parse_args()
    missing = [str(r) for r in a.runs if not (r / "metrics.jsonl").is_file()]
    if missing:
        raise SystemExit(f"error: no metrics.jsonl in {', '.join(missing)}")
    print(table(a.runs, [int(x) for x in a.rounds.split(",")], a.keys.split(",")))


if __name__ == "__main__":
    main()
