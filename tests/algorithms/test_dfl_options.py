"""DFL's read-outs and critic options (issue 41): ``mi_s_game`` is T_s's estimate as each
encoder step saw it, ``mi_s_refit`` a critic refitted on the features stage 1 saw (not the
stale ``mi_s``, read against the E_c after stage 2), the critics' warm-up, the concat critic
and CLUB, and the one invalid combination."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from fedshift.algorithms.base import RoundContext
from fedshift.algorithms.dfl import DFL, LOG4
from fedshift.algorithms.dfl_critics import critic_loss, estimate, refit_readout
from fedshift.algorithms.mi import club_estimate, jsd_mutual_information
from fedshift.core.errors import ConfigError
from fedshift.core.seeds import DFL_REFIT_STREAM, generator
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.models.two_branch import ClubCritic, ConcatCritic, make_critic
from fedshift.run.experiment import make_algorithm, sim_config
from tests.algorithms.conftest import dfl_config, dfl_setup, dfl_train
from tests.conftest import assert_close64, run_executors


def _strip(d, prefix):
    return {k[len(prefix) + 1 :]: v for k, v in d.items() if k.startswith(prefix + ".")}


# ---------------------------------------------------------------------- the read-outs
def test_mi_s_refit_reads_the_features_stage1_saw_not_the_stale_ones(tmp_path):
    """After both stages, E_c's weights and BatchNorm statistics have moved: ``mi_s`` reads T_s
    against that E_c, ``mi_s_refit`` against the received E_c stage 1 saw. It equals a refit
    done by hand on those features, and differs from the same refit on the post-stage-2 E_c."""
    params = {"mi_refit_steps": 30, "mi_refit_batch": 16, "mi_probe_samples": 40}
    _, data, algo, server = dfl_setup(tmp_path, params)
    view = client_data(data, data.clients[0])
    task = algo.client_task(server, {}, view, RoundContext(3, (0,)))
    r = dfl_train(algo, task, view)
    p, b = r.params[0], r.buffers[0]
    moved = [k for k in b if k.startswith("inv.") and not torch.equal(b[k], task.buffers[0][k])]
    assert moved  # stage 2 moved E_c's BatchNorm statistics

    def by_hand(e_c):
        def feats(idx):
            x = view.inputs(idx)
            e_s = (_strip(p, "spec"), _strip(b, "spec"))
            return algo._frozen(*e_s, x), algo._frozen(*e_c, x)

        with torch.no_grad():
            held, fit = feats(view.train_idx[:40]), feats(view.train_idx[40:])
        gen = generator(algo.seed, DFL_REFIT_STREAM, 3, view.cid)
        critic = algo.ops.module.critic_s
        return refit_readout(critic, _strip(p, "critic_s"), "jsd", fit, held, 30, 16, 1e-3, gen)

    received = (_strip(task.params[0], "inv"), _strip(task.buffers[0], "inv"))
    after_stage2 = (_strip(p, "inv"), _strip(b, "inv"))
    up = r.upload
    assert up["mi_s_refit"] == pytest.approx(by_hand(received), abs=1e-6)
    assert abs(up["mi_s_refit"] - by_hand(after_stage2)) > 1e-4
    assert abs(up["mi_s"] - up["mi_s_refit"]) > 1e-3 and abs(up["mi_s"] - up["mi_s_game"]) > 1e-3
    assert up["mi_s_game"] <= LOG4 and up["mi_s_refit"] <= LOG4


def test_mi_s_game_is_the_critics_estimate_right_before_each_encoder_step(tmp_path):
    """The mean over stage 1's steps of T_s's estimate (+ log 4) on each batch, with T_s after
    its steps on it and E_s before its own step: recomputed here at every step."""
    algo, view, task = _task(tmp_path, {"critic_steps": 2, "critic_warmup_steps": 2})
    seen: list[float] = []
    orig = algo.specific_loss

    def spy(params, buffers, batch, extras):
        p = params[0]
        with torch.no_grad():
            scratch = {k: v.clone() for k, v in buffers[0].items()}
            zs, zc = algo._stage1_features(p, scratch, batch.x)
            est = jsd_mutual_information(algo.ops.call("critic_s", p, {}, zs, zc))
            seen.append(float(est) + LOG4)
        return orig(params, buffers, batch, extras)

    algo.specific_loss = spy
    r = dfl_train(algo, task, view, (replace(task.phases[0], steps=4),))
    assert len(seen) == 4
    assert r.upload["mi_s_game"] == pytest.approx(sum(seen) / 4, abs=1e-5)


def _task(tmp_path, params):
    _, data, algo, server = dfl_setup(tmp_path, params)
    view = client_data(data, data.clients[0])
    return algo, view, algo.client_task(server, {}, view, RoundContext(1, (0,)))


# ---------------------------------------------------------------------- warm-up
@pytest.mark.parametrize("executor", ["sequential", "vmap", "loop"])
def test_each_critic_takes_warmup_plus_k_steps_per_batch(tmp_path, executor):
    """Per stage and client: ``critic_warmup_steps + critic_steps * S`` critic steps (a
    vmapped chunk of two clients steps both at once), the encoders first stepping after the
    warm-up."""
    hp = {"critic_steps": 2, "critic_warmup_steps": 5, "specific_steps": 3, "invariant_steps": 2}
    cfg = dfl_config(tmp_path, hp, train__rounds=1, scenario__num_clients=2)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    calls = {"critic_s_loss": 0, "critic_c_loss": 0, "specific_loss": 0}
    order: list[str] = []
    for name in calls:
        orig = getattr(algo, name)

        def spy(*args, _name=name, _orig=orig):
            calls[_name] += 1
            order.append(_name)
            return _orig(*args)

        setattr(algo, name, spy)
    ex = (
        SequentialExecutor()
        if executor == "sequential"
        else BatchedExecutor(chunk_size=2, vectorize=executor)
    )
    Simulator(algo, data, sim_config(cfg), ex).run()
    clients = 1 if executor == "vmap" else 2  # calls per client, or per vmapped chunk
    assert calls["critic_s_loss"] == clients * (5 + 2 * 3)
    assert calls["critic_c_loss"] == clients * (5 + 2 * 2)
    assert order[:6] == ["critic_s_loss"] * 6 and order[7] == "specific_loss"


def test_warmup_moves_the_critic_before_the_first_encoder_step(tmp_path):
    """With ``critic_warmup_steps`` 4 the first encoder step sees a different critic than
    without (its per-batch step is taken either way), and nothing else has moved."""
    starts = []
    for warm in (0, 4):
        algo, view, task = _task(tmp_path / str(warm), {"critic_warmup_steps": warm})
        orig, first = algo.specific_loss, []

        def spy(params, buffers, batch, extras, orig=orig, first=first):
            if not first:
                first.append({k: v.detach().clone() for k, v in params[0].items()})
            return orig(params, buffers, batch, extras)

        algo.specific_loss = spy
        dfl_train(algo, task, view, (replace(task.phases[0], steps=1),))
        starts.append(first[0])
    (cold, warm), init = starts, task.params[0]
    # the first encoder step sees the critic after 4 more steps, the encoders not yet moved
    assert any(not torch.equal(warm[k], cold[k]) for k in warm if k.startswith("critic_s."))
    for first in (cold, warm):
        assert all(torch.equal(first[k], init[k]) for k in first if not k.startswith("critic_"))


# ---------------------------------------------------------------------- concat critic, CLUB
def _fitted(kind: str, dependent: bool, steps: int = 300) -> float:
    """A critic of ``kind`` fitted on 4-d features (b = a + small noise, or b independent),
    then its estimate read on fresh batches."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    critic = make_critic(kind, 4, 4, hidden=64, out=16, normalise=False)
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    est = "club" if kind == "club" else "jsd"

    def batch():
        a = torch.randn(64, 4, generator=g)
        noise = torch.randn(64, 4, generator=g)
        return a, (a + 0.3 * noise) if dependent else noise

    for _ in range(steps):
        loss = critic_loss(est, critic(*batch()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(sum(estimate(est, critic(*batch())) for _ in range(5)) / 5)


@pytest.mark.parametrize("kind", ["concat", "club"])
def test_concat_and_club_separate_dependent_from_independent_features(kind):
    dep, ind = _fitted(kind, True), _fitted(kind, False)
    if kind == "concat":  # 2·JSD − log 4: about −log 4 when independent
        assert ind < -math.log(4) + 0.1 and dep > ind + 0.8
    else:  # CLUB in nats: about 0 when independent, ~ I = 4·½·log(1 + 1/0.09) ≈ 5 here
        assert abs(ind) < 0.2 and dep > 2.0


def test_critic_shapes_and_clubs_log_density_by_hand():
    torch.manual_seed(0)
    a, b = torch.randn(5, 6), torch.randn(5, 3)
    for cls in (ConcatCritic, ClubCritic):
        assert cls(6, 3, 16, 4)(a, b).shape == (5, 5)
    club = ClubCritic(6, 3, 16, 4)
    mu, logvar = club.mu(a), club.logvar(a)
    normal = torch.distributions.Normal(mu[:, None, :], (0.5 * logvar).exp()[:, None, :])
    const = 0.5 * 3 * math.log(2 * math.pi)
    torch.testing.assert_close(club(a, b), normal.log_prob(b[None]).sum(-1) + const)
    # the concat critic scores pair (i, j) as the MLP of [a_i; b_j]
    cat = ConcatCritic(6, 3, 16, 4)
    w = torch.cat([cat.first_a.weight, cat.first_b.weight], 1)
    pair = torch.nn.functional.linear(torch.cat([a[1], b[3]]), w, cat.first_a.bias)
    torch.testing.assert_close(cat(a, b)[1, 3], cat.rest(pair).squeeze())
    # CLUB's estimate by hand, and a padded sample changes nothing
    m = torch.tensor([[1.0, 2.0], [0.5, 3.0]])
    assert float(club_estimate(m)) == pytest.approx((1 + 3) / 2 - (1 + 2 + 0.5 + 3) / 4)
    padded = torch.tensor([[1.0, 2.0, 9.0], [0.5, 3.0, 9.0], [9.0, 9.0, 9.0]])
    masked = club_estimate(padded, torch.tensor([1.0, 1.0, 0.0]))
    assert float(masked) == pytest.approx(float(club_estimate(m)))


def test_club_with_the_confusion_term_is_one_config_error():
    with pytest.raises(ConfigError, match="mi_estimator_s: .*minimax"):
        DFL.parse_params({"mi_estimator_s": "club", "mi_minimisation": "confusion"})
    hp = DFL.parse_params({"mi_estimator_s": "club", "critic_kind": "concat"})
    assert hp.critic_kind == "concat"  # T_c is then a concat JSD critic, T_s CLUB's q


@pytest.mark.parametrize(
    "params",
    [
        {"critic_kind": "concat", "critic_warmup_steps": 3},
        {"mi_estimator_s": "club", "critic_warmup_steps": 2, "critic_steps": 2},
    ],
    ids=["concat", "club"],
)
def test_options_give_the_same_numbers_on_both_executors(tmp_path, params):
    """In float64: in float32 an AVX2 machine saw these weights differ by 1.06e-4 (see
    F64_ATOL in fedshift/testing.py)."""
    cfg = dfl_config(
        tmp_path,
        {**params, "mi_refit_steps": 5},
        train__participation=0.5,
        scenario__train_fraction_of_dataset=0.3,  # the executors agree on any size: small
    )
    kind = params.get("mi_estimator_s", "jsd")
    built = []

    class Spy:  # records the algorithm each run built
        def on_start(self, sim, state) -> None:
            built.append(sim.algo)

        def on_round_end(self, sim, state, metrics) -> None: ...

        def on_end(self, sim, state) -> None: ...

    ex = (SequentialExecutor(), BatchedExecutor(chunk_size=2, vectorize="vmap"))
    seq, bat = run_executors(cfg, ex, callbacks=[Spy()])
    for algo in built:
        critic = type(algo.ops.module.critic_s).__name__
        assert critic == ("ClubCritic" if kind == "club" else "ConcatCritic")
    for k, v in seq.server["params"].items():
        assert_close64(bat.server["params"][k], v, k)
    for key in ("mi_s", "mi_c", "mi_s_game", "mi_s_refit"):
        assert_close64(bat.server["mi"][key], seq.server["mi"][key], key)
