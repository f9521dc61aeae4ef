"""Norm-bounded aggregation (``train.clip_updates``): the clipping arithmetic, every averaging
algorithm's aggregate moved at most the bound by a client that sends its update times 1e4, the
default leaving runs as they were, and a tiny run that a hostile client ruins unless clipped."""

from __future__ import annotations

import math

import pytest
import torch

from fedshift.algorithms import algorithm_names
from fedshift.algorithms.clipping import (
    clip_result,
    clip_results,
    clip_update,
    median_bound,
    nearest_origins,
    update_delta,
    update_norm,
)
from fedshift.algorithms.task import ClientResult
from fedshift.config import validate_config
from fedshift.core.errors import ConfigError, DivergedError
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, sim_config
from tests.algorithms.conftest import averaged_with_buffers, make_hostile
from tests.conftest import tiny_config

CPU = torch.device("cpu")
PARAMS = {"fedrc": {"num_clusters": 2}, "fedem": {"num_clusters": 2}, "ifca": {"num_clusters": 2}}
#: registered algorithms whose server state holds no averaged model (FedProto's prototypes)
NOT_AVERAGING = {"fedproto"}
#: the fixed bound of the per-algorithm test: below the honest updates' norms, so every
#: client's update is clipped and the average moves at most this far
BOUND = 0.05
#: aggregates that are no weighted average of the clients' models, and how far beyond the
#: bound their step may go with every update within it: FedDyn adds its correction
#: -h/alpha, in the first round the mean update again (times the participating share);
#: FedRC-shared averages the shared body over the K models' updates, each clipped on its
#: own, so a model's body and head each move within the bound, together within sqrt(2) of it
NOT_AN_AVERAGE = {"feddyn": 2.0, "fedrc-shared": math.sqrt(2)}
#: aggregates whose step the bound does not hold, where the test bounds the hostile
#: client's influence instead (the clipped aggregate with it against the one without it):
#: Flash's adaptive server step is scale-free (about its lr per coordinate, whatever the
#: mean update), FedSoft averages each client's model into every cluster centre, not only
#: the one it started from
INFLUENCE_ONLY = {"flash", "fedsoft"}
#: tensors of an averaged model set from uploads, not averaged: FedNH's head prototypes
#: (normalised class means of the clients' features)
FROM_UPLOADS = {"fednh": {"head.prototypes"}}


def delta_of(model, start, scale=1.0):
    return {k: start[k] + scale * v for k, v in model.items()}


# ---------------------------------------------------------------------- the arithmetic
def test_clip_update_bounds_the_norm_and_keeps_the_direction():
    torch.manual_seed(0)
    delta = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    norm = update_norm(delta)
    clipped = clip_update(delta, norm / 4)
    assert update_norm(clipped) == pytest.approx(norm / 4, rel=1e-6)
    assert update_norm(clipped) <= norm / 4 * (1 + 1e-6)
    for k in delta:  # the same direction: a positive multiple of the update
        cos = torch.nn.functional.cosine_similarity(clipped[k].flatten(), delta[k].flatten(), 0)
        assert float(cos) == pytest.approx(1.0, abs=1e-6)
        torch.testing.assert_close(clipped[k], delta[k] * 0.25)


def test_an_update_within_the_bound_is_left_as_it_is():
    delta = {"w": torch.tensor([3.0, 4.0])}
    assert clip_update(delta, 5.0) is delta
    assert clip_update(delta, 100.0) is delta
    assert update_norm(clip_update(delta, 1.0)) == pytest.approx(1.0)
    assert update_norm(clip_update({"w": torch.zeros(3)}, 1e-9)) == 0.0


def test_the_median_bound_is_the_lower_median():
    assert median_bound([5.0, 1.0, 3.0]) == 3.0
    assert median_bound([1.0, 1e4]) == 1.0  # two clients: the hostile one never sets it
    assert median_bound([4.0, 1.0, 3.0, 2.0]) == 2.0
    with pytest.raises(ValueError):
        median_bound([])


def test_update_delta_skips_integer_and_unknown_tensors():
    start = {"w": torch.zeros(2), "n": torch.tensor(3), "s": torch.zeros(3)}
    model = {"w": torch.ones(2), "n": torch.tensor(9), "s": torch.ones(2), "new": torch.ones(1)}
    assert set(update_delta(model, start)) == {"w"}


def _result(cid, params, buffers):
    return ClientResult(cid, 10, [params], [buffers])


