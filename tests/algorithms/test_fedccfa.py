"""FedCCFA: MADD and the class-level clustering, the alignment losses, the adaptive weight and
the server step, each checked by hand on tiny tensors."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.base import Batch, ClientData, ClientResult, ModelOps, RoundContext
from fedshift.algorithms.fedccfa import (
    FedCCFA,
    balanced_weights,
    class_clusters,
    contrastive_alignment,
    l2_alignment,
    label_entropy,
    madd,
    threshold_clusters,
)
from fedshift.models.base import SplitModel
from tests.conftest import RUN


def tiny_ops() -> ModelOps:
    """A 2-feature extractor and a 3-class linear head."""
    return ModelOps(lambda: SplitModel(nn.Linear(2, 2), nn.Linear(2, 3), 2, 3), torch.device("cpu"))


def algo(**hp) -> FedCCFA:
    return FedCCFA(FedCCFA.Params(**hp), tiny_ops(), 3, **RUN)


def cos(a, b) -> float:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float(a @ b / (a.norm() * b.norm()))


# ---------------------------------------------------------------------- clustering rule
def test_madd_by_hand():
    v = [[1.0, 0.0], [1.0, 0.2], [0.0, 1.0], [-1.0, 0.5]]
    d = madd(torch.tensor(v, dtype=torch.float64))
    for i in range(4):
        for j in range(4):
            others = [z for z in range(4) if z not in (i, j)]
            want = sum(abs(cos(v[i], v[z]) - cos(v[j], v[z])) for z in others) / 2
            assert abs(float(d[i, j]) - (want if i != j else 0.0)) < 1e-9
    # orthogonal vectors are all at MADD 0 from each other; an opposite one is at 2
    assert madd(torch.eye(3)).abs().max() < 1e-12
    opp = madd(torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]]))
    assert float(opp[0, 1]) == 0.0 and abs(float(opp[0, 3]) - 2.0) < 1e-12


def test_threshold_clusters_are_dbscan_min_samples_1():
    d = torch.tensor(
        [
            [0.0, 0.05, 0.3, 0.9],
            [0.05, 0.0, 0.1, 0.9],
            [0.3, 0.1, 0.0, 0.9],
            [0.9, 0.9, 0.9, 0.0],
        ]
    )
    assert threshold_clusters(d, 0.1) == [[0, 1, 2], [3]]  # d <= eps, chained through 1
    assert threshold_clusters(d, 0.09) == [[0, 1], [2], [3]]
    assert threshold_clusters(d, 0.01) == [[0], [1], [2], [3]]
    assert class_clusters(torch.ones(2, 3), 10.0) == [[0], [1]]  # MADD needs 3 clients


# ---------------------------------------------------------------------- alignment and weights
def test_contrastive_and_l2_alignment_by_hand():
    feats = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    anchors = torch.tensor([[2.0, 0.0], [5.0, 5.0], [0.0, 3.0]])
    mask = torch.tensor([1.0, 0.0, 1.0])  # class 1 has no anchor
    y = torch.tensor([0, 2])
    got = contrastive_alignment(feats, y, anchors, mask, tau=0.5)
    # sample 0: cos to a0 = 1, to a2 = 0; sample 1: 0.6 and 0.8; class 1 left out
    want0 = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0)))
    want1 = -math.log(math.exp(1.6) / (math.exp(1.2) + math.exp(1.6)))
    torch.testing.assert_close(got, torch.tensor([want0, want1]))
    # a sample of a class without anchor adds nothing
    assert float(contrastive_alignment(feats, torch.tensor([1, 1]), anchors, mask, 0.5).sum()) == 0
    l2 = l2_alignment(feats, y, anchors, mask)
    torch.testing.assert_close(l2, torch.tensor([(1 + 0) / 2, (0.36 + 2.2**2) / 2]))


def test_entropy_weight_balanced_weights_and_balanced_steps():
    assert abs(label_entropy(torch.tensor([2, 2, 0])) - math.log(2)) < 1e-12
    assert label_entropy(torch.tensor([5, 0, 0])) == 0.0
    w = balanced_weights(torch.tensor([0, 0, 0, 1]), 3)
    torch.testing.assert_close(w, torch.tensor([4 / 6, 4 / 6, 4 / 6, 2.0]))
    assert algo(balanced_epochs=5)._balanced_steps(torch.tensor([0, 0, 0, 1])) == 5
    big = torch.arange(3).repeat(100)  # 100 per class: 5 per class, 15 < 128: one batch
    assert algo(balanced_epochs=3)._balanced_steps(big) == 3


def test_rep_loss_is_ce_plus_adaptive_weight_times_alignment():
    a = algo(tau=0.2)
    p, b = a.ops.init(0)
    x = torch.tensor([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]])
    y = torch.tensor([0, 2, 2])
    anchors, mask = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.ones(3)
    extras = {"anchors": anchors, "mask": mask, "lam": torch.tensor(0.7)}
    loss = a.rep_loss([p], [b], Batch(x=x, y=y, pos=torch.arange(3)), extras)
    feats = x @ p["body.weight"].T + p["body.bias"]
    logits = feats @ p["head.weight"].T + p["head.bias"]
    ce = F.cross_entropy(logits, y)
    cosm = F.normalize(feats, dim=1) @ F.normalize(anchors, dim=1).T
    align = F.cross_entropy(cosm / 0.2, y)
    torch.testing.assert_close(loss, ce + 0.7 * align)


# ---------------------------------------------------------------------- the client task
def test_client_task_phases_and_adaptive_weight():
    a = algo(gamma=20.0, warmup_rounds=3)
    p, b = a.ops.init(0)
    server = {"params": p, "buffers": b, "heads": {}, "anchors": {}}
    y = torch.tensor([0, 0, 1, 2])
    data = ClientData(7, torch.arange(4), y, lambda i: torch.zeros(len(i), 2))
    new = a.client_task(server, {}, data, RoundContext(5))
    assert [ph.loss for ph in new.phases] == ["balanced_loss", "clf_loss", "rep_loss"]
    assert new.phases[0].trainable == ((1, ("head.weight", "head.bias")),)
    assert new.phases[0].steps == 5 and new.phases[0].lr == 0.1
    assert new.phases[2].trainable == ((0, ("body.weight", "body.bias")),)
    assert float(new.extras["lam"]) == 0.0  # no anchors yet
    assert new.params[1] is p  # the balanced classifier starts from the server's classifier
    head = {"head.weight": torch.ones(3, 2), "head.bias": torch.zeros(3)}
    server["heads"][7] = head
    server["anchors"][7] = {"protos": torch.ones(3, 2), "mask": torch.ones(3)}
    known = a.client_task(server, {}, data, RoundContext(4))  # round 4 > warmup 3
    assert known.params[0]["head.weight"] is head["head.weight"]
    assert known.params[0]["body.weight"] is p["body.weight"]
    h = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert abs(float(known.extras["lam"]) - h / 20.0) < 1e-6
    assert float(a.client_task(server, {}, data, RoundContext(3)).extras["lam"]) == 0.0
    fixed = algo(gamma=0.0, lam=0.3, warmup_rounds=0).client_task(server, {}, data, RoundContext(1))
    assert abs(float(fixed.extras["lam"]) - 0.3) < 1e-6


# ---------------------------------------------------------------------- the server step
def head(rows: list[list[float]], bias: list[float]) -> dict:
    return {"head.weight": torch.tensor(rows), "head.bias": torch.tensor(bias)}


def client(cid, bal_rows, trained_rows, protos, counts, body=0.0, n=10):
    """A result whose balanced classifier has class vectors ``bal_rows`` (bias 0) and whose
    trained classifier has weight rows ``trained_rows`` (bias = cid)."""
    p = {"body.weight": torch.full((2, 2), float(body)), "body.bias": torch.zeros(2)}
    p.update(head(trained_rows, [float(cid)] * 3))
    bal = torch.cat([torch.tensor(bal_rows), torch.zeros(3, 1)], dim=1)
    upload = {"bal": bal, "protos": torch.tensor(protos), "counts": torch.tensor(counts)}
    return ClientResult(cid, n, [p], [{}], upload)


def test_server_clusters_each_class_and_averages_rows_and_anchors_by_hand():
    a = algo(eps=0.1)
    # class 0: {0, 1} vs {2, 3}; class 1: all alike; class 2: 3 is opposite the others
    bal = [
        [[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]],
        [[1.0, 0.01], [1.0, 1.0], [1.0, 0.0]],
        [[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]],
        [[0.01, 1.0], [1.0, 1.0], [-1.0, 0.0]],
    ]
    counts = [[1.0, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 1]]  # 2 lacks class 2, 3 class 1
    results = [
        client(
            i,
            bal[i],
            [[float(i), -float(i)]] * 3,
            [[10.0 * i, c] for c in range(3)],
            counts[i],
            body=i,
            n=30 if i == 3 else 10,
        )
        for i in range(4)
    ]
    p0, b0 = a.ops.init(0)
    server = {"params": p0, "buffers": b0, "heads": {9: "kept"}, "anchors": {}}
    new = a.aggregate(server, iter(results), RoundContext(1))
    # the extractor: sample-weighted mean (0 + 10 + 20 + 3 * 30) / 60; the server's
    # classifier stays the initial one
    torch.testing.assert_close(new["params"]["body.weight"], torch.full((2, 2), 2.0))
    assert new["params"]["head.weight"] is p0["head.weight"]
    H = new["heads"]
    assert H[9] == "kept"
    # class 0: trained rows of {0, 1} -> (0.5, -0.5), of {2, 3} -> (2.5, -2.5); biases too
    for cid, want in [(0, 0.5), (1, 0.5), (2, 2.5), (3, 2.5)]:
        torch.testing.assert_close(H[cid]["head.weight"][0], torch.tensor([want, -want]))
        assert float(H[cid]["head.bias"][0]) == want
    # class 1: one cluster of all four; class 2: {0, 1, 2} and 3 alone (keeps its own row)
    for cid in range(4):
        torch.testing.assert_close(H[cid]["head.weight"][1], torch.tensor([1.5, -1.5]))
    for cid in range(3):
        torch.testing.assert_close(H[cid]["head.weight"][2], torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(H[3]["head.weight"][2], torch.tensor([3.0, -3.0]))
    A = new["anchors"]
    # anchors: the members' prototypes of the class, over the members that hold it
    torch.testing.assert_close(A[1]["protos"][0], torch.tensor([5.0, 0.0]))  # (0 + 10) / 2
    torch.testing.assert_close(A[3]["protos"][0], torch.tensor([25.0, 0.0]))
    torch.testing.assert_close(A[3]["protos"][1], torch.tensor([10.0, 1.0]))  # 0, 1, 2 only
    torch.testing.assert_close(A[2]["protos"][2], torch.tensor([5.0, 2.0]))  # 0, 1 only
    assert A[2]["mask"].tolist() == [1.0, 1.0, 1.0]  # it receives its cluster's anchor
    torch.testing.assert_close(A[3]["protos"][2], torch.tensor([30.0, 2.0]))  # alone: its own
    # the results' own tensors are not modified
    assert float(results[0].params[0]["head.weight"][0, 0]) == 0.0
    # weights="label": rows weighted by the class's counts (client 3 has none of class 1)
    lab = algo(eps=0.1, weights="label").aggregate(server, iter(results), RoundContext(1))
    torch.testing.assert_close(lab["heads"][0]["head.weight"][1], torch.tensor([1.0, -1.0]))


def test_prediction_uses_global_extractor_and_own_classifier():
    a = algo()
    p, b = a.ops.init(0)
    own = {"head.weight": torch.ones(3, 2), "head.bias": torch.zeros(3)}
    server = {"params": p, "buffers": b, "heads": {4: own}, "anchors": {}}
    data = ClientData(4, torch.arange(1), torch.tensor([0]), lambda i: torch.zeros(len(i), 2))
    ((w, params, _),) = a.mixture(server, {}, data)
    assert params["head.weight"] is own["head.weight"] and params["body.weight"] is p["body.weight"]
    other = ClientData(5, torch.arange(1), torch.tensor([0]), lambda i: torch.zeros(len(i), 2))
    assert a.mixture(server, {}, other)[0][1]["head.weight"] is p["head.weight"]


def test_balanced_loss_weights_classes_equally_on_model_1():
    a = algo()
    p, b = a.ops.init(0)
    q, _ = a.ops.init(1)
    y_all = torch.tensor([0, 0, 0, 1])
    bw = balanced_weights(y_all, 3)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    pos = torch.tensor([2, 3])  # one sample of class 0 (weight 2/3), one of class 1 (2)
    batch = Batch(x=x, y=y_all[pos], pos=pos)
    loss = a.balanced_loss([p, q], [b, b], batch, {"bw": bw})
    ce = F.cross_entropy(a.ops.forward(q, b, x), y_all[pos], reduction="none")
    torch.testing.assert_close(loss, (2 / 3 * ce[0] + 2 * ce[1]) / 2)
