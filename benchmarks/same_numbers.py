"""Same numbers before and after a refactor: small fixed-seed runs, each under the sequential
and the batched executor, their metrics (timing keys dropped) written as JSON; ``compare`` says
which differ.

- on real data: FedAvg, FedBABU, FedNH, FedRC, FedRC-FT, IFCA, Ditto, FedEM on the quickstart
  scenario (Fashion-MNIST), FedDAA on its drift table, DFL on Colored-MNIST;
- every registered algorithm (``all-<name>``) on the conformance harness's tiny scenario of its
  premise (:func:`fedshift.testing.scenario_config`), 3 rounds, half the clients a round, kept
  momentum, evaluated every round.

    python benchmarks/same_numbers.py run OUT [NAME ...]     # at the old commit, then the new
    python benchmarks/same_numbers.py compare OLD_OUT NEW_OUT
    python benchmarks/same_numbers.py lockstep OUT [NAME ...] > LOG
    python benchmarks/same_numbers.py summary LOG              # its lines as a table

``lockstep``: each of those configs as a grid of two runs (lr as configured and half of it,
seeds 0 and 1) on the batched executor, trained one after another and as one job
(:mod:`fedshift.engine.executors.lockstep`); prints whether each run's metrics are identical.

``run --vectorize vmap`` (or ``loop``) forces the batched executor's path, at either commit
(the CPU default picks the loop for convolutional models and, since the lean engine, vmap for
the others), so that the same arithmetic path is compared before and after.

Needs the offline Fashion-MNIST and MNIST (``FEDSHIFT_DATA``); about 10 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedshift.config import load_config
from fedshift.run.experiment import run_experiment

QUICK = "configs/quickstart.yaml"
SMALL = [
    "train.rounds=2",
    "eval.every=1",
    "output.plots=false",
    "scenario.num_clients=8",
    "scenario.train_fraction_of_dataset=0.02",
    "scenario.test_clients.max_samples=200",
    "train.local_epochs=1",
]
RUNS: dict[str, tuple[str, list[str]]] = {
    **{
        n: (QUICK, [*SMALL, f"algorithm.name={n}"])
        for n in ("fedavg", "fedbabu", "fednh", "fedrc-ft", "fedrc", "ifca", "ditto", "fedem")
    },
    "feddaa": (
        "configs/papers/feddaa/table1_fmnist.yaml",
        [
            "scenario.timeline.rounds_per_step=1",
            "train.rounds=6",
            "eval.every=1",
            "output.plots=false",
            "model.name=mlp",
            "model.width=32",
            "scenario.test_clients.max_samples=200",
            "scenario.num_clients=6",
        ],
    ),  # fmt: skip
    "dfl": (
        "configs/papers/dfl/table1_colored_mnist.yaml",
        [
            "train.rounds=2",
            "eval.every=1",
            "output.plots=false",
            "scenario.num_clients=4",
            "train.local_steps=3",
            "scenario.attributes.train_ratio=0.02",
            "scenario.attributes.test_ratio=0.02",
        ],
    ),  # fmt: skip
}
TIMING = {"train_s", "eval_s", "elapsed_s"}


def every_algorithm() -> dict[str, dict]:
    """Every registered algorithm on the tiny scenario of its premise (raw configs)."""
    from fedshift.algorithms.premise import premise
    from fedshift.algorithms.registry import ALGORITHMS
    from fedshift.testing import scenario_config

    out = {}
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        prem = premise(cls)
        train = {"participation": 0.5, "keep_momentum": True}
        if prem != "drift":
            train["rounds"] = 3
        raw = scenario_config(prem, Path("."), name, {}, **train)
        raw["eval"] = {"every": 1}
        out[f"all-{name}"] = raw
    return out


def force_vectorize(mode: str) -> None:
    """Every batched executor of this process takes ``mode`` (vmap or loop)."""
    from fedshift.engine.executors.batched import BatchedExecutor

    init = BatchedExecutor.__init__

    def forced(self, chunk_size: int = 64, vectorize: str = "auto") -> None:
        init(self, chunk_size, mode)

    BatchedExecutor.__init__ = forced  # type: ignore[method-assign]


def run(out: Path, only: list[str]) -> None:
    from fedshift.config import validate_config

    out.mkdir(parents=True, exist_ok=True)
    raws = every_algorithm()
    for name in [*RUNS, *raws]:
        if only and name not in only:
            continue
        for executor in ("sequential", "batched"):
            tag = f"{executor}-{name}"
            settings = [f"executor={executor}", f"output.dir={out / 'runs'}", f"name={tag}",
                        "device=cpu"]  # fmt: skip
            if name in RUNS:
                config, overrides = RUNS[name]
                cfg = load_config(config, [*overrides, *settings])
            else:
                from fedshift.algorithms import get_algorithm

                if executor == "batched" and not get_algorithm(name[4:]).supports_batched:
                    continue
                raw = dict(raws[name])
                raw.update(executor=executor, name=tag, device="cpu")
                raw["output"] = {**raw["output"], "dir": str(out / "runs")}
                cfg = validate_config(raw)
            run_experiment(cfg, overwrite=True)
            rows = (out / "runs" / tag / "metrics.jsonl").read_text().splitlines()
            kept = [{k: v for k, v in json.loads(r).items() if k not in TIMING} for r in rows]
            (out / f"{tag}.json").write_text(json.dumps(kept))
            print(tag, "done", flush=True)


def configs() -> dict[str, object]:
    """Every config of :data:`RUNS` and :func:`every_algorithm`, validated (batched where the
    algorithm supports it)."""
    from fedshift.algorithms import get_algorithm
    from fedshift.config import validate_config

    out = {}
    for name, (config, overrides) in RUNS.items():
        out[name] = load_config(config, [*overrides, "device=cpu"])
    for name, raw in every_algorithm().items():
        if get_algorithm(name[4:]).supports_batched:
            out[name] = validate_config({**raw, "device": "cpu"})
    return out


def lockstep(out: Path, only: list[str]) -> int:
    """Each config's grid of two runs alone and as one job; the number that differ."""
    from fedshift.studies.jobs import Job, execute

    differ = 0
    for name, cfg in configs().items():
        if only and name not in only:
            continue
        got = {}
        for mode in (False, True):
            jobs = []
            for i, (lr, seed) in enumerate(((cfg.train.lr, 0), (cfg.train.lr / 2, 1))):
                train = cfg.train.model_copy(update={"lr": lr})
                output = cfg.output.model_copy(update={"dir": str(out / name), "plots": False})
                c = cfg.model_copy(
                    update={"train": train, "seed": seed, "name": f"{mode}-{i}", "output": output}
                )
                jobs.append(Job(f"{name}-{i}", c))
            got[mode] = [
                [{k: v for k, v in m.items() if k not in TIMING} for m in o.history]
                for o in execute(jobs, fresh=True, lockstep=mode)
            ]
        same = got[False] == got[True]
        differ += not same
        print(name, "identical" if same else "DIFFERENT", flush=True)
    return differ


