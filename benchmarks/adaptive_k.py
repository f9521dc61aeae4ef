"""Adaptive K over rounds (FedRC's Alg. 3, its Fig. 7 / 15 / 16): which clusters are live,
when each is removed, each live cluster's share of the γ mass, and the ARI of the clients'
clusters against the true concepts, from the runs' ``metrics.jsonl``.

    python benchmarks/adaptive_k.py RUN_DIR [RUN_DIR ...]

Prints markdown: per run, the removals (the first evaluated round at which a cluster id is no
longer live: it was removed in that round or in one of the unevaluated rounds before it) and a
table of the evaluated rounds. The γ shares are Σ_ij γ_ij;k / Σ_ijk γ_ij;k over the latest γ of
every client that took part (``cluster_share``, logged by FedEM and FedRC at each evaluation).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def evaluations(run: Path) -> list[dict]:
    """The run's evaluated rounds in order (one per line of ``metrics.jsonl`` with a round)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines if x.strip()]
    return sorted((r for r in rows if "round" in r), key=lambda r: r["round"])


def removals(rows: list[dict], start: list[int]) -> list[tuple[int, int]]:
    """(cluster id, first evaluated round it is missing from) for every id of ``start`` that
    went, in the order they went."""
    out, live = [], list(start)
    for r in rows:
        now = r.get("cluster_ids")
        if now is None:
            continue
        for k in [k for k in live if k not in now]:
            out.append((k, int(r["round"])))
        live = [k for k in live if k in now]
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| round | K | live clusters (share of γ) | ARI concept | global % | local % |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ids, share = r.get("cluster_ids") or [], r.get("cluster_share") or []
        live = ", ".join(
            f"{k} ({s:.2f})" if i < len(share) else str(k)
            for i, (k, s) in enumerate(zip(ids, share + [0.0] * len(ids), strict=False))
        )
        lines.append(
            f"| {r['round']} | {r.get('num_models', '-')} | {live} | "
            f"{r.get('ari_concept', float('nan')):.2f} | {r.get('global_acc', float('nan')):.2f} "
            f"| {r.get('local_acc', float('nan')):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    missing = [
        str(r)
        for r in args.runs
        if not (r / "metrics.jsonl").is_file() or not (r / "config.yaml").is_file()
    ]
    if missing:
        print(f"error: no metrics.jsonl and config.yaml in {', '.join(missing)}", file=sys.stderr)
        return 2
    summary = [
        "| run | removals | K at the end | ARI concept at the end | global % at the end "
        "| local % at the end |",
        "|---|---|---|---|---|---|",
    ]
    parts = []
    for run in args.runs:
        rows = evaluations(run)
        if not any(r.get("cluster_ids") is not None for r in rows):
            parts.append(f"## {run.name}\n\nno cluster_ids logged (not a FedEM / FedRC run)\n")
            continue
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        k0 = int(cfg["algorithm"]["params"]["num_clusters"])  # ids: first positions 0..K0-1
        gone = removals(rows, list(range(k0)))
        said = ", ".join(f"cluster {k} by round {r}" for k, r in gone) or "none"
        last = rows[-1]
        summary.append(
            f"| {run.name} | {said} | {last.get('num_models')} | "
            f"{last.get('ari_concept', float('nan')):.2f} | "
            f"{last.get('global_acc', float('nan')):.2f} | {last.get('local_acc', float('nan')):.2f} |"
        )
        text = [
            f"## {run.name}\n",
            f"Started with {k0} clusters; removed: {said}; live at the end: "
            f"{last['cluster_ids']} (round {last['round']}).\n",
            table(rows) + "\n",
        ]
        if (run / "summary.json").is_file():
            info = json.loads((run / "summary.json").read_text())
            text.append(
                f"Wall time {info.get('elapsed_s')} s, peak RSS "
                f"{info.get('peak_host_rss_mb')} MB (`summary.json`).\n"
            )
        parts.append("\n".join(text))
    print("\n".join(summary) + "\n")
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    # exit only on an error: `fedshift results check` runs this file in its own process
    if code := main():
        raise SystemExit(code)
