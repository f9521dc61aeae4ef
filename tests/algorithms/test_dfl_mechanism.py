"""DFL's mechanism, each part checked in the direction the paper gives it: the critics ascend
their estimates under the method's own optimiser (their Adam steps inside the stage), E_s
descends Î(E_s; E_c), E_c ascends Î(E_c; E_c^G) against the *received global* extractor, what
each aggregation mode averages and which extractor each evaluation mode scores with. Each test
here fails on a one-line mutation of ``dfl.py`` that the stage and pipeline tests let through
(a flipped sign, E_c in place of E_c^G, a mode made a no-op)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from fedshift.algorithms.base import Batch, RoundContext, loss_and_values
from fedshift.algorithms.dfl import LOG4, critic_confusion, jsd_mutual_information
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.simulator import Simulator
from fedshift.run.experiment import make_algorithm, sim_config
from tests.algorithms.conftest import dfl_config, dfl_one_round, dfl_setup, dfl_train


def _client(tmp_path, params=None):
    """Algorithm, server, client 0's view, its round-1 task and one training batch."""
    _, data, algo, server = dfl_setup(tmp_path, params)
    view = client_data(data, data.clients[0])
    task = algo.client_task(server, {}, view, RoundContext(1, (0,)))
    idx = view.train_idx[:32]
    batch = Batch(x=view.inputs(idx), y=view.y_train[:32], pos=torch.arange(32))
    algo.ops.module.train()
    return algo, server, view, task, batch


def _grad(algo, loss_name, params, buffers, batch, extras, prefix):
    """The gradient of a stage loss with respect to the entries under ``prefix``."""
    p = {k: v.detach().clone().requires_grad_(k.startswith(prefix)) for k, v in params.items()}
    b = {k: v.clone() for k, v in buffers.items()}
    loss, _ = loss_and_values(getattr(algo, loss_name)([p], [b], batch, extras))
    names = [k for k in p if k.startswith(prefix)]
    grads = torch.autograd.grad(loss, [p[k] for k in names], allow_unused=True)
    return {
        k: torch.zeros_like(p[k]) if g is None else g for k, g in zip(names, grads, strict=True)
    }


def _mi_grad(algo, task, batch, params, loss_name, prefix, beta_key):
    """The MI term's part of a stage's gradient on ``prefix``: with its β minus without."""
    args = (params, task.buffers[0], batch, task.extras, prefix)
    full = _grad(algo, loss_name, *args)
    hp = algo.hp
    algo.hp = hp.model_copy(update={beta_key: 0.0})
    try:
        rest = _grad(algo, loss_name, *args)
    finally:
        algo.hp = hp
    return {k: full[k] - rest[k] for k in full}


def _descend(params, direction, size=1e-3):
    """``params`` moved a small step (of norm ``size``) against ``direction``."""
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in direction.values()))
    lr = size / max(norm, 1e-12)
    return {k: (v - lr * direction[k]) if k in direction else v for k, v in params.items()}


def _sharp_critics(params, factor=2.0):
    """The same network with its critics' weights scaled up (a random critic is almost flat)."""
    return {k: v * factor if k.startswith("critic_") else v for k, v in params.items()}


@pytest.mark.parametrize("mode", ["confusion", "minimax"])
def test_specific_extractor_descends_its_mi_term(tmp_path, mode):
    """A small step of E_s along the MI part of its stage-1 gradient lowers the term: the
    confusion term (default) or Î(E_s; E_c) itself (minimax)."""
    algo, _, _, task, batch = _client(tmp_path, {"mi_minimisation": mode, "lam": 0.0})
    p = _sharp_critics(task.params[0])

    def term(params):
        buf = {k: v.clone() for k, v in task.buffers[0].items()}
        zs, zc = algo._stage1_features(params, buf, batch.x)
        s = algo.ops.call("critic_s", params, {}, zs, zc)
        return float(critic_confusion(s) if mode == "confusion" else jsd_mutual_information(s))

    d = _mi_grad(algo, task, batch, p, "specific_loss", "spec.", "beta_s")
    assert max(float(v.abs().max()) for v in d.values()) > 0
    assert term(_descend(p, d)) < term(p)


def test_invariant_extractor_ascends_mi_with_the_received_global_extractor(tmp_path):
    """Stage 2's MI term is −β_c·Î(E_c; E_c^G) with E_c^G the server's extractor (not the
    client's own E_c), and a step of E_c along its gradient raises that estimate."""
    algo, server, _, task, batch = _client(tmp_path, {"lam": 0.0})
    g = torch.Generator().manual_seed(0)
    # the client's E_c has moved away from the received one (as it does within stage 2)
    p = {
        k: v + 0.05 * torch.randn(v.shape, generator=g) if k.startswith("inv.") else v
        for k, v in _sharp_critics(task.params[0]).items()
    }
    # fresh buffers for every call: the received E_c^G's statistics are the task's own
    buf = task.buffers[0]

    def fresh():
        return {k: v.clone() for k, v in buf.items()}

    def estimate(params, target):
        zc = algo.ops.call("inv", params, fresh(), batch.x)
        return jsd_mutual_information(algo.ops.call("critic_c", params, {}, zc, target))

    zg = algo._frozen(*task.extras["global_inv"], batch.x)
    with torch.no_grad():
        with_term = algo.invariant_loss([p], [fresh()], batch, task.extras)
        hp, algo.hp = algo.hp, algo.hp.model_copy(update={"beta_c": 0.0})
        without = algo.invariant_loss([p], [fresh()], batch, task.extras)
        algo.hp = hp
        expected = -float(estimate(p, zg))
        critic_side = float(algo.critic_c_loss([p], [fresh()], batch, task.extras))
    assert float(with_term - without) == pytest.approx(expected, abs=1e-4)
    assert critic_side == pytest.approx(expected, abs=1e-4)  # T_c reads E_c^G as well
    own = algo._frozen(
        *[{k[4:]: v for k, v in d.items() if k.startswith("inv.")} for d in (p, buf)], batch.x
    )
    assert abs(float(estimate(p, own)) + expected) > 1e-3  # E_c in its place would differ

    d = _mi_grad(algo, task, batch, p, "invariant_loss", "inv.", "beta_c")
    with torch.no_grad():
        assert float(estimate(_descend(p, d), zg)) > float(estimate(p, zg))