def test_clip_result_clips_params_and_float_buffers_together():
    start = ({"w": torch.zeros(3)}, {"mean": torch.zeros(1), "n": torch.tensor(5)})
    sent = _result(0, {"w": torch.tensor([0.0, 3.0, 0.0])}, {
        "mean": torch.tensor([4.0]), "n": torch.tensor(7)
    })  # fmt: skip
    out = clip_result(sent, ([start[0]], [start[1]]), [1.0])
    torch.testing.assert_close(out.params[0]["w"], torch.tensor([0.0, 0.6, 0.0]))
    torch.testing.assert_close(out.buffers[0]["mean"], torch.tensor([0.8]))
    assert int(out.buffers[0]["n"]) == 7  # an integer buffer is no update
    assert clip_result(sent, ([start[0]], [start[1]]), [5.0]) is sent
    assert clip_result(sent, ([start[0]], [start[1]]), [None]) is sent


def test_clip_results_median_is_per_model_and_a_fixed_bound_streams():
    starts = ([{"w": torch.zeros(1)}, {"w": torch.ones(1)}], [{}, {}])
    norms = [(1.0, 10.0), (2.0, 20.0), (1e4, 30.0)]
    results = [
        ClientResult(c, 1, [{"w": torch.tensor([a])}, {"w": torch.tensor([1.0 + b])}], [{}, {}])
        for c, (a, b) in enumerate(norms)
    ]
    out = list(clip_results(((r, starts) for r in results), "median"))
    first = [float(r.params[0]["w"]) for r in out]
    assert first == pytest.approx([1.0, 2.0, 2.0])  # the median of model 0's norms: 2
    second = [float(r.params[1]["w"]) - 1 for r in out]
    assert second == pytest.approx([10.0, 20.0, 20.0])  # of model 1's: 20
    taken = []

    def lazily():
        for r in results:
            taken.append(r.cid)
            yield r, starts

    stream = clip_results(lazily(), 1.5)
    first = next(stream)
    assert taken == [0] and float(first.params[0]["w"]) == 1.0  # one result in, one out
    assert [float(r.params[0]["w"]) for r in stream] == pytest.approx([1.5, 1.5])


@pytest.mark.parametrize("value", [0, -1.0, "mean", True, float("nan"), float("inf"), [1]])
def test_an_invalid_rule_is_one_config_error(tmp_path, value):
    with pytest.raises(ConfigError, match=r"train\.clip_updates: .* no clipping rule; use null"):
        validate_config(tiny_config(tmp_path, train__clip_updates=value))


def test_the_default_is_off_and_numbers_and_median_are_rules(tmp_path):
    assert validate_config(tiny_config(tmp_path)).train.clip_updates is None
    for value in (0.5, 3, "median"):
        cfg = validate_config(tiny_config(tmp_path, train__clip_updates=value))
        assert cfg.train.clip_updates == value


# ---------------------------------------------------------------------- every algorithm
def _setup(tmp_path, name, rounds=1, **over):
    params = PARAMS.get(name, {})
    raw = tiny_config(tmp_path, algorithm={"name": name, "params": params}, train__rounds=rounds)
    raw["eval"] = {"every": rounds, "train_metrics": False}
    raw["train"].update(over)
    cfg = validate_config(raw)
    data = build_scenario(cfg.scenario, cfg.seed)
    return cfg, data, make_algorithm(cfg, data, CPU)


def _aggregate_moves(tmp_path, name, clip, hostile=(0,), scale=1e4):
    """One round with clients ``hostile`` sending their update times ``scale``: per averaged
    model, how far ``aggregate`` moved it (params and float buffers, one L2 norm), and the
    run's final server state."""
    cfg, data, algo = _setup(tmp_path, name, clip_updates=clip)
    make_hostile(algo, set(hostile), scale)
    moves: list[float] = []
    real = algo.aggregate

    def aggregate(server, results, ctx):
        new = real(server, results, ctx)
        moves.extend(_distances(name, averaged_with_buffers(new), averaged_with_buffers(server)))
        return new

    algo.aggregate = aggregate
    state = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    return moves, state.server


