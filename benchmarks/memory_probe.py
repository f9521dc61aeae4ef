"""What a run holds, round by round: resident memory, the bytes of every tensor alive, and the
tensors that only Python's cyclic garbage collector would free (held by a reference cycle).

    python benchmarks/memory_probe.py OUT.json CONFIG [OVERRIDE ...]
    python benchmarks/memory_probe.py --table OUT.json     # markdown

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
from fedshift.runner import run_experiment


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


def main() -> None:
    if sys.argv[1] == "--table":
        table(Path(sys.argv[2]))
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
