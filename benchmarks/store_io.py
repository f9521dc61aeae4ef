"""What spilling client states costs a round: written at once, by the store's background writer,
and by the writer with the next client's state read ahead.

    python benchmarks/store_io.py OUT.json [--clients 300] [--mb 25] [--rounds 2]
    python benchmarks/store_io.py --table OUT.json      # markdown

A round as the engine runs one when kept states exceed the store budget: for every client in
order, its state is read from the store, a fixed amount of compute stands in for its local
training (one torch thread), and its new state is stored; then a checkpoint commits the store
and collects the files it replaced. The state is ``--mb`` MB a client (FedRC's three kept
momentum buffers on the Fashion-MNIST CNN are about 25 MB), the budget 1.7 GiB (what the auto
plan keeps resident at 300 clients on a 24 GiB machine). Each setting is timed over
``--rounds`` rounds after a first commit: the clients' part (compute and store) and the
checkpoint, beside the compute alone, and the peak resident memory of the process that ran
it (each setting in a process of its own).

It measures the store, not a run: the compute is a stand-in of fixed size, and the disk is
whatever the run directory is on (``--folder``). ``--cold`` drops each state file from the
page cache once it is flushed to disk (``posix_fadvise(DONTNEED)``), so every state is read
back from the disk, as when the spilled states exceed what the machine can cache (about 24 GB
at 1,000 clients); without it, a VM with memory to spare reads them from its cache.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from fedshift.engine import store_writer
from fedshift.engine.store import ClientStore

GiB = 2**30


def _compute(a: torch.Tensor, w: torch.Tensor, k: int = 60) -> None:
    for _ in range(k):
        (a @ w).relu_()


#: the settings compared: (store options, name in the table)
SETTINGS = {
    "at-once": ({"background": False}, "at once"),
    "background": ({"background": True, "read_ahead": False}, "background"),
    "read-ahead": ({"background": True, "read_ahead": True}, "background + read ahead"),
}


def _evict_after_fsync() -> None:
    """Every file the store flushes to disk is then dropped from the page cache."""
    real = store_writer.fsync

    def fsync_and_evict(path: Path) -> None:
        real(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    store_writer.fsync = fsync_and_evict


def measure(
    clients: int, mb: int, rounds: int, folder: Path, setting: str, cold: bool = False
) -> dict:
    torch.set_num_threads(1)
    if cold:
        _evict_after_fsync()
    a, w = torch.randn(256, 512), torch.randn(512, 512)
    t = time.perf_counter()
    _compute(a, w)
    per_client = time.perf_counter() - t
    shutil.rmtree(folder, ignore_errors=True)
    store = ClientStore(budget=int(1.7 * GiB), folder=folder, **SETTINGS[setting][0])
    table = store.table("momentum")
    n = mb * 2**20 // 12
    for c in range(clients):
        table[c] = [{"w": torch.randn(n)} for _ in range(3)]
    store.commit()
    store.collect()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for c in range(clients):
            state = table[c]
            _compute(a, w)
            table[c] = [{"w": s["w"] + 1} for s in state]
        t1 = time.perf_counter()
        store.commit()
        store.collect()
        out.append(
            {"clients_s": round(t1 - t0, 2), "checkpoint_s": round(time.perf_counter() - t1, 2)}
        )
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "setting": setting,
        "background": setting != "at-once",
        "cold": cold,
        "clients": clients,
        "state_mb": mb,
        "budget_gib": round(store.budget / GiB, 2),
        "states_gib": round(clients * 3 * n * 4 / GiB, 2),
        "compute_s": round(per_client * clients, 2),
        "rounds": out,
        "stats": store.stats,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def table(path: Path) -> str:
    rows = json.loads(path.read_text())
    lines = [
        "| writer | reads from | clients | state MB | compute s | round s (clients + store) | checkpoint s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        clients_s = " / ".join(f"{x['clients_s']:.1f}" for x in r["rounds"])
        ckpt_s = " / ".join(f"{x['checkpoint_s']:.1f}" for x in r["rounds"])
        # rows written before the read-ahead setting name only whether the writer was used
        name = SETTINGS[r.get("setting", "background" if r["background"] else "at-once")][1]
        where = "disk" if r.get("cold") else "page cache"
        lines.append(
            f"| {name} | {where} | {r['clients']} | "
            f"{r['state_mb']} | {r['compute_s']:.1f} | {clients_s} | {ckpt_s} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--clients", type=int, default=300)
    p.add_argument("--mb", type=int, default=25)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--folder", type=Path, default=Path("runs/store_io"))
    p.add_argument("--table", action="store_true", help="print OUT.json as markdown")
    p.add_argument("--cold", action="store_true", help="read every state from the disk")
    p.add_argument("--one", choices=tuple(SETTINGS), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.table:
        print(table(a.out))
        return
    if a.one is not None:
        print(json.dumps(measure(a.clients, a.mb, a.rounds, a.folder, a.one, a.cold)))
        return
    rows = []
    for one in SETTINGS:  # each in a process of its own: its own peak RSS
        args = ["--clients", str(a.clients), "--mb", str(a.mb), "--rounds", str(a.rounds)]
        args += ["--cold"] if a.cold else []
        cmd = [sys.executable, __file__, str(a.out), "--one", one, "--folder", str(a.folder)]
        done = subprocess.run([*cmd, *args], capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    a.out.write_text(json.dumps(rows, indent=1))
    print(table(a.out))


if __name__ == "__main__":
    main()
