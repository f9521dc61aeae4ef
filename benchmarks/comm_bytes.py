"""What each method sends per client and round (FedRC's Table 11 question: how much does a
shared feature extractor save?), measured on the messages fedshift's Flower deployment encodes.

    python benchmarks/comm_bytes.py measure CONFIG [--algorithms fedavg,fedrc,fedrc-shared]
        [--clusters 3] [OVERRIDE ...] --json sizes.json
    python benchmarks/comm_bytes.py render sizes.json > table.md

For each algorithm: the scenario and model of CONFIG (overrides ``key=value`` as on the command
line), the server's first state, client 0's task of round 1 encoded as the deployment sends it
(:func:`fedshift.flower.codec.encode_request`: every model's parameters and buffers as Flower
arrays, the rest as one blob), one local training of that task on the sequential executor, and
its result encoded as a node returns it (:func:`~fedshift.flower.codec.encode_result`). Printed
per direction: the parameters (float tensors of the model arrays), the bytes of the encoded
message (arrays as serialised, plus the blob), and the bytes of its distinct arrays (an array
whose content another array of the message already has counted once: what a transport that
sends each distinct tensor once would carry). Momentum kept by the server is excluded (none of
these methods sends it). No accuracy: the run's accuracy needs a training run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

from fedshift.algorithms.base import RoundContext
from fedshift.cli import console
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.simulator import Simulator
from fedshift.flower.codec import TrainRequest, encode_request, encode_result
from fedshift.run.experiment import make_algorithm, sim_config


def message_size(records) -> tuple[int, int, int]:
    """(float parameters in the model arrays, encoded bytes, bytes of the distinct arrays) of
    a Flower RecordDict."""
    params, total, distinct, seen = 0, 0, 0, set()
    for name, rec in records.array_records.items():
        for _, arr in rec.items():
            size = len(arr.data)
            total += size
            digest = hashlib.sha256(arr.data).digest()
            if digest not in seen:
                seen.add(digest)
                distinct += size
            if name.startswith("params.") and arr.dtype.startswith("float"):
                params += int(torch.tensor(arr.shape).prod()) if arr.shape else 1
    for _, rec in records.config_records.items():
        blob = rec.get("blob")
        if isinstance(blob, bytes):
            total += len(blob)
            distinct += len(blob)
    return params, total, distinct


def measure(cfg) -> dict[str, tuple[int, int, int]]:
    """The down (task) and up (result) sizes of client 0 in round 1 of ``cfg``."""
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    state = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).initial_state()
    view = client_data(data, data.clients[0])
    client = state.clients.get(0) or algo.init_client_state(0)
    task = algo.client_task(state.server, client, view, RoundContext(1, (0,)))
    t = cfg.train
    work = RoundWork.of(
        lr=t.lr,
        momentum=t.momentum,
        weight_decay=t.weight_decay,
        batch_size=t.batch_size,
        local_epochs=t.local_epochs,
        drop_last=t.drop_last,
        round=1,
    )
    down = encode_request(TrainRequest(task, view, work, 0, ""))
    result = SequentialExecutor().train_one(algo, task, view, work)
    up = encode_result(result, 0)
    return {"down": message_size(down), "up": message_size(up)}


def render(rows: list[dict]) -> str:
    """The markdown table of :func:`measure`'s rows (one per algorithm)."""
    lines = [
        "| method | parameters down | bytes down | distinct bytes down | parameters up "
        "| bytes up | distinct bytes up |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        (pd, bd, dd), (pu, bu, du) = r["down"], r["up"]
        lines.append(f"| {r['algorithm']} | {pd:,} | {bd:,} | {dd:,} | {pu:,} | {bu:,} | {du:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="encode each method's messages; write their sizes")
    m.add_argument("config", type=Path)
    m.add_argument("--algorithms", default="fedavg,fedem,fedrc,fedrc-shared")
    m.add_argument("--clusters", type=int, default=3)
    m.add_argument("--json", type=Path, required=True, help="where the sizes go")
    r = sub.add_parser("render", help="the markdown table of a sizes file")
    r.add_argument("sizes", type=Path)
    args, rest = parser.parse_known_args(argv)  # the rest: config overrides key=value
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad or (rest and args.cmd != "measure"):
        parser.error(f"unrecognised arguments: {' '.join(bad or rest)}")
    args.overrides = rest
    path = args.config if args.cmd == "measure" else args.sizes
    if not path.is_file():
        print(f"error: no file {path}", file=sys.stderr)
        return 2
    if args.cmd == "render":
        print(render(json.loads(path.read_text())["rows"]))
        return 0
    rows = []
    for name in args.algorithms.split(","):
        over = [*args.overrides, f"algorithm.name={name}", "algorithm.params={}"]
        if name != "fedavg":
            over.append(f"algorithm.params.num_clusters={args.clusters}")
        cfg = console.load(str(args.config), over, None)
        rows.append({"algorithm": name, **measure(cfg)})
    args.json.write_text(
        json.dumps(
            {
                "config": str(args.config),
                "overrides": args.overrides,
                "clusters": args.clusters,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(render(rows))
    return 0


if __name__ == "__main__":
    # exit only on an error: `fedshift results check` may run this file in its own process
    if code := main():
        raise SystemExit(code)
