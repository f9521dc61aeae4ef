"""StoCFL: the merge rule, the representation, the proximal cluster loss and the server step,
each checked by hand on tiny tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import Batch, ClientData, ClientResult, ModelOps, RoundContext
from fedshift.algorithms.stocfl import (
    StoCFL,
    closest_cluster,
    merge_groups,
    representation,
)
from tests.conftest import RUN

CTX = RoundContext(1)


def ops() -> ModelOps:
    return ModelOps(lambda: nn.Linear(2, 3), torch.device("cpu"))


def algo(**hp) -> StoCFL:
    return StoCFL(StoCFL.Params(**hp), ops(), 3, **RUN)


def lin(w: float, b: float = 0.0) -> dict:
    return {"weight": torch.full((3, 2), w), "bias": torch.full((3,), b)}


def server_state(a: StoCFL) -> dict:
    return a.init_server_state([(lin(0.0), {})])


def result(cid: int, cluster_w: float, global_w: float, rep: list[float], n: int = 10):
    return ClientResult(
        cid, n, [lin(cluster_w), lin(global_w)], [{}, {}], {"rep": torch.tensor(rep)}
    )


# ---------------------------------------------------------------------- the merge rule
def test_merge_rule_by_hand_threshold_and_single_linkage():
    # cosines: (0,1) = 0.994, (0,2) = 0, (1,2) = 0.110, (0,3) = -0.981, (2,3) = 0.196
    reps = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.2]])
    assert merge_groups(reps, 0.5) == [[0, 1], [2], [3]]
    assert merge_groups(reps, 0.15) == [[0, 1], [2, 3]]  # cos(2, 3) = 0.196 >= 0.15
    assert merge_groups(reps, 0.2) == [[0, 1], [2], [3]]  # ... < 0.2
    assert merge_groups(reps, -1.0) == [[0, 1, 2, 3]]
    # a chain: cos(x, y) = cos(y, z) = 0.707 but cos(x, z) = 0; linked through y
    chain = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert merge_groups(chain, 0.7) == [[0, 1, 2]]
    assert merge_groups(chain, 0.71) == [[0], [1], [2]]
    # the cosine ignores the length
    assert merge_groups(torch.tensor([[1.0, 0.0], [100.0, 1.0]]), 0.99) == [[0, 1]]


def test_representation_is_anchor_minus_trained_and_closest_cluster():
    anchor = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[3.0]])}
    trained = {"a": torch.tensor([0.5, 2.5]), "b": torch.tensor([[1.0]])}
    torch.testing.assert_close(representation(anchor, trained), torch.tensor([0.5, -0.5, 2.0]))
    sums = [torch.tensor([2.0, 0.0]), torch.tensor([0.0, 3.0])]
    assert closest_cluster(torch.tensor([0.1, 1.0]), sums, [2, 3]) == 1
    assert closest_cluster(torch.tensor([1.0, 0.9]), sums, [2, 3]) == 0


# ---------------------------------------------------------------------- the local losses
def test_cluster_loss_is_ce_plus_half_lam_squared_distance_to_the_global_model():
    a = algo(lam=0.3)
    x = torch.tensor([[1.0, -1.0], [0.5, 2.0]])
    y = torch.tensor([2, 0])
    batch = Batch(x=x, y=y, pos=torch.arange(2))
    theta = {"weight": torch.tensor([[0.1, 0.2], [0.3, -0.4], [0.5, 0.0]]), "bias": torch.zeros(3)}
    theta = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
    omega = lin(0.25, 1.0)
    loss = a.cluster_loss([theta, lin(9.0)], [{}, {}], batch, {"global": omega})
    logits = x @ theta["weight"].detach().T
    ce = -torch.log_softmax(logits, 1)[torch.arange(2), y].mean()
    dist = ((theta["weight"].detach() - 0.25) ** 2).sum() + ((0 - 1.0) ** 2) * 3
    torch.testing.assert_close(loss.detach(), ce + 0.15 * dist)
    loss.backward()  # the prox gradient: lam (θ − ω)
    g_ce = torch.autograd.grad(
        F.cross_entropy(x @ theta["weight"].T + theta["bias"], y), theta["bias"]
    )[0]
    torch.testing.assert_close(theta["bias"].grad, g_ce + 0.3 * (0.0 - 1.0))
    # the global model (model 1) and the anchor (model 2) train on plain CE
    ce1 = a.global_loss([lin(0), theta, lin(0)], [{}, {}, {}], batch, {})
    torch.testing.assert_close(ce1.detach(), ce)
    torch.testing.assert_close(a.rep_loss([lin(0), lin(0), theta], [{}] * 3, batch, {}), ce1)


# ---------------------------------------------------------------------- the client task
def test_client_task_new_client_computes_psi_known_client_trains_its_cluster():
    a = algo(obep=4)
    s = server_state(a)
    s["params"] = lin(0.5)  # the global moved; the anchor did not
    data = ClientData(0, torch.arange(4), torch.tensor([0, 1, 2, 0]), lambda i: torch.zeros(4, 2))
    new = a.client_task(s, {"cid": 0}, data, CTX)
    assert [p.loss for p in new.phases] == ["rep_loss", "cluster_loss", "global_loss"]
    assert new.phases[0].trainable == ((2, None),) and new.phases[0].epochs == 4
    assert new.params[2] is s["anchor_params"] and new.params[0] is s["params"]
    s["models"] = [{"params": lin(7.0), "buffers": {}}]
    s["assign"] = {0: 0}
    known = a.client_task(s, {"cid": 0, "rep": torch.ones(3)}, data, CTX)
    assert len(known.params) == 2 and [p.loss for p in known.phases][0] == "cluster_loss"
    assert known.params[0] is s["models"][0]["params"] and known.params[1] is s["params"]
    assert known.extras["global"] is s["params"]
    # its stored ψ goes up again; a new client's ψ is the anchor's movement
    assert a.upload(known, known.params, known.buffers, data)["rep"].tolist() == [1.0] * 3
    trained = [lin(0), lin(0), lin(-1.0, 2.0)]
    rep = a.upload(new, trained, new.buffers, data)["rep"]
    torch.testing.assert_close(rep, torch.tensor([1.0] * 6 + [-2.0] * 3))


# ---------------------------------------------------------------------- the server step
def test_aggregate_by_hand_merges_averages_and_renumbers():
    a = algo(tau=0.5)
    s = server_state(a)
    s["params"] = lin(1.0)
    s["models"] = [{"params": lin(5.0), "buffers": {}}, {"params": lin(6.0), "buffers": {}}]
    s["assign"] = {10: 0, 11: 1}
    s["rep_sum"], s["rep_count"] = [torch.tensor([0.0, 2.0]), torch.tensor([3.0, 0.0])], [2, 1]
    results = [
        result(11, 2.0, 10.0, [1.0, 0.1]),  # cluster 1 (rep only sent)
        result(1, 4.0, 20.0, [2.0, 0.0]),  # new: joins cluster 1 (cos 0.995)
        result(2, 9.0, 30.0, [-1.0, 0.0], n=30),  # new, alone
    ]
    new = a.aggregate(s, iter(results), CTX)
    # cluster 0 (not sampled) keeps its model; clusters 1 + new(1) merge; new(2) alone
    assert new["assign"] == {10: 0, 11: 1, 1: 1, 2: 2}
    assert len(new["models"]) == 3
    torch.testing.assert_close(new["models"][0]["params"], lin(5.0))
    torch.testing.assert_close(new["models"][1]["params"], lin(3.0))  # uniform (2 + 4) / 2
    torch.testing.assert_close(new["models"][2]["params"], lin(9.0))
    torch.testing.assert_close(new["params"], lin(20.0))  # ω: mean of the trained globals
    torch.testing.assert_close(new["rep_sum"][1], torch.tensor([5.0, 0.0]))
    assert new["rep_count"] == [2, 2, 1]
    assert new["anchor_params"] is s["anchor_params"]
    # sample weights
    b = algo(tau=0.5, weighting="samples").aggregate(s, iter(results), CTX)
    torch.testing.assert_close(b["params"], lin((100 + 200 + 900) / 50))
    # a merge that empties a lower-numbered cluster renumbers the rest
    s2 = {**s, "assign": {10: 0, 11: 1, 12: 2}, "models": s["models"] + [s["models"][1]]}
    s2["rep_sum"], s2["rep_count"] = s["rep_sum"] + [torch.zeros(2)], [2, 1, 1]
    out = a.aggregate(
        s2, iter([result(10, 1.0, 0.0, [0.0, 1.0]), result(12, 3.0, 0.0, [0.1, 1.0])]), CTX
    )
    assert out["assign"] == {10: 0, 11: 1, 12: 0} and len(out["models"]) == 2
    torch.testing.assert_close(out["models"][0]["params"], lin(2.0))
    torch.testing.assert_close(out["models"][1]["params"], lin(6.0))
    assert out["rep_count"] == [3, 1]
    # a cluster is represented by the mean ψ of its sampled members: [1, 0] and [0, 1] give
    # [.5, .5], which matches [1, 1] (cos 1); either member alone would not (cos 0.707)
    s3 = {**s, "assign": {10: 0, 11: 0, 12: 1}, "models": s["models"]}
    s3["rep_sum"], s3["rep_count"] = [torch.zeros(2), torch.zeros(2)], [2, 1]
    both = [result(10, 1.0, 0, [1.0, 0.0]), result(11, 1.0, 0, [0.0, 1.0])]
    out = algo(tau=0.8).aggregate(s3, iter([*both, result(12, 4.0, 0, [1.0, 1.0])]), CTX)
    assert out["assign"] == {10: 0, 11: 0, 12: 0}
    torch.testing.assert_close(out["models"][0]["params"], lin(2.0))


def test_prediction_uses_the_assigned_cluster_else_the_global_model():
    a = algo()
    s = server_state(a)
    s["models"] = [{"params": lin(7.0), "buffers": {}}]
    s["assign"] = {3: 0}
    data = ClientData(3, torch.arange(1), torch.tensor([0]), lambda i: torch.zeros(1, 2))
    assert a.mixture(s, {"cid": 3}, data)[0][1] is s["models"][0]["params"]
    assert a.cluster_of(s, {"cid": 3}) == 0 and a.cluster_of(s, {"cid": 4}) is None
    assert a.mixture(s, {"cid": 4}, data)[0][1] is s["params"]
    assert a.fine_tune_task(s, {"cid": 3}, data) is None  # training clients: no tuning
