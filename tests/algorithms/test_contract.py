"""The algorithm contract: client_task is pure for every algorithm, it sees the round's context,
a phase's own lr / steps / batch size / clipping hold under both executors, sub-modules run
functionally, and an executor that cannot run an algorithm is a config error."""

from __future__ import annotations

import pytest
import torch

from fedshift.algorithms import get_algorithm
from fedshift.algorithms.base import LocalTask, Phase
from fedshift.config import validate_config
from fedshift.core.errors import ConfigError
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, make_executor, sim_config
from tests.conftest import as_float64, assert_close64, float64, tiny_config

CPU = torch.device("cpu")
PARAMS = {"fedrc": {"num_clusters": 2}, "fedem": {"num_clusters": 2}, "ifca": {"num_clusters": 2}}


def same(a, b) -> bool:
    """Deep equality of states (tensors compared by value)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_client_task_receives_the_round_context(tmp_path, monkeypatch):
    cfg = validate_config(tiny_config(tmp_path, train__rounds=2, train__participation=0.5))
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, CPU)
    seen = []
    real = algo.client_task

    def spy(server, client, view, ctx):
        seen.append((ctx.round, ctx.sampled, view.cid))
        return real(server, client, view, ctx)

    monkeypatch.setattr(algo, "client_task", spy)
    Simulator(algo, data, sim_config(cfg)).run()
    assert [r for r, _, _ in seen] == [1, 1, 1, 2, 2, 2]
    for rnd in (1, 2):
        cids = tuple(c for r, _, c in seen if r == rnd)
        assert all(s == cids for r, s, _ in seen if r == rnd) and len(cids) == 3


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_phase_overrides_hold_under_both_executors(tmp_path, vectorize):
    """A frozen phase (lr 0, 2 fixed steps), then one with its own lr, batch size, drop_last
    and clipping: the same models and step counts from both executors (in float64: see
    F64_ATOL in fedshift/testing.py); lr 0 moves nothing."""
    with float64():
        _phase_overrides_hold_under_both_executors(tmp_path, vectorize)


def _phase_overrides_hold_under_both_executors(tmp_path, vectorize):
    cfg = validate_config(tiny_config(tmp_path))
    data = as_float64(build_scenario(cfg.scenario, cfg.seed))
    algo = make_algorithm(cfg, data, CPU)
    p, b = algo.ops.init(0)
    phases = (
        Phase(lr=0.0, steps=2, momentum=0.0, weight_decay=0.0),
        Phase(lr=0.3, epochs=2, batch_size=50, drop_last=False, clip=0.5),
    )
    jobs = [(LocalTask([p], [b], phases=phases), client_data(data, c)) for c in data.clients[:3]]
    work = RoundWork.of(
        lr=0.01, momentum=0.9, weight_decay=0.0, grad_clip=None, batch_size=32, drop_last=True
    )
    seq = list(SequentialExecutor().train(algo, jobs, work))
    bat = sorted(BatchedExecutor(2, vectorize).train(algo, jobs, work), key=lambda r: r.cid)
    n = data.clients[0].num_train
    assert seq[0].telemetry["steps"] == 2 + 2 * -(-n // 50)
    for a, c in zip(seq, bat, strict=True):
        assert a.telemetry["steps"] == c.telemetry["steps"]
        for k in p:
            assert_close64(c.params[0][k], a.params[0][k], f"client {a.cid} {k}")
    frozen = LocalTask([p], [b], phases=phases[:1])
    only_frozen = SequentialExecutor().train_one(algo, frozen, jobs[0][1], work)
    assert all(torch.equal(only_frozen.params[0][k], p[k]) for k in p)


def test_sub_modules_run_functionally(tmp_path):
    cfg = validate_config(tiny_config(tmp_path))
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, CPU)
    p, b = algo.ops.init(0)
    x = data.inputs(data.clients[0].train_idx[:5])
    feats = algo.ops.call("body", p, b, x)
    logits = algo.ops.call("head", p, b, feats)
    torch.testing.assert_close(logits, algo.ops.forward(p, b, x))
    shifted = {**p, "head.weight": p["head.weight"] + 1.0}  # the call reads the given params
    assert not torch.allclose(algo.ops.call("head", shifted, b, feats), logits)


def test_an_executor_that_cannot_run_the_algorithm_is_a_config_error(tmp_path, monkeypatch):
    cfg = validate_config(tiny_config(tmp_path, executor="batched"))
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, CPU)
    assert isinstance(make_executor(cfg, algo), BatchedExecutor)
    monkeypatch.setattr(type(algo), "supports_batched", False)
    with pytest.raises(ConfigError, match="batched"):
        make_executor(cfg, algo)
    auto = validate_config(tiny_config(tmp_path, executor="auto"))
    assert isinstance(make_executor(auto, algo), SequentialExecutor)
    assert get_algorithm("FedAvg") is get_algorithm("fedavg")


@pytest.mark.parametrize(
    "phase, needle",
    [
        (Phase(loss="locl_loss"), "names the loss 'locl_loss'"),
        (Phase(trainable=((1, None),)), "trains model 1, but the task has 1"),
        (Phase(trainable=((0, ("body.1.wieght",)),)), "did you mean 'body.1.weight'"),
    ],
)
def test_a_task_that_cannot_run_fails_when_it_is_built(tmp_path, monkeypatch, phase, needle):
    """A misspelt loss or parameter name is a one-line error at the task, before training."""
    from dataclasses import replace

    from fedshift.algorithms.fedavg import FedAvg
    from fedshift.core.errors import FedshiftError
    from fedshift.run.experiment import run_experiment

    build = FedAvg.client_task
    monkeypatch.setattr(
        FedAvg, "client_task", lambda self, *a: replace(build(self, *a), phases=(phase,))
    )
    cfg = validate_config(tiny_config(tmp_path, model={"name": "mlp", "width": 8}))
    with pytest.raises(FedshiftError, match="fedavg.client_task: phase 0") as err:
        run_experiment(cfg)
    assert needle in str(err.value)
    assert "locl_loss" not in needle or "did you mean 'local_loss'" in str(err.value)


def test_a_state_with_a_misspelt_or_missing_key_fails_in_the_hook_that_made_it(
    tmp_path, monkeypatch
):
    """States are checked against the declared TypedDicts: the closest declared key is named."""
    from fedshift.algorithms.fedavg import FedAvg
    from fedshift.algorithms.states import GlobalModel, check_state
    from fedshift.core.errors import FedshiftError
    from fedshift.run.experiment import run_experiment

    algo = FedAvg(FedAvg.Params(), None, 3, seed=0, train=None)
    state = {"params": {}, "buffers": {}}
    assert check_state(algo, state, "server", "aggregate") is state
    with pytest.raises(FedshiftError, match="without 'buffers', which its GlobalModel requires"):
        check_state(algo, {"params": {}}, "server", "aggregate")
    with pytest.raises(FedshiftError, match="'bufers'.*did you mean 'buffers'"):
        check_state(algo, {"params": {}, "buffers": {}, "bufers": {}}, "server", "aggregate")
    assert GlobalModel.__required_keys__ == {"params", "buffers"}

    aggregate = FedAvg.aggregate
    monkeypatch.setattr(
        FedAvg, "aggregate", lambda self, *a: {**aggregate(self, *a), "roud": a[-1].round}
    )
    with pytest.raises(FedshiftError, match="fedavg.aggregate returned a server state with 'roud'"):
        run_experiment(validate_config(tiny_config(tmp_path, train__rounds=1)))


#: what an author writes an algorithm with, each from ``fedshift.algorithms``
AUTHOR_NAMES = {
    "hooks": ["Algorithm", "HyperParams", "TrainDefaults", "keep_shared", "RunningAverage"],
    "task and result": ["LocalTask", "Phase", "Adversary", "Batch", "ClientData", "ClientResult",
                        "RoundContext", "State", "TensorDict", "Mixture"],
    "capabilities": ["Personalised", "FineTunes", "AdaptsTestClients", "DriftAware",
                     "DriftCheckParams", "own_model"],
    "clustered": ["ClusteredAlgorithm", "ClusteredParams"],
    "states": ["NoState", "GlobalModel", "OwnModel", "SharedInit", "Clusters", "HardAssignment"],
    "ops": ["ModelOps", "ServerOptimizer"],
    "registry": ["register", "get_algorithm", "algorithm_names"],
    "fedavg": ["FedAvg", "FedAvgParams", "average_models", "client_weight"],
}  # fmt: skip


def test_an_author_needs_one_import():
    """Every name an author needs, and every public class of the contract's modules (each
    capability mixin, typed state, task type), is in ``fedshift.algorithms.__all__``."""
    import inspect

    import fedshift.algorithms as pkg
    from fedshift.algorithms import capabilities, states, task

    exported = set(pkg.__all__)
    assert len(exported) == len(pkg.__all__), "a name is listed twice"
    assert all(hasattr(pkg, n) for n in exported)
    missing = {n for names in AUTHOR_NAMES.values() for n in names} - exported
    for module in (capabilities, states, task):
        missing |= {
            n
            for n, obj in vars(module).items()
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and n[0] != "_"
        } - exported
    assert not missing, f"fedshift.algorithms does not export {sorted(missing)}"


def test_a_capability_is_a_mixin_only():
    """``personalised`` is the mixin, never a flag: no class carries the attribute, and
    registering one that sets it is an error naming the mixin."""
    from fedshift.algorithms import Algorithm, FedAvg, algorithm_names, register

    assert not hasattr(Algorithm, "personalised")
    assert not any(hasattr(get_algorithm(n), "personalised") for n in algorithm_names())

    class Flagged(FedAvg):
        name = "flagged-avg"
        personalised = True

    with pytest.raises(TypeError, match=r"class Flagged\(Personalised, \.\.\.\)"):
        register(Flagged)
    assert "flagged-avg" not in algorithm_names()


def test_the_documented_algorithms_import_only_fedshift_algorithms():
    """The guide's example algorithms, the getting-started example and the plugin test's
    algorithm take what they write an algorithm with from ``fedshift.algorithms``, nowhere else
    in fedshift (the guide's harness block imports ``fedshift.testing`` to check them)."""
    import ast

    from tests.conftest import PLUGIN, api_example, example_blocks

    def fedshift_imports(code: str) -> set[str]:
        tree = ast.parse(code)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        return {m for m in names if m.split(".")[0] == "fedshift"}

    guide = [b for b in example_blocks("python") if "class " in b]
    assert len(guide) == 2
    for code in [*guide, PLUGIN]:
        assert fedshift_imports(code) == {"fedshift.algorithms"}, code
    api = api_example()
    assert fedshift_imports(api) == {"fedshift", "fedshift.algorithms"}  # the run API: fedshift
    assert "from fedshift.algorithms import FedAvg" in api and "fedshift.register" not in api
