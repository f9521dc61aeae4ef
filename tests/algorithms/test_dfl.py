"""DFL: the JSD mutual-information estimate, the two-stage optimisation (what each stage may
change), invariant aggregation, private specific extractors, diversity transferring, the
ablation switches and the two executors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import RoundContext
from fedshift.algorithms.mi import critic_confusion, jsd_mutual_information
from fedshift.core.errors import FedshiftError
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.models.two_branch import PairHead, SeparableCritic, TwoBranchModel
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config
from tests.algorithms.conftest import dfl_config, dfl_one_round, dfl_setup, dfl_train
from tests.conftest import assert_history_same, assert_tree_close64, run_executors


# ---------------------------------------------------------------------- the MI estimate
def test_jsd_estimate_by_hand():
    s = torch.tensor([[2.0, -1.0], [0.5, 1.0]])
    sp = nn.functional.softplus
    expected = (
        -(sp(torch.tensor(-2.0)) + sp(torch.tensor(-1.0))) / 2
        - (sp(torch.tensor(-1.0)) + sp(torch.tensor(0.5))) / 2
    )
    assert float(jsd_mutual_information(s)) == pytest.approx(float(expected), rel=1e-6)
    # a padded third sample (mask 0) changes nothing
    padded = torch.tensor([[2.0, -1.0, 9.0], [0.5, 1.0, 9.0], [9.0, 9.0, 9.0]])
    masked = jsd_mutual_information(padded, torch.tensor([1.0, 1.0, 0.0]))
    assert float(masked) == pytest.approx(float(expected), rel=1e-6)


def _trained_estimate(dependent: bool, steps: int = 300) -> float:
    g = torch.Generator().manual_seed(0)
    critic = SeparableCritic(4, 4, hidden=64, out=16)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)

    def batch():
        a = torch.randn(128, 4, generator=g)
        noise = torch.randn(128, 4, generator=g)
        return a, (a + 0.3 * noise) if dependent else noise

    for _ in range(steps):
        a, b = batch()
        loss = -jsd_mutual_information(critic(a, b))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(sum(jsd_mutual_information(critic(*batch())) for _ in range(10)) / 10)


def test_jsd_estimate_separates_dependent_from_independent():
    dep, ind = _trained_estimate(True), _trained_estimate(False)
    # the estimate is 2·JSD − log 4: about −log 4 when independent, towards 0 when dependent
    assert ind < -math.log(4) + 0.1
    assert dep > ind + 0.8


def test_confusion_term_by_hand_and_bounded_where_the_estimate_is_not():
    sp = nn.functional.softplus
    s = torch.tensor([[2.0, -1.0], [0.5, 1.0]])

    def ce(v):
        return 0.5 * (sp(torch.tensor(v)) + sp(torch.tensor(-v))) - math.log(2)

    def expected(c=1.0):  # the diagonal (2, 1) and the off-diagonal (-1, 0.5) of c * s
        return float((ce(2.0 * c) + ce(1.0 * c)) / 2 + (ce(-1.0 * c) + ce(0.5 * c)) / 2)

    assert float(critic_confusion(s)) == pytest.approx(expected(), rel=1e-6)
    assert float(critic_confusion(torch.zeros(3, 3))) == pytest.approx(0.0, abs=1e-7)
    # an encoder that inflates the scores drives the minimax term to -inf, not this one
    for c in (1.0, 10.0, 1e3):
        scaled = (c * s).requires_grad_()
        critic_confusion(scaled).backward()
        # by hand: it grows like the mean |score| / 2 (about 1.12 c here), never below 0
        assert float(critic_confusion(c * s)) == pytest.approx(expected(c), rel=1e-5)
        assert float(scaled.grad.abs().max()) <= 0.5 + 1e-6
    assert float(jsd_mutual_information(1e3 * s)) < -100


def test_an_encoder_on_the_confusion_term_removes_the_dependence():
    """The min-max game of stage 1 on synthetic features: z_s starts as a copy of z_c; the
    critic ascends Î, the encoder descends the confusion term; a fresh critic trained on the
    final encoder then finds (almost) no dependence left."""
    g = torch.Generator().manual_seed(0)
    enc = nn.Linear(4, 4)
    nn.init.eye_(enc.weight), nn.init.zeros_(enc.bias)
    critic = SeparableCritic(4, 4, hidden=64, out=16)
    opt_e = torch.optim.Adam(enc.parameters(), lr=1e-2)
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)

    def estimate_of_a_fresh_critic() -> float:
        fresh = SeparableCritic(4, 4, hidden=64, out=16)
        opt = torch.optim.Adam(fresh.parameters(), lr=3e-3)
        for i in range(210):
            zc = torch.randn(64, 4, generator=g)
            zs = (enc(zc) + 0.3 * torch.randn(64, 4, generator=g)).detach()
            est = jsd_mutual_information(fresh(zs, zc))
            if i >= 200:  # the last 10 batches are the read-out
                vals.append(float(est.detach()))
                continue
            opt.zero_grad(), (-est).backward(), opt.step()
        return sum(vals[-10:]) / 10

    vals: list[float] = []
    before = estimate_of_a_fresh_critic()
    for _ in range(300):
        zc = torch.randn(64, 4, generator=g)
        zs = enc(zc) + 0.3 * torch.randn(64, 4, generator=g)
        loss_c = -jsd_mutual_information(critic(zs.detach(), zc))
        opt_c.zero_grad(), loss_c.backward(), opt_c.step()
        loss_e = critic_confusion(critic(zs, zc))
        opt_e.zero_grad(), loss_e.backward(), opt_e.step()
    after = estimate_of_a_fresh_critic()
    assert before > -math.log(4) + 0.5  # dependent at the start
    assert after < -math.log(4) + 0.15 and after < before - 0.4


def test_a_normalising_critic_does_not_scale_with_the_features():
    torch.manual_seed(0)
    a, b = torch.randn(8, 6), torch.randn(8, 6)
    plain, norm = SeparableCritic(6, 6, 16, 4), SeparableCritic(6, 6, 16, 4, normalise=True)
    torch.testing.assert_close(norm(50 * a, 0.1 * b), norm(a, b))
    assert not torch.allclose(plain(50 * a, b), plain(a, b))


# ---------------------------------------------------------------------- the model
def test_two_branch_model_shapes():
    from fedshift.models import build_model

    m = TwoBranchModel(build_model("convbn_cnn", 10, (3, 28, 28)))
    x = torch.randn(5, 3, 28, 28)
    feats, logits = m(x, return_features=True)
    assert feats.shape == (5, 2 * 1024) and logits.shape == (5, 10)
    # the specific branch is a fresh draw, not a copy of the invariant one
    assert not torch.equal(m.inv[0].weight, m.spec[0].weight)


def test_pair_head_is_the_head_of_the_concatenation_for_one_or_many_second_halves():
    """PairHead(a, b) = head([a; b]) with the widened first layer, for b [B, d] and for J
    alternatives b [J, B, d] (each as its own batch, BatchNorm heads too)."""
    torch.manual_seed(0)
    for head in (
        nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)),
        nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3)),
        nn.Linear(6, 3),
    ):
        pair = PairHead(head).train()
        w = torch.cat([pair.first_a.weight, pair.first_b.weight], dim=1)

        def whole(a, b, pair=pair, w=w):
            return pair.rest(F.linear(torch.cat([a, b], 1), w, pair.first_a.bias))

        a, b = torch.randn(4, 6), torch.randn(2, 4, 6)
        torch.testing.assert_close(pair(a, b[0]), whole(a, b[0]))
        torch.testing.assert_close(pair(a, b), torch.stack([whole(a, bj) for bj in b]))
    with pytest.raises(FedshiftError, match="linear head"):
        PairHead(nn.Sequential(nn.ReLU()))


def _changed(before, after, prefix):
    return [k for k in before if k.startswith(prefix) and not torch.equal(before[k], after[k])]


def test_stage1_leaves_invariant_branch_untouched_stage2_leaves_specific(tmp_path):
    _, data, algo, server = dfl_setup(tmp_path)
    view = client_data(data, data.clients[0])
    task = algo.client_task(server, {}, view, RoundContext(1, (0, 1)))
    p0, b0 = task.params[0], task.buffers[0]
    stage1, stage2 = task.phases
    r1 = dfl_train(algo, task, view, (stage1,))
    p1, b1 = r1.params[0], r1.buffers[0]
    assert not _changed(p0, p1, "inv.") and not _changed(b0, b1, "inv.")
    assert not _changed(p0, p1, "critic_c.")
    assert _changed(p0, p1, "spec.") and _changed(p0, p1, "head.") and _changed(p0, p1, "critic_s.")
    assert _changed(b0, b1, "spec.")  # E_s trains in train mode: its BN statistics move

    task2 = algo.client_task(server, {"params": p1, "buffers": b1}, view, RoundContext(1))
    r2 = dfl_train(algo, task2, view, (stage2,))
    p2, b2 = r2.params[0], r2.buffers[0]
    for prefix in ("spec.", "head.", "critic_s."):
        assert not _changed(p1, p2, prefix), prefix
    assert not _changed(b1, b2, "spec.")
    assert _changed(p1, p2, "inv.") and _changed(p1, p2, "critic_c.") and _changed(b1, b2, "inv.")


def test_classifier_in_stage2_option_trains_the_head(tmp_path):
    _, data, algo, server = dfl_setup(tmp_path, {"classifier_in_stage2": True})
    view = client_data(data, data.clients[0])
    task = algo.client_task(server, {}, view, RoundContext(1))
    r = dfl_train(algo, task, view, (task.phases[1],))
    assert _changed(task.params[0], r.params[0], "head.")


def test_server_averages_only_the_invariant_branch(tmp_path):
    _, data, algo, server = dfl_setup(tmp_path)
    results, new = dfl_one_round(algo, data, server)
    n = [r.num_samples for r in results]
    for k, v in new["params"].items():
        if k.startswith("inv."):
            avg = (n[0] * results[0].params[0][k] + n[1] * results[1].params[0][k]) / sum(n)
            torch.testing.assert_close(v, avg)
        else:  # E_s, P and the critics are never averaged: the server keeps the init
            assert torch.equal(v, server["params"][k]), k
    # each client's E_s is banked as it uploaded it, for the others' diversity transfer
    assert set(new["bank"]) == {0, 1}
    torch.testing.assert_close(new["bank"][1][0]["0.weight"], results[1].params[0]["spec.0.weight"])


def test_donors_are_other_sampled_clients_with_a_banked_specific_extractor(tmp_path):
    _, data, algo, server = dfl_setup(tmp_path, {"dt_num_donors": 2})
    spec = {k[5:]: v for k, v in server["params"].items() if k.startswith("spec.")}
    bspec = {k[5:]: v for k, v in server["buffers"].items() if k.startswith("spec.")}
    bank = {j: ({k: v + j for k, v in spec.items()}, bspec) for j in (1, 2, 3, 5)}
    server = {**server, "bank": bank}
    view = client_data(data, data.clients[0])
    task = algo.client_task(server, {}, view, RoundContext(3, (0, 1, 2, 4, 5)))
    # sampled and banked: 1, 2, 5 (4 has no E_s yet, 3 is not sampled); capped at 2
    assert task.extras["donor_weight"].tolist() == [1.0, 1.0]
    got = {
        round(float((w - spec["0.weight"]).mean())) for w in task.extras["donor_params"]["0.weight"]
    }
    assert got <= {1, 2, 5} and len(got) == 2
    # round 1: nobody is banked, one placeholder of weight 0
    task1 = algo.client_task({**server, "bank": {}}, {}, view, RoundContext(1, (0, 1)))
    assert task1.extras["donor_weight"].tolist() == [0.0]


def test_diversity_transfer_reaches_the_classifier_in_stage1(tmp_path):
    """With only the transfer term (λ=1, CE still on), a donor changes the stage-1 update."""
    _, data, algo, server = dfl_setup(tmp_path, {"beta_s": 0.0, "beta_c": 0.0})
    view = client_data(data, data.clients[0])
    spec = {k[5:]: v for k, v in server["params"].items() if k.startswith("spec.")}
    bspec = {k[5:]: v for k, v in server["buffers"].items() if k.startswith("spec.")}
    donor = ({k: torch.randn_like(v) for k, v in spec.items()}, bspec)
    with_donor = algo.client_task({**server, "bank": {1: donor}}, {}, view, RoundContext(2, (0, 1)))
    without = algo.client_task(server, {}, view, RoundContext(2, (0, 1)))
    a = dfl_train(algo, with_donor, view, (with_donor.phases[0],)).params[0]
    b = dfl_train(algo, without, view, (without.phases[0],)).params[0]
    assert _changed(a, b, "head.")


# ---------------------------------------------------------------------- whole runs
def test_specific_extractor_changes_only_through_own_training(tmp_path):
    cfg = dfl_config(tmp_path, train__rounds=3, train__participation=0.5)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    sim = Simulator(algo, data, sim_config(cfg), SequentialExecutor())
    seen: dict[int, list[tuple[int, torch.Tensor]]] = {}
    orig = algo.client_update

    def spy(server, client, task, result):
        start = task.params[0]["spec.0.weight"]
        seen.setdefault(result.cid, []).append((start, result.params[0]["spec.0.weight"]))
        return orig(server, client, task, result)

    algo.client_update = spy
    res = sim.run()
    init = res.server["params"]["spec.0.weight"]
    assert any(len(v) > 1 for v in seen.values())
    for cid, rounds in seen.items():
        assert torch.equal(rounds[0][0], init)  # first time: the shared init
        for (_, prev_end), (next_start, _) in zip(rounds, rounds[1:], strict=False):
            assert torch.equal(next_start, prev_end), cid  # then exactly its own last E_s
        assert torch.equal(res.clients[cid]["params"]["spec.0.weight"], rounds[-1][1])


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_batched_matches_sequential(tmp_path, vectorize):
    """In float64 (see F64_ATOL in fedshift/testing.py)."""
    cfg = dfl_config(tmp_path, train__rounds=2, train__participation=0.5)
    ex = (SequentialExecutor(), BatchedExecutor(chunk_size=2, vectorize=vectorize))
    seq, bat = run_executors(cfg, ex)
    assert seq.server["bank"], "round 2 had donors"
    assert_tree_close64(seq.server, bat.server, "server")
    assert_tree_close64(seq.clients, bat.clients, "clients")
    assert_history_same(seq, bat, ("local_acc",))


@pytest.mark.parametrize(
    "params",
    [{}, {"diversity": False}, {"aggregation": "all"}, {"eval_invariant": "global"}],
    ids=["dfl", "ia-only", "dt-only", "eval-global"],
)
def test_end_to_end_variants(tmp_path, params):
    cfg = dfl_config(
        tmp_path, params, train__participation=0.5, train__rounds=4, train__local_steps=10
    )
    res = run_experiment(cfg)
    last = res.history[-1]
    # each variant learns: the clients' accuracy rises above chance (10 digits) in 4 rounds
    assert last["local_acc"] > 20
    assert last["train_loss"] < math.log(10), last["train_loss"]  # below a uniform guess


def test_top5_protocol_averages_the_five_best_local_accuracies():
    from fedshift.reporting.protocols import select_round

    hist = [
        {"round": r, "local_acc": float(a), "gm": float(r)}
        for r, a in enumerate([10, 50, 40, 90, 80, 70, 60, 20], start=1)
    ]
    out = select_round(hist, "top5")
    assert out["local_acc"] == pytest.approx((90 + 80 + 70 + 60 + 50) / 5)
    assert out["gm"] == pytest.approx((4 + 5 + 6 + 7 + 2) / 5)  # the same five evaluations
    assert out["round"] == 4 and out["evaluations_averaged"] == 5
    assert select_round(hist[:2], "top5")["local_acc"] == pytest.approx(30.0)
