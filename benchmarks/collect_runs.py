"""Copy the small artifacts of finished runs into a results folder, to commit beside a table.

    python benchmarks/collect_runs.py runs/feddaa-reduced benchmarks/results/<name> [--partial]

For every run directory under the source (one holding ``summary.json``; with ``--partial``
also a stopped one holding only ``metrics.jsonl``), the same relative path under the
destination gets ``config.yaml``, ``metrics.jsonl`` and ``summary.json`` when there is one (no
checkpoint, no plots). Absolute paths of this machine are cut to their last part (the data
folder's name, the output folder's), so nothing machine-specific is committed. ``fedshift reproduce ...
output.dir=<destination> --report-only`` then regenerates the table from these files, and
``fedshift results pack <destination>`` packs them into the folder's ``artifacts.tar.xz``
(docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import yaml

_PATH = re.compile(r"(?:\.\./|/)[^\s;(),]+")


def scrub(summary: dict) -> dict:
    """The summary without this machine's absolute paths (each path in the data source, e.g.
    the three of a digit-domains source, is cut to ``<data folder>/`` and its last two parts)."""
    src = summary.get("data_source")
    if isinstance(src, str) and "<data folder>" not in src:  # not one collected before
        summary["data_source"] = _PATH.sub(
            lambda m: "<data folder>/" + "/".join(Path(m.group(0)).parts[-2:]), src
        )
    return summary


def scrub_config(text: str) -> str:
    """The config text with an absolute ``output.dir`` cut to ``runs/<its last part>``."""
    raw = yaml.safe_load(text)
    out = raw.get("output") or {}
    if isinstance(out.get("dir"), str) and out["dir"].startswith("/"):
        out["dir"] = f"runs/{Path(out['dir']).name}"
        return yaml.safe_dump(raw, sort_keys=False)
    return text


def collect(source: Path, dest: Path, partial: bool = False) -> list[Path]:
    marker = "metrics.jsonl" if partial else "summary.json"
    runs = sorted(p.parent for p in source.rglob(marker))
    for run in runs:
        out = dest / run.relative_to(source)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(scrub_config((run / "config.yaml").read_text()))
        shutil.copyfile(run / "metrics.jsonl", out / "metrics.jsonl")
        if not (run / "summary.json").is_file():
            continue
        summary = scrub(json.loads((run / "summary.json").read_text()))
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="a folder of run directories (an output.dir)")
    ap.add_argument("dest", type=Path, help="the results folder")
    ap.add_argument("--partial", action="store_true", help="also runs stopped before the end")
    args = ap.parse_args()
    runs = collect(args.source, args.dest, args.partial)
    print(f"{len(runs)} runs copied to {args.dest}")


if __name__ == "__main__":
    main()