@pytest.mark.parametrize(("stage", "key"), [(0, "mi_s"), (1, "mi_c")])
def test_each_critic_learns_its_estimate_under_the_methods_own_optimiser(tmp_path, stage, key):
    """One stage run by the executor as the method trains (the critic's Adam steps on each
    batch, then the encoders' step): the critic's estimate of its pair of features rises well
    above the independence value it starts at (E_s and E_c of one image are dependent at
    the start, E_c and E_c^G identical)."""
    algo, _, view, task, _ = _client(tmp_path, {"lam": 0.0, "critic_steps": 2})
    before = algo.upload(task, task.params, task.buffers, view)[key]
    phase = replace(task.phases[stage], steps=40)
    after = dfl_train(algo, task, view, (phase,)).upload[key]
    assert abs(before) < 0.1  # a fresh critic: about independence (0 after the log 4 shift)
    assert after > before + 0.15 and after <= math.log(4) + 1e-6


def test_the_critic_is_the_stage_adversary_and_only_it(tmp_path):
    algo, *_, task, _ = _client(tmp_path)
    s1, s2 = task.phases
    names = list(task.params[0])
    assert s1.adversary.loss == "critic_s_loss" and s2.adversary.loss == "critic_c_loss"
    assert set(s1.adversary.trained_names(0, names)) == {n for n in names if "critic_s." in n}
    assert not any(n.startswith("critic") for n in s1.trained_names(0, names))
    assert s1.adversary.optimizer == "adam" and s1.adversary.lr == algo.hp.critic_lr
    # no MI term, no critic to train
    algo0, *_, task0, _ = _client(tmp_path, {"beta_s": 0.0, "beta_c": 0.0})
    assert task0.phases[0].adversary is None and task0.phases[1].adversary is None


@pytest.mark.parametrize("aggregation", ["invariant", "all", "none"])
def test_what_each_aggregation_mode_averages(tmp_path, aggregation):
    _, data, algo, server = dfl_setup(tmp_path, {"aggregation": aggregation})
    results, new = dfl_one_round(algo, data, server)
    n = [r.num_samples for r in results]
    averaged = set()
    for k, v in new["params"].items():
        avg = (n[0] * results[0].params[0][k] + n[1] * results[1].params[0][k]) / sum(n)
        if torch.allclose(v, avg) and not torch.equal(v, server["params"][k]):
            averaged.add(k.split(".")[0])
    expected = {"invariant": {"inv"}, "all": {"inv", "spec", "head", "critic_s"}, "none": set()}
    assert expected[aggregation] <= averaged
    assert aggregation == "all" or averaged == expected[aggregation]
    if aggregation == "none":  # E_c^G is then the client's own start, not the (stale) server's
        own = {k: v + 1.0 for k, v in server["params"].items()}
        view = client_data(data, data.clients[0])
        task = algo.client_task(
            new, {"params": own, "buffers": server["buffers"]}, view, RoundContext(2, (0,))
        )
        assert torch.equal(task.extras["global_inv"][0]["0.weight"], own["inv.0.weight"])


@pytest.mark.parametrize("mode", ["local", "global"])
def test_which_extractor_each_evaluation_mode_scores_with(tmp_path, mode):
    algo, server, view, task, _ = _client(tmp_path, {"eval_invariant": mode})
    own = {k: v + 1.0 for k, v in task.params[0].items()}  # differs from the server everywhere
    client = {"params": own, "buffers": task.buffers[0]}
    [(w, params, _)] = algo.mixture(server, client, view)
    for k, v in params.items():
        from_server = k.startswith("inv.") and mode == "global"
        assert torch.equal(v, server["params"][k] if from_server else own[k]), k


def test_runs_log_the_critics_estimates_every_evaluation(tmp_path):
    """Each round logs the mean of its clients' uploaded estimates, each one at most log 4 (the
    JSD estimate is at most 0 before the shift by log 4)."""
    cfg = dfl_config(tmp_path, train__participation=0.5)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    uploads: list[list[dict]] = []
    aggregate = algo.aggregate

    def spy(server, results, ctx):
        results = list(results)
        uploads.append([r.upload for r in results])
        return aggregate(server, iter(results), ctx)

    algo.aggregate = spy
    hist = Simulator(algo, data, sim_config(cfg), SequentialExecutor()).run().history
    assert len(hist) == len(uploads) == 2
    for h, ups in zip(hist, uploads, strict=True):
        assert len(ups) == 3  # participation 0.5 of 6 clients
        for key in ("mi_s", "mi_c"):
            values = [u[key] for u in ups]
            assert all(v <= LOG4 for v in values), (key, values)
            assert h[key] == pytest.approx(sum(values) / len(values)), (key, values)
    assert len({h["mi_c"] for h in hist}) == len(hist)  # a new estimate each round