def summary(log: Path) -> str:
    """The lines of a ``lockstep`` (or ``compare``) log as a table: how many configs, how
    many identical, and the ones that differ."""
    lines = [x.split() for x in log.read_text().splitlines() if x.strip()]
    verdicts = [(x[0], x[1]) for x in lines if len(x) >= 2 and x[1] in ("identical", "DIFFERENT")]
    real = [n for n, _ in verdicts if not n.startswith("all-")]
    every = [n for n, _ in verdicts if n.startswith("all-")]
    differ = [n for n, v in verdicts if v == "DIFFERENT"]
    return "\n".join([
        "| configs | real-data configs | registered algorithms (tiny scenarios) | identical "
        "| different |",
        "|---|---|---|---|---|",
        f"| {len(verdicts)} | {len(real)} | {len(every)} | {len(verdicts) - len(differ)} "
        f"| {', '.join(differ) or 'none'} |",
    ])  # fmt: skip


def compare(old: Path, new: Path) -> int:
    differ = 0
    for f in sorted(old.glob("*.json")):
        g = new / f.name
        if not g.exists():
            print(f.stem, "missing in", new)
            differ += 1
            continue
        a, b = json.loads(f.read_text()), json.loads(g.read_text())
        print(f.stem, "identical" if a == b else "DIFFERENT", f"({len(a)} evaluations)")
        if a != b:
            differ += 1
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                for k in sorted(set(x) | set(y)):
                    if x.get(k) != y.get(k):
                        print(f"   evaluation {i} {k}: {x.get(k)} -> {y.get(k)}")
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("only", nargs="*")
    r.add_argument("--vectorize", choices=("auto", "vmap", "loop"), default="auto")
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    g = sub.add_parser("lockstep")
    g.add_argument("out", type=Path)
    g.add_argument("only", nargs="*")
    m = sub.add_parser("summary")
    m.add_argument("log", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        if args.vectorize != "auto":
            force_vectorize(args.vectorize)
        run(args.out, args.only)
    elif args.cmd == "summary":
        print(summary(args.log))
    elif args.cmd == "lockstep":
        raise SystemExit(1 if lockstep(args.out, args.only) else 0)
    else:
        raise SystemExit(1 if compare(args.old, args.new) else 0)


if __name__ == "__main__":
    main()
