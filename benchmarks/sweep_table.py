"""The ``sweep.md`` of a ``fedshift sweep`` folder again, from its ``sweep.json`` and its runs'
``config.yaml`` (the report's header), as the sweep wrote it.

    python benchmarks/sweep_table.py SWEEP_FOLDER

``SWEEP_FOLDER`` holds ``sweep.json`` and ``<setting>/seed<s>/config.yaml``; the markdown goes to
standard output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from fedshift.config.grid import Axis, Grid
from fedshift.reporting.protocols import PROTOCOLS
from fedshift.reporting.summary import MeanStd, Table, markdown
from fedshift.studies.sweep import SettingSummary, best_text, rule_text, table


def _number(v: float | None) -> float:
    return float("nan") if v is None else v


def summary(s: dict) -> SettingSummary:
    """A setting's summary as ``sweep.json`` keeps it (null for NaN)."""
    value = MeanStd(_number(s["mean"]), _number(s["std"]), s["seeds"])
    setting = tuple(s["setting"].items())
    return SettingSummary(
        setting, s["slug"], value, s["diverged"], s["rounds"], _number(s["minutes"]), s["runs"]
    )


def title(doc: dict, config: dict, keys: list[str]) -> str:
    """The sweep's header line, from ``sweep.json`` and one run's config."""
    scenario = config["scenario"]
    algo = "" if "algorithm.name" in keys else f", {config['algorithm']['name']}"
    return (
        f"sweep of {doc['name']}: {scenario['dataset']}, {scenario['num_clients']} clients, "
        f"{config['train']['rounds']} rounds{algo}; seeds {', '.join(map(str, doc['seeds']))}; "
        f"{doc['metric']} at the {PROTOCOLS[doc['protocol']]}, mean ±std over seeds"
    )


def report(folder: Path) -> str:
    doc = json.loads((folder / "sweep.json").read_text())
    grid = Grid(tuple(Axis(k, tuple(v)) for k, v in doc["axes"].items()), tuple(doc["seeds"]))
    summaries = [summary(s) for s in doc["settings"]]
    run = summaries[0]
    config = yaml.safe_load(
        (folder / run.slug / f"seed{doc['seeds'][0]}" / "config.yaml").read_text()
    )
    head = title(doc, config, grid.keys)
    best = next(
        (s for s in summaries if dict(s.setting) == (doc["best"] or {}).get("setting")), None
    )
    cols, cells = table(grid, summaries, doc["metric"])
    rows = Table(cols, cells, head, left=tuple(grid.keys))
    rule = rule_text(doc["protocol"], doc["metric"])
    return markdown(
        f"{head}.", f"Best setting: {rule}.", rows, best_text(best, doc["protocol"], doc["metric"])
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the sweep's folder (sweep.json, the runs)")
    sys.stdout.write(report(ap.parse_args().folder))


if __name__ == "__main__":
    main()