def _distances(name, models, others) -> list[float]:
    """Per model index, the L2 distance of ``models[k]`` from ``others[k]`` (params and float
    buffers together, without the tensors the algorithm sets from uploads)."""
    skip = FROM_UPLOADS.get(name, set())
    out = []
    for (p1, b1), (p0, b0) in zip(models, others, strict=False):
        b1 = {k: v for k, v in b1.items() if k not in skip}
        out.append(update_norm(update_delta(p1, p0), update_delta(b1, b0)))
    return out


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", algorithm_names())
def test_a_hostile_update_moves_every_averaged_model_at_most_the_bound(tmp_path, name):
    """Client 0 sends its update times 1e4: clipped to BOUND, no averaged model of the
    aggregate moves further than BOUND (times NOT_AN_AVERAGE's factor); unclipped, the
    aggregate moves far beyond it."""
    moves, _ = _aggregate_moves(tmp_path / "on", name, BOUND)
    if name in NOT_AVERAGING:
        assert moves == []
        return
    assert moves, f"{name}: no averaged model in the server state"
    if name in INFLUENCE_ONLY:
        _, with_it = _aggregate_moves(tmp_path / "with", name, BOUND)
        _, without = _aggregate_moves(tmp_path / "without", name, BOUND, hostile=())
        gaps = _distances(name, averaged_with_buffers(with_it), averaged_with_buffers(without))
        assert max(gaps) <= 2 * BOUND, f"{name}: the hostile client moved it {max(gaps):.4g}"
        return
    limit = BOUND * NOT_AN_AVERAGE.get(name, 1.0) * (1 + 1e-4)
    assert max(moves) <= limit, f"{name}: the aggregate moved {max(moves):.4g} > {limit:.4g}"
    unclipped, _ = _aggregate_moves(tmp_path / "off", name, None)
    assert max(unclipped) > 100 * BOUND, f"{name}: the hostile client moved nothing"


@pytest.mark.parametrize("name", ["fedavg", "ifca", "fedrc", "fedbn", "ditto", "scaffold"])
def test_a_bound_never_reached_changes_nothing(tmp_path, name):
    """Off (the default) and a bound no update reaches give the same server state, bit for
    bit: a result within the bound is passed on as it is."""
    _, off = _aggregate_moves(tmp_path / "off", name, None, hostile=())
    _, huge = _aggregate_moves(tmp_path / "huge", name, 1e30, hostile=())
    assert _same(off, huge)


def test_off_the_results_reach_aggregate_as_shared_result_made_them(tmp_path):
    cfg, data, algo = _setup(tmp_path, "fedavg")
    made, seen = [], []
    real_share, real_agg = algo.shared_result, algo.aggregate

    def shared_result(task, result):
        made.append(real_share(task, result))
        return made[-1]

    def aggregate(server, results, ctx):
        rs = list(results)
        seen.extend(rs)
        return real_agg(server, iter(rs), ctx)

    algo.shared_result, algo.aggregate = shared_result, aggregate
    Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    assert len(seen) == 6 and all(a is b for a, b in zip(made, seen, strict=True))


# ---------------------------------------------------------------------- a tiny run
def _final_acc(tmp_path, clip, hostile):
    cfg, data, algo = _setup(tmp_path, "fedavg", rounds=5, clip_updates=clip)
    make_hostile(algo, set(hostile), 1e4)
    state = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run()
    return state.history[-1]["local_acc"]


def test_median_clipping_keeps_a_run_with_a_hostile_client_near_the_honest_one(tmp_path):
    """Six clients, one sending its update times 1e4: clipped to the round's median norm
    the run ends within a few points of the honest run; unclipped it diverges."""
    honest = _final_acc(tmp_path / "honest", None, ())
    clipped = _final_acc(tmp_path / "clipped", "median", (0,))
    assert math.isfinite(clipped) and clipped >= honest - 5.0, (honest, clipped)
    with pytest.raises(DivergedError):
        _final_acc(tmp_path / "unclipped", None, (0,))


def test_where_the_tasks_are_unknown_the_start_is_the_nearest_model_the_server_sent():
    """A deployment's server: each shared model is measured from the nearest model of the
    server state with its names and shapes; a model within the bound of its true start is
    within the bound of the nearest too (so it passes as it is)."""
    a, b = {"w": torch.zeros(3)}, {"w": torch.full((3,), 10.0)}
    server = {"models": [a, b], "c": {"w": torch.zeros(2)}, "t": 3, "bn": [{"m": torch.ones(1)}]}
    r = ClientResult(
        0, 1, params=[{"w": torch.full((3,), 9.0)}, {}], buffers=[{"m": 2 * torch.ones(1)}, {}]
    )
    params, buffers = nearest_origins(r, server)
    assert params[0] is b and params[1] == {} and buffers[0] is server["bn"][0]
    (kept,) = clip_results([(r, (params, buffers))], 2.5)  # its update from b: norm 2
    assert kept is r
    (cut,) = clip_results([(r, (params, buffers))], 1.0)
    assert torch.allclose(cut.params[0]["w"], torch.full((3,), 10.0 - 0.5))  # 1/2 of the way
    far = ClientResult(0, 1, params=[{"w": torch.full((3,), -300.0)}], buffers=[{}])
    (clipped,) = clip_results([(far, nearest_origins(far, server))], 1.0)
    assert float(torch.linalg.vector_norm(clipped.params[0]["w"] - a["w"])) == pytest.approx(1.0)
