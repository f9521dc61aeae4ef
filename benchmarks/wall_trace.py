"""A device job's progress trace as a markdown table: wall seconds since the job started
against the last evaluated round and the age of the checkpoint of every run.

    python benchmarks/wall_trace.py monitor.log.txt

The trace is what a shell loop printed every 15 s during the job (``t=SECONDS`` lines, then
one line per run: ``<run dir> {"round": N, ... ckpt_age=Ss``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def parse(text: str) -> list[tuple[int, dict[str, tuple[int | None, int | None]]]]:
    """[(t, {run: (round, checkpoint age s)})] in the order of the trace."""
    out: list[tuple[int, dict]] = []
    for line in text.splitlines():
        if line.startswith("t="):
            out.append((int(line[2:]), {}))
        elif out and line.strip():
            run = line.split()[0].strip("/").split("/", 1)[-1]
            rnd = re.search(r'"round": (\d+)', line)
            age = re.search(r"ckpt_age=(\d+)s", line)
            fresh = age and int(age.group(1)) < 10**6  # no checkpoint yet: an epoch's age
            out[-1][1][run] = (
                int(rnd.group(1)) if rnd else None,
                int(age.group(1)) if fresh else None,
            )
    return out


def table(trace) -> str:
    runs = sorted({r for _, rows in trace for r in rows})
    head = "| wall s | " + " | ".join(f"{r}: round, checkpoint age s" for r in runs) + " |"
    lines = [head, "|---" * (len(runs) + 1) + "|"]
    for t, rows in trace:
        cells = []
        for r in runs:
            rnd, age = rows.get(r, (None, None))
            cells.append(f"{'-' if rnd is None else rnd}, {'-' if age is None else age}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(parse(Path(sys.argv[1]).read_text())))
