"""The conformance harness: does an algorithm keep the contract, and does it learn where its
premise holds? CI runs it over every registered algorithm (``tests/algorithms/test_conformance.py``); call
it on your own::

    from fedshift.testing import check_algorithm
    report = check_algorithm("my-method", {"mu": 0.1})
    print(report)          # one line per check: passed or what failed, with the numbers
    report.assert_ok()     # AssertionError listing the failures (e.g. inside a pytest test)

The checks, each on a tiny scenario built in memory (synthetic Gaussian classes or
scikit-learn's 8x8 digits; seconds each on a CPU):

- ``typed`` — the algorithm declares the keys of its server and client states
  (``ServerState``, ``ClientState``: TypedDicts), which the engine then checks in every run
  below;
- ``pure`` — ``client_task`` never changes a client's state, and gives the same task twice;
- ``executors`` — the batched executor gives the sequential one's models and metrics;
- ``resume`` — a run stopped after 2 rounds and resumed ends with the uninterrupted metrics;
- ``learns`` — on the scenario of its :func:`premise`, the algorithm does what it claims
  against FedAvg on the same data and seed: clustered methods beat it under 2 contradicting
  concepts and recover them (ARI >= 0.8); personalised methods beat it on local accuracy under
  pathological label skew; feature-skew methods (FedBN, DFL) beat it under per-client colours;
  long-tail methods (FedNH, CReFF) are not worse than it (at most 2 points below) with the
  global model on a balanced test set after training on a long-tailed one (imbalance 10);
  drift methods flag a scripted concept change and not a rotation (precision and recall
  >= 75%; a method without verdicts, the Oracle, must beat it by 10 points); every other method
  learns (local accuracy at least 0.8 of FedAvg's and 30 points above chance) on IID data.

An algorithm's premise is its ``premise`` class attribute when set, else it follows from its
capabilities (:mod:`fedshift.algorithms.capabilities`).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fedshift.algorithms import RoundContext, get_algorithm
from fedshift.algorithms.premise import premise
from fedshift.algorithms.registry import ALGORITHMS
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config

CHECKS = ("typed", "pure", "executors", "resume", "learns")
PREMISES = ("iid", "concepts", "label_skew", "feature_skew", "long_tail", "drift")


@dataclass
class Check:
    name: str
    passed: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok  ' if self.passed else 'FAIL'} {self.name}: {self.detail}"


@dataclass
class Conformance:
    """What :func:`check_algorithm` found: one :class:`Check` per check run."""

    algorithm: str
    premise: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def __str__(self) -> str:
        head = f"{self.algorithm} (premise: {self.premise})"
        return "\n".join([head, *(f"  {c}" for c in self.checks)])

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(str(self))


def check_algorithm(
    algorithm: str | type,
    params: dict[str, Any] | None = None,
    *,
    checks: tuple[str, ...] = CHECKS,
    workdir: str | Path | None = None,
) -> Conformance:
    """Run the conformance ``checks`` on ``algorithm`` (a registered name, or an algorithm
    class: one not registered is registered for the checks only) with hyper-parameters
    ``params``; run folders go under ``workdir`` (default: a temporary folder, removed)."""

    if isinstance(algorithm, str):
        return _check(ALGORITHMS.get(algorithm), params, checks, workdir)
    with ALGORITHMS.temporarily(algorithm.name, algorithm):
        return _check(algorithm, params, checks, workdir)


def _check(cls: type, params: dict | None, checks: tuple[str, ...], workdir) -> Conformance:
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; allowed: {', '.join(CHECKS)}")
    params = dict(params or {})
    report = Conformance(cls.name, premise(cls))
    fns = {
        "typed": _typed,
        "pure": _pure,
        "executors": _executors,
        "resume": _resume,
        "learns": _learns,
    }
    with tempfile.TemporaryDirectory() if workdir is None else _Keep(workdir) as tmp:
        for check in checks:
            try:
                out = Path(tmp) / check
                report.checks.append(fns[check](cls.name, params, out, report.premise))
            except Exception as err:  # a crash is a failed check, named with its cause
                report.checks.append(Check(check, False, f"raised {type(err).__name__}: {err}"))
    return report


class _Keep:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def __enter__(self) -> str:
        Path(self.path).mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *exc: Any) -> None:
        return None


# ---------------------------------------------------------------------- scenarios


def scenario_config(premise: str, out: Path, name: str, params: dict, **train: Any) -> dict:
    """The raw config of the tiny scenario of ``premise`` with algorithm ``name`` (``train``:
    overrides of its train section)."""
    synthetic = {
        "dataset": "synthetic",
        "dataset_options": {"n_train": 1600, "n_test": 400, "dim": 16, "num_classes": 4},
        "num_clients": 8,
        "label_shift": {"kind": "iid"},
    }
    model = {"name": "mlp", "width": 32}
    tr: dict[str, Any] = {"rounds": 8, "batch_size": 32, "lr": 0.05, "participation": 1.0}
    if premise == "concepts":  # y and 3 - y, half the clients each
        halves = [{"fraction": 0.5, "concepts": [0]}, {"fraction": 0.5, "concepts": [1]}]
        scen = {**synthetic, "concepts": ["identity", "reverse"], "mix": {"types": halves}}
        tr.update(rounds=12, local_epochs=3)
    elif premise == "label_skew":  # 2 of 8 classes per client
        opts = {"n_train": 2400, "n_test": 800, "dim": 16, "num_classes": 8, "separation": 1.0}
        shift = {"kind": "pathological", "classes_per_client": 2}
        scen = {**synthetic, "dataset_options": opts, "label_shift": shift}
    elif premise == "feature_skew":  # digits on one background colour per client
        colour = {"kind": "color", "mode": "background", "train_ratio": 0.5, "test_ratio": 0.5}
        scen = {"dataset": "digits", "num_clients": 8, "attributes": colour}
        model = {"name": "convbn_cnn"}
        tr.update(rounds=12, participation=0.5, local_steps=10, batch_size=16)
    elif premise == "long_tail":  # 8 classes, the largest 10x the smallest, balanced test set
        opts = {"n_train": 8000, "n_test": 800, "dim": 16, "num_classes": 8, "separation": 2.0}
        shift = {"kind": "dirichlet", "alpha": 1.0}
        scen = {**synthetic, "dataset_options": opts, "label_shift": shift, "long_tail": 10.0}
        scen["test_clients"] = {"adapt_fraction": 0.0}  # all 800 test images scored
    elif premise == "drift":  # at step 2 half the clients swap concept and every image rotates
        steps = [{"concepts": [0, 1]}, {"concepts": [0, 1], "switch": 0.5, "style": "rotate:90"}]
        timeline = {"rounds_per_step": 4, "assignment": "switch", "steps": steps}
        scen = {"dataset": "digits", "num_clients": 8, "concepts": ["identity", "reverse"]}
        scen.update(test_fraction=0.2, timeline=timeline)
        model = {"name": "lenet_small"}
        tr.update(batch_size=16, keep_momentum=True)
        del tr["rounds"]  # the timeline's
    else:
        scen = synthetic
    tr.update(train)
    return {
        "seed": 0,
        "device": "cpu",
        "scenario": scen,
        "model": model,
        "algorithm": {"name": name, "params": params},
        "train": tr,
        "eval": {"every": 1 if premise == "drift" else tr["rounds"]},
        "output": {"dir": str(out), "plots": False},
    }


def _run(raw: dict, run_name: str, **kw: Any):

    return run_experiment(validate_config({**raw, "name": run_name}), **kw)


# ---------------------------------------------------------------------- comparing executors
#
# Two executors (a per-client loop, a vmapped chunk, Ray actors) run the same arithmetic in
# another order of float additions (one matmul per client against one batched matmul; other
# kernel blockings on another CPU, AVX2 or AVX-512, or thread count). Each difference is a few
# units of roundoff, and SGD carries it through the rounds, amplified by the dynamics: in
# float32 (unit roundoff 6e-8) small DFL runs moved weights by up to 1.06e-4 on an AVX2 machine,
# an amplification of about 2e3, so no float32 tolerance holds for every CPU. Executors are
# therefore compared in float64 (unit roundoff 1.1e-16): the same amplification leaves about
# 2e-13, and F64_ATOL = 1e-9 holds with a margin above 1e3, while a real difference (a wrong
# mask, a swapped client, a learning rate off by one part in a million) moves weights by more.
# A prediction flips only where two logits agree to about 1e-13: accuracies are compared exactly.
F64_ATOL = 1e-9
F64_RTOL = 1e-9


@contextmanager
def float64() -> Iterator[None]:
    """Models, algorithm state and new tensors in float64 inside the block (torch's default
    dtype put back after it; Ray actors take the driver's)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def as_float64(data):
    """A copy of a scenario's FederatedData whose model inputs come out in float64 (float pools
    cast; uint8 images normalised by a float64 mean and std); ``data`` is not changed."""
    x = data.x.double() if data.x.is_floating_point() else data.x
    return replace(data, x=x, mean=data.mean.double(), std=data.std.double())


def float64_difference(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None where ``actual`` equals ``expected`` to F64_ATOL + F64_RTOL x |expected|, else the
    largest difference, where and at which value."""
    a, e = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
    if a.shape != e.shape:
        return f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    diff = (a - e).abs()
    bound = F64_ATOL + F64_RTOL * e.abs()
    if not bool((diff > bound).any()):
        return None
    worst = int((diff - bound).argmax())
    return (
        f"differs by {float(diff.flatten()[worst]):.3e} at flat index {worst} (value "
        f"{float(e.flatten()[worst]):.6g}; float64 tolerance {F64_ATOL:g} + {F64_RTOL:g} x |value|)"
    )


# ---------------------------------------------------------------------- the checks


def _typed(name: str, params: dict, out: Path, prem: str) -> Check:

    cls = get_algorithm(name)
    missing = [a for a in ("ServerState", "ClientState") if getattr(cls, a, None) is None]
    if missing:
        return Check(
            "typed", False, f"declare {' and '.join(missing)} (TypedDicts of the state's keys; "
            "fedshift.algorithms.states has the common ones)"
        )  # fmt: skip
    return Check(
        "typed", True, f"server {cls.ServerState.__name__}, client {cls.ClientState.__name__}"
    )


def _pure(name: str, params: dict, out: Path, prem: str) -> Check:

    cfg = validate_config({**scenario_config("iid", out, name, params, rounds=1), "name": "p"})
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    state = Simulator(algo, data, sim_config(cfg)).run()  # clients now hold real states
    ctx = RoundContext(round=2, sampled=tuple(range(len(data.clients))))
    for c in data.clients:
        client = state.clients.get(c.cid) or algo.init_client_state(c.cid)
        before = copy.deepcopy(client)
        view = client_data(data, c)
        first = algo.client_task(state.server, client, view, ctx)
        if not same(client, before):
            return Check("pure", False, f"client_task changed client {c.cid}'s state")
        second = algo.client_task(state.server, client, view, ctx)
        if not same(first.params, second.params) or not same(first.extras, second.extras):
            return Check("pure", False, f"client_task gave client {c.cid} two different tasks")
    return Check("pure", True, f"client_task of {len(data.clients)} clients left them as they were")


def _executors(name: str, params: dict, out: Path, prem: str) -> Check:

    if not get_algorithm(name).supports_batched:
        return Check("executors", True, "sequential only (supports_batched = False)")
    raw = scenario_config("iid", out, name, params, rounds=2, participation=0.5)
    raw["eval"] = {"every": 1}
    cfg = validate_config({**raw, "name": "executors"})
    with float64():  # see F64_ATOL
        data = as_float64(build_scenario(cfg.scenario, cfg.seed))
        seq, bat = (
            Simulator(
                make_algorithm(cfg, data, torch.device("cpu")), data, sim_config(cfg), ex
            ).run()
            for ex in (SequentialExecutor(), BatchedExecutor(chunk_size=3))
        )
    for part in ("params", "buffers"):
        for key, v in seq.server.get(part, {}).items():
            if v.is_floating_point() and (why := float64_difference(bat.server[part][key], v)):
                return Check("executors", False, f"server {part} {key}: {why}")
    for a, b in zip(seq.history, bat.history, strict=True):
        if "local_acc" in a and a["local_acc"] != b.get("local_acc"):
            return Check(
                "executors", False, f"round {a['round']} local_acc: sequential "
                f"{a['local_acc']:.4f}, batched {b.get('local_acc')}"
            )  # fmt: skip
        if "train_loss" in a and (why := float64_difference(b["train_loss"], a["train_loss"])):
            return Check("executors", False, f"round {a['round']} train_loss: {why}")
    return Check(
        "executors", True, f"same models (float64) and metrics over {len(seq.history)} evaluations"
    )


def _resume(name: str, params: dict, out: Path, prem: str) -> Check:
    raw = scenario_config("iid", out, name, params, rounds=3, participation=0.5)
    raw["eval"] = {"every": 1}
    full = _run(raw, "full")
    _run({**raw, "train": {**raw["train"], "rounds": 1}}, "part")
    resumed = _run(raw, "part", run_dir=out / "part", resume=True)
    keys = ("local_acc", "global_acc", "train_acc", "train_loss")
    for a, b in zip(full.history, resumed.history, strict=True):
        for key in (k for k in keys if k in a):
            if abs(a[key] - b[key]) > 1e-9:
                return Check(
                    "resume", False, f"round {a['round']} {key}: uninterrupted {a[key]}, resumed "
                    f"{b[key]}"
                )  # fmt: skip
    return Check("resume", True, "stopped after round 1 and resumed: the same 3 evaluations")


_FEDAVG: dict[str, list[dict]] = {}


def _fedavg_history(prem: str, out: Path) -> list[dict]:
    """FedAvg's history on the premise's scenario (computed once per process)."""
    if prem not in _FEDAVG:
        raw = scenario_config(prem, out.parent / "fedavg-baseline", "fedavg", {})
        _FEDAVG[prem] = _run(raw, "fedavg", overwrite=True).history
    return _FEDAVG[prem]


def _learns(name: str, params: dict, out: Path, prem: str) -> Check:
    if prem not in PREMISES:
        return Check("learns", False, f"unknown premise {prem!r}; allowed: {', '.join(PREMISES)}")

    fields = get_algorithm(name).Params.model_fields
    if prem == "concepts":  # as many models as concepts
        size = next((k for k in ("num_clusters", "max_clusters") if k in fields), None)
        params = {size: 2, **params} if size else params
    hist = _run(scenario_config(prem, out, name, params), "run").history
    last, base = hist[-1], _fedavg_history(prem, out)[-1]
    acc, ref = last["local_acc"], base["local_acc"]
    vs = f"local acc {acc:.1f} vs FedAvg {ref:.1f}"
    if prem == "concepts":
        ari = last.get("ari_concept")
        ok = acc >= ref + 10 and (ari is None or ari >= 0.8)
        return Check("learns", ok, f"2 contradicting concepts: {vs}, ARI vs concepts {ari}")
    if prem == "label_skew":
        return Check("learns", acc >= ref + 5, f"pathological label skew (2 of 8 classes): {vs}")
    if prem == "feature_skew":
        return Check("learns", acc >= ref + 1, f"one background colour per client: {vs}")
    if prem == "long_tail":
        acc, ref = last["global_acc"], base["global_acc"]
        return Check(
            "learns", acc >= ref - 2, f"long-tailed training set (imbalance 10), balanced test "
            f"set: global-model acc {acc:.1f} vs FedAvg {ref:.1f}"
        )  # fmt: skip
    if prem == "drift":
        flagged = [h for h in hist if h.get("drift_recall") is not None]
        if not flagged:  # a method that gives no verdicts (the Oracle): it must keep up
            ok = acc >= ref + 10
            return Check("learns", ok, f"half the clients swap concept at step 2: {vs}")
        p, r = flagged[-1]["drift_precision"], flagged[-1]["drift_recall"]
        return Check(
            "learns", p >= 75 and r >= 75, f"at step 2 half the clients swap concept, every "
            f"image rotates: drift precision {p:.0f}%, recall {r:.0f}%"
        )  # fmt: skip
    chance = 100.0 / 4
    ok = acc >= 0.8 * ref and acc >= chance + 30
    return Check("learns", ok, f"IID Gaussian classes: {vs} (chance {chance:.0f})")


def same(a: Any, b: Any) -> bool:
    """Deep equality of states and tasks (tensors compared by value)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return (
            isinstance(b, list | tuple)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b
