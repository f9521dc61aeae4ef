"""Train and test accuracy at the end of every time step of drift runs, from ``metrics.jsonl``.

    python benchmarks/step_ends.py RUN_DIR [RUN_DIR ...]

Prints a markdown table: per run, the local test accuracy (``local_acc``, the clients' current
step's test splits) and the training accuracy (``train_acc``) at each step's last evaluated
round, the largest |train - test| gap over the steps, and the mean local accuracy over every
evaluation (not only the step ends). Works on runs that stopped early (no ``summary.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedshift.reporting.tables import run_names


def step_ends(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    last: dict[int, dict] = {}
    for r in rows:
        last[r.get("step", 1)] = r
    return [last[s] for s in sorted(last)]


def _list(values: list[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:.1f}" for v in values)


def table(runs: list[Path]) -> str:
    names = run_names(runs)
    lines = [
        "| run | steps | test acc % at step ends | train acc % at step ends | "
        "largest train-test gap | mean test acc % over every evaluation |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        ends = step_ends(run)
        every = [
            json.loads(x)["local_acc"]
            for x in (run / "metrics.jsonl").read_text().splitlines()
            if x
        ]
        test = [e.get("local_acc") for e in ends]
        train = [e.get("train_acc") for e in ends]
        gaps = [
            abs(a - b) for a, b in zip(train, test, strict=True) if a is not None and b is not None
        ]
        gap = f"{max(gaps):.1f}" if gaps else "-"
        lines.append(
            f"| {names[run]} | {len(ends)} | {_list(test)} | {_list(train)} | {gap} | "
            f"{sum(every) / len(every):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    print(table(ap.parse_args().runs))


if __name__ == "__main__":
    main()
