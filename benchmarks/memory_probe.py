"""What a run holds, round by round: resident memory, the bytes of every tensor alive, and the
tensors that only Python's cyclic garbage collector would free (held by a reference cycle).

    python benchmarks/memory_probe.py OUT.json CONFIG [OVERRIDE ...]
    python benchmarks/memory_probe.py --table OUT.json     # markdown
    python benchmarks/memory_probe.py --summary FOLDER     # a results folder's whole run

``--summary`` reads a results folder holding ``time.txt`` (GNU ``time -v`` of a whole run),
the run's files (``*/summary.json``, ``*/metrics.jsonl``) and ``probe.json``, and prints one
markdown table of them.

After each round: the resident set (``/proc/self/statm``), the bytes of the distinct tensor
storages reachable by the garbage collector, then a collection with ``DEBUG_SAVEALL`` that
counts the tensors it found unreachable (garbage in cycles), after which they are freed. The
collection frees what a reference cycle held, so the probe measures a leak without keeping it.
It uses only ``run_experiment`` and a callback: it runs on older fedshift too.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

from fedshift.config import load_config
from fedshift.run.experiment import run_experiment


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def live_tensor_mb() -> float:
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            seen[s.data_ptr() or id(s)] = s.nbytes()
    return sum(seen.values()) / 2**20


class Probe:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_start(self, sim, state) -> None: ...

    def on_round_end(self, sim, state, metrics) -> None:
        before, live = rss_mb(), live_tensor_mb()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyc = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
        cyc_mb = sum(o.untyped_storage().nbytes() for o in cyc) / 2**20
        gc.garbage.clear()
        gc.set_debug(0)
        gc.collect()
        self.rows.append(
            {
                "round": state.round,
                "rss_mb": round(before, 1),
                "live_tensors_mb": round(live, 1),
                "tensors_in_cycles": len(cyc),
                "tensors_in_cycles_mb": round(cyc_mb, 1),
            }
        )
        print(json.dumps(self.rows[-1]), flush=True)

    def on_end(self, sim, state) -> None: ...


def table(path: Path) -> None:
    blob = json.loads(path.read_text())
    print(f"`{blob['config']}` {' '.join(blob['overrides'])} (fedshift {blob['fedshift']})\n")
    print("| round | resident MB | live tensors MB | tensors held by reference cycles | their MB |")
    print("|---|---|---|---|---|")
    for r in blob["rounds"]:
        print(
            f"| {r['round']} | {r['rss_mb']:,.1f} | {r['live_tensors_mb']:,.1f} "
            f"| {r['tensors_in_cycles']} | {r['tensors_in_cycles_mb']:,.1f} |"
        )


def summary(folder: Path) -> None:
    """The whole run of a results folder: GNU time's peak and wall time, the run's own peak,
    its memory plan and what its client store did."""
    time_txt = (folder / "time.txt").read_text()
    field = lambda name: next(  # noqa: E731
        line.split(": ", 1)[1].strip() for line in time_txt.splitlines() if name in line
    )
    peak_kb = int(field("Maximum resident set size"))
    run = next(folder.glob("*/summary.json"))
    s = json.loads(run.read_text())
    rounds = len((run.parent / "metrics.jsonl").read_text().splitlines())
    plan = s.get("memory") or {}
    store = s.get("client_store") or {}
    print("| what | value |")
    print("|---|---|")
    print(f"| rounds | {rounds} |")
    print(f"| wall time (GNU time) | {field('Elapsed (wall clock)')} |")
    print(f"| peak resident memory (GNU time) | {peak_kb:,} KB = {peak_kb / 2**20:.2f} GiB |")
    print(f"| the run's own peak (summary.json) | {s['peak_host_rss_mb']} MB |")
    if plan:
        print(f"| its memory plan: budget, estimate | {plan['budget_mb']} MB ({plan['budget_source']}), "
              f"{plan['estimate_mb']} MB |")  # fmt: skip
        print(f"| per client (declared) | {plan['per_client_mb']} MB |")
    if store:
        print(f"| client store: in memory at most, spilled, read back | "
              f"{store['peak_resident_mb']} MB, {store['spilled']}, {store['loaded']} |")  # fmt: skip
        print(f"| checkpoints: how many, client state written | {len(s['checkpoints'])}, "
              f"{store['bytes_written'] / 2**20:,.1f} MiB |")  # fmt: skip


def main() -> None:
    if sys.argv[1] == "--table":
        table(Path(sys.argv[2]))
        return
    if sys.argv[1] == "--summary":
        summary(Path(sys.argv[2]))
        return
    out, config, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    import fedshift

    probe = Probe()
    run_experiment(load_config(config, overrides), callbacks=[probe], overwrite=True)
    out.write_text(
        json.dumps(
            {
                "config": config,
                "overrides": overrides,
                "fedshift": fedshift.__version__,
                "rounds": probe.rows,
            },  # fmt: skip
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
