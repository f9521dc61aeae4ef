"""The table of a folder of ``profile_round.py`` JSONs: training and evaluation seconds per round
per run, as ``benchmarks/results/cpu2_fedrc_round_profile/`` publishes them.

    python benchmarks/profile_table.py FOLDER

Each JSON is named ``profile<clients>_<code>[-<run>].json``, ``<code>`` one of ``eb1024`` (the
code before the evaluation changes: inference batch 1024), ``eb256`` (inference batch 256 only)
or ``after``; rows by clients (most first), code (in that order) and run.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

CODES = {"eb1024": "before", "eb256": "inference batch 256 only", "after": "after"}
NAME = re.compile(r"profile(\d+)_(\w+?)(?:-(\d+))?")


def key(path: Path) -> tuple[int, int, int]:
    """Where a JSON's row goes: clients (most first), code, run."""
    clients, code, run = NAME.fullmatch(path.stem).groups()
    return -int(clients), list(CODES).index(code), int(run or 0)


def row(path: Path) -> str:
    """One table line: clients, code (and run), training s, evaluation s and their ratio."""
    _, code, run = NAME.fullmatch(path.stem).groups()
    s = json.loads(path.read_text())
    name = CODES[code] + (f" (run {run})" if run else "")
    return (
        f"| {s['clients']} | {name} | {s['mean_train_s']:.2f} | {s['mean_eval_s']:.2f} | "
        f"{s['eval_over_train']:.2f} |"
    )


def table(folder: Path) -> str:
    paths = sorted(folder.glob("profile*.json"), key=key)
    rounds = {len(json.loads(p.read_text())["rounds"]) for p in paths}
    lines = [
        f"Seconds per round of FedRC, the mean of rounds 2 to {max(rounds)} of each run"
        f" ({', '.join(p.name for p in paths)}).",
        "",
        "| clients | code | training s | evaluation s | evaluation / training |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(lines + [row(p) for p in paths])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the folder of profile_round.py JSONs")
    print(table(ap.parse_args().folder))


if __name__ == "__main__":
    main()
