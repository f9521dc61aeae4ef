"""A paper table's published values, as a markdown table (from fedshift.studies.papers, where each
table's numbers are transcribed from the paper).

    python benchmarks/paper_values.py fedrc-table1 fmnist
"""

from __future__ import annotations

import sys

from fedshift.studies.papers import TABLES


def table(key: str, column: str) -> str:
    spec = TABLES[key]
    titles = [title for _, title in spec.metrics]
    lines = [
        f"{spec.title}, column {column}: the paper's values as printed.",
        "",
        "| row | " + " | ".join(titles) + " |",
        "|---" * (len(titles) + 1) + "|",
    ]
    for label, values in spec.paper[column].items():
        lines.append(f"| {label} | " + " | ".join(v or "n/a" for v in values) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1], sys.argv[2]))
