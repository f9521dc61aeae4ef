"""IFCA, FeSEM, CFL and FedSoft: their small math, executor equivalence and an end-to-end run."""

from __future__ import annotations

from collections import Counter
from math import comb

import pytest
import torch
from torch import nn

from fedshift.algorithms.base import ClientData, ClientResult, ModelOps, RoundContext
from fedshift.algorithms.cfl import CFL, bipartition, flatten_update, should_split
from fedshift.algorithms.fedsoft import FedSoft, importance_weights, mix_params
from fedshift.algorithms.fesem import FeSEM, nearest_center
from fedshift.algorithms.ifca import IFCA
from fedshift.config import validate_config
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.run.experiment import run_experiment
from tests.conftest import RUN, assert_close64, assert_history_same, run_executors, tiny_config

CTX = RoundContext(1)
TWO_CONCEPTS = {
    "scenario__concepts": ["identity", "reverse"],
    "scenario__mix": {
        "types": [{"fraction": 0.5, "concepts": [0]}, {"fraction": 0.5, "concepts": [1]}]
    },
}
METHODS = {
    "ifca": {"name": "ifca", "params": {"num_clusters": 2}},
    "fesem": {"name": "fesem", "params": {"num_clusters": 2}},
    # thresholds that split every round (up to the cap), so the split path is exercised
    "cfl": {"name": "cfl", "params": {"eps1": 100.0, "eps2": 0.0, "max_clusters": 3}},
    "fedsoft": {"name": "fedsoft", "params": {"num_clusters": 2, "lam": 0.1}},
}


# ---------------------------------------------------------------------- hand-made fixtures
def linear_ops() -> ModelOps:
    return ModelOps(lambda: nn.Linear(3, 3, bias=False), torch.device("cpu"))


def model(scale: float) -> dict:
    """A 3-class linear model whose logits are ``scale`` times the (one-hot) input."""
    return {"params": {"weight": scale * torch.eye(3)}, "buffers": {}}


def onehot_client(cid: int, labels: list[int], flip: bool = False) -> ClientData:
    """Inputs are one-hot of the label (reversed when ``flip``): model(+s) fits unflipped."""
    y = torch.tensor(labels)
    x = torch.eye(3)[(2 - y) if flip else y]
    return ClientData(
        cid=cid, train_idx=torch.arange(len(labels)), y_train=y, inputs=lambda i: x[i]
    )


def result(cid: int, n: int, weight: torch.Tensor, **upload) -> ClientResult:
    return ClientResult(cid, n, [{"weight": weight}], [{}], dict(upload))


# ---------------------------------------------------------------------- IFCA
def test_ifca_picks_lowest_loss_and_only_chosen_clusters_change():
    algo = IFCA(IFCA.Params(num_clusters=3), linear_ops(), 3, **RUN)
    server = {"models": [model(0.0), model(5.0), model(-5.0)]}
    client: dict = {}
    data = onehot_client(0, [0, 1, 2, 1])
    task = algo.client_task(server, client, data, CTX)
    assert client == {} and task.info["cluster"] == 1  # the task reads the state, never writes
    assert task.params[0] is server["models"][1]["params"]  # trains only the chosen model
    assert algo.upload(task, task.params, task.buffers, data) == {"cluster": 1}
    r1 = result(0, 4, torch.ones(3, 3), cluster=1)
    r2 = result(1, 12, 3 * torch.ones(3, 3), cluster=1)
    client = algo.client_update(server, client, task, r1)
    assert client["cluster"] == 1 and client["omega"].tolist() == [0.0, 1.0, 0.0]
    new = algo.aggregate(server, iter([r1, r2]), CTX)
    torch.testing.assert_close(new["models"][1]["params"]["weight"], 2.5 * torch.ones(3, 3))
    for k in (0, 2):  # nobody picked them: unchanged (not zeroed as in the reference code)
        assert new["models"][k] is server["models"][k]
    assert algo.cluster_of(new, client) == 1
    test_state = algo.adapt_test_client(server, onehot_client(9, [2, 0], flip=False), {})
    assert algo.cluster_of(server, test_state) == 1


# ---------------------------------------------------------------------- FeSEM
def test_fesem_nearest_center_assignment():
    centers = [
        {"a": torch.zeros(2), "b": torch.zeros(1)},
        {"a": torch.tensor([3.0, 0.0]), "b": torch.ones(1)},
        {"a": torch.tensor([0.0, -4.0]), "b": torch.zeros(1)},
    ]
    assert nearest_center({"a": torch.tensor([2.0, 0.5]), "b": torch.ones(1)}, centers) == 1
    assert nearest_center({"a": torch.tensor([0.5, -3.0]), "b": torch.zeros(1)}, centers) == 2
    assert nearest_center({"a": torch.tensor([0.2, 0.1]), "b": torch.ones(1)}, centers) == 0
    # b matters too: nearer to center 1 in "a" but far in "b"
    assert nearest_center({"a": torch.tensor([1.6, 0.0]), "b": torch.tensor([-3.0])}, centers) == 0


def test_fesem_first_assignment_by_loss_then_by_distance():
    algo = FeSEM(FeSEM.Params(num_clusters=2), linear_ops(), 3, **RUN)
    server = {"models": [model(5.0), model(-5.0)]}
    client: dict = {}
    data = onehot_client(0, [0, 1, 2])
    task = algo.client_task(server, client, data, CTX)
    assert task.params[0] is server["models"][0]["params"]  # first time: lowest loss
    trained = [{"weight": -4.0 * torch.eye(3)}]  # the trained model lands near center 1
    r = result(0, 3, trained[0]["weight"], **algo.upload(task, trained, [{}], data))
    client = algo.client_update(server, client, task, r)
    assert client["cluster"] == 1 and r.upload["cluster"] == 1
    new = algo.aggregate(server, iter([r]), CTX)
    assert new["models"][0] is server["models"][0]
    torch.testing.assert_close(new["models"][1]["params"]["weight"], -4.0 * torch.eye(3))
    task = algo.client_task(new, client, onehot_client(0, [0, 1, 2]), CTX)  # keeps its cluster
    assert task.params[0] is new["models"][1]["params"]


# ---------------------------------------------------------------------- CFL
def opposite_updates(m: int = 3, d: int = 9, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    e = torch.zeros(d)
    e[0] = 1.0
    noise = 0.05 * torch.randn(2 * m, d, generator=g)
    return torch.cat([e.expand(m, d), -e.expand(m, d)]) + noise


def test_cfl_split_criterion():
    ups = opposite_updates()
    assert should_split(ups, 0.4, 0.6)  # mean ≈ 0, max ≈ 1
    assert not should_split(ups + 1.0, 0.4, 0.6)  # large mean update: keep training together
    assert not should_split(0.1 * ups, 0.4, 0.6)  # all updates small: converged
    assert not should_split(ups[:1], 0.4, 0.6)  # a single member cannot be split


def test_cfl_bipartition_recovers_the_two_directions():
    ups = opposite_updates()
    perm = torch.tensor([3, 0, 4, 1, 5, 2])
    first, second = bipartition(ups[perm])
    groups = {frozenset(perm[first].tolist()), frozenset(perm[second].tolist())}
    assert groups == {frozenset({0, 1, 2}), frozenset({3, 4, 5})}
    assert 0 in first


def cfl_round(max_clusters, n_clusters=1):
    """A server with ``n_clusters`` equal models and 6 clients per cluster whose updates point
    in two opposite directions; returns (old server, new server)."""
    algo = CFL(CFL.Params(max_clusters=max_clusters), linear_ops(), 3, **RUN)
    parent = torch.eye(3)
    server = {
        "models": [{"params": {"weight": parent}, "buffers": {}} for _ in range(n_clusters)],
        "assign": {},
    }
    results = []
    for k in range(n_clusters):
        ups = opposite_updates(seed=k)
        for i in range(6):
            cid = 6 * k + i
            server["assign"][cid] = k
            results.append(result(cid, 10 + i, parent + ups[i].view(3, 3)))
    return algo, server, results, algo.aggregate(server, iter(results), CTX)


def test_cfl_splits_and_children_average_their_members():
    algo, server, results, new = cfl_round(None)
    assert len(new["models"]) == 2
    assert [new["assign"][c] for c in range(6)] == [0, 0, 0, 1, 1, 1]
    for k, members in ((0, results[:3]), (1, results[3:])):
        n = sum(r.num_samples for r in members)
        want = sum(r.params[0]["weight"] * r.num_samples for r in members) / n
        torch.testing.assert_close(new["models"][k]["params"]["weight"], want)
    assert algo.cluster_of(new, {"cid": 4}) == 1
    assert new["models"][0]["params"]["weight"] is not server["models"][0]["params"]["weight"]
    torch.testing.assert_close(
        flatten_update(results[0].params[0], server["models"][0]["params"]),
        results[0].params[0]["weight"].reshape(-1) - torch.eye(3).reshape(-1),
    )


def test_cfl_max_clusters_caps_the_splits():
    _, _, _, new = cfl_round(1)
    assert len(new["models"]) == 1 and set(new["assign"].values()) == {0}
    _, _, _, new = cfl_round(3, n_clusters=2)  # both clusters want to split, the cap allows one
    assert len(new["models"]) == 3
    assert sorted(set(new["assign"].values())) == [0, 1, 2]
    _, _, _, new = cfl_round(None, n_clusters=2)
    assert len(new["models"]) == 4


# ---------------------------------------------------------------------- FedSoft
def test_fedsoft_importance_weights_with_floor():
    losses = torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.1, 0.3], [0.05, 0.6, 0.7], [0.4, 0.3, 0.2]])
    torch.testing.assert_close(importance_weights(losses, 1e-4), torch.tensor([0.5, 0.25, 0.25]))
    losses = torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.1, 0.3], [0.05, 0.6, 0.7], [0.4, 0.3, 0.9]])
    want = torch.tensor([0.5, 0.5, 1e-4]) / 1.0001  # cluster 2 is nobody's best: floored
    torch.testing.assert_close(importance_weights(losses, 1e-4), want)
    assert importance_weights(losses, 1e-4).sum().item() == pytest.approx(1.0)


def test_fedsoft_anchor_and_center_update():
    algo = FedSoft(FedSoft.Params(num_clusters=2, lam=0.5), linear_ops(), 3, **RUN)
    server = {"models": [model(5.0), model(-5.0)]}
    client: dict = {}
    task = algo.client_task(server, client, onehot_client(0, [0, 1, 2, 0]), CTX)
    u = task.info["u"]
    torch.testing.assert_close(u, torch.tensor([1.0, 1e-4]) / 1.0001)
    want = mix_params(u.tolist(), [m["params"] for m in server["models"]])
    torch.testing.assert_close(task.extras["anchor"]["weight"], want["weight"])
    assert task.params[0] is server["models"][0]["params"]  # first time: its best center
    w1, w2 = torch.ones(3, 3), 4 * torch.ones(3, 3)
    r1 = result(0, 10, w1, u=torch.tensor([0.75, 0.25]))
    r2 = result(1, 30, w2, u=torch.tensor([0.2, 0.8]))
    new = algo.aggregate(server, iter([r1, r2]), CTX)
    for k, (a, b) in enumerate(((0.75, 0.2), (0.25, 0.8))):
        exp = (a * 10 * w1 + b * 30 * w2) / (a * 10 + b * 30)
        torch.testing.assert_close(new["models"][k]["params"]["weight"], exp)
    st = algo.client_update(server, client, task, result(0, 4, w1))
    assert st["params"]["weight"] is w1 and st["omega"] is u
    assert algo.mixture(server, st, onehot_client(0, [0]))[0][1] is st["params"]
    assert algo.cluster_of(server, st) == 0


def test_fedsoft_local_loss_has_the_proximal_term():
    from fedshift.algorithms.base import Batch

    algo = FedSoft(FedSoft.Params(num_clusters=2, lam=0.5), linear_ops(), 3, **RUN)
    x, y = torch.eye(3), torch.arange(3)
    p = {"weight": torch.eye(3)}
    anchor = {"weight": torch.zeros(3, 3)}
    loss = algo.local_loss([p], [{}], Batch(x=x, y=y, pos=y), {"anchor": anchor})
    ce = torch.nn.functional.cross_entropy(x @ p["weight"].T, y)
    torch.testing.assert_close(loss, ce + 0.25 * 3.0)


# ---------------------------------------------------------------------- executors
@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
@pytest.mark.parametrize("method", list(METHODS))
def test_sequential_and_batched_agree(tmp_path, method, vectorize):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            algorithm=METHODS[method],
            train__rounds=3,
            train__participation=1.0 if method == "cfl" else 0.67,
            train__momentum=0.9,
            scenario__label_shift={"kind": "quantity", "alpha": 1.0},
            **TWO_CONCEPTS,
        )
    )
    ex = (SequentialExecutor(), BatchedExecutor(4, vectorize))
    seq, bat = run_executors(cfg, ex)  # float64: see F64_ATOL in fedshift/testing.py
    assert len(seq.server["models"]) == len(bat.server["models"])
    if method == "cfl":
        assert len(seq.server["models"]) == 3  # it split (and stopped at the cap)
        assert seq.server["assign"] == bat.server["assign"]
    for i, (ms, mb) in enumerate(zip(seq.server["models"], bat.server["models"], strict=True)):
        for key, v in ms["params"].items():
            assert_close64(mb["params"][key], v, f"model {i} {key}")
    assert_history_same(seq, bat)
    for hs, hb in zip(seq.history, bat.history, strict=True):
        assert hb["clusters"] == hs["clusters"]
    if method == "fedsoft":
        for cid, st in seq.clients.items():
            for key, v in st["params"].items():
                assert_close64(bat.clients[cid]["params"][key], v, f"client {cid} {key}")


# ---------------------------------------------------------------------- end to end
def adjusted_rand(truth: list, found: list) -> float:
    """The adjusted Rand index from pair counts (Hubert & Arabie), independent of sklearn."""
    pairs = sum(comb(v, 2) for v in Counter(zip(truth, found, strict=True)).values())
    a = sum(comb(v, 2) for v in Counter(truth).values())
    b = sum(comb(v, 2) for v in Counter(found).values())
    expected = a * b / comb(len(truth), 2)
    return (pairs - expected) / ((a + b) / 2 - expected)


def test_adjusted_rand_by_hand():
    assert adjusted_rand([0, 0, 1, 1], [5, 5, 7, 7]) == 1.0  # the labels' names do not matter
    # pairs together: none in both, 2 in truth, 2 found, 6 in all: (0 - 2/3) / (2 - 2/3)
    assert adjusted_rand([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(-0.5)
    # 3 in both, 3 in truth, 1 + 6 found, 15 in all: (3 - 21/15) / (5 - 21/15)
    assert adjusted_rand([0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1]) == pytest.approx(4 / 9)


@pytest.mark.parametrize("method", list(METHODS))
def test_runs_end_to_end_and_resumes(tmp_path, method):
    raw = tiny_config(
        tmp_path, algorithm=METHODS[method], train__participation=0.67, **TWO_CONCEPTS
    )
    res = run_experiment(validate_config({**raw, "name": "full"}))
    assert len(res.history) == 3
    last = res.history[-1]
    # both concepts (half the clients' labels reversed) are learnt: above chance (25%, 4 classes)
    assert last["global_acc"] > 30 and last["local_acc"] > 30, last
    # the reported ARI is that of the reported clusters against the true concepts
    concepts = [c.concept for c in res.data.clients]
    assert sorted(Counter(concepts).values()) == [3, 3] and -1 not in last["clusters"], last
    assert last["ari_concept"] == pytest.approx(adjusted_rand(concepts, last["clusters"]))
    if method != "cfl":  # two clusters, one per concept (CFL splits on, up to its cap of 3)
        assert last["ari_concept"] == pytest.approx(1.0), last
    else:
        assert len(set(last["clusters"])) == 3 and last["ari_concept"] < 1.0, last
    if method not in ("cfl", "fedsoft"):
        return
    # the most stateful ones (growing model list; personal models): a run stopped after 2
    # rounds and resumed ends like the uninterrupted one
    run_experiment(validate_config({**raw, "name": "part", "train": {**raw["train"], "rounds": 2}}))
    resumed = run_experiment(
        validate_config({**raw, "name": "part"}), run_dir=tmp_path / "runs" / "part", resume=True
    )
    for a, b in zip(res.history, resumed.history, strict=True):
        for key in ("global_acc", "local_acc", "train_loss", "clusters"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), key


def test_empty_cluster_kept_by_default_and_zeroed_as_in_the_code():
    from fedshift.algorithms.ifca import average_hard_clusters

    server = {
        "models": [
            {"params": {"w": torch.full((2,), float(k + 1))}, "buffers": {}} for k in range(3)
        ]
    }

    def results():
        return [
            ClientResult(0, 2, [{"w": torch.tensor([4.0, 0.0])}], [{}], {"cluster": 0}),
            ClientResult(1, 6, [{"w": torch.tensor([0.0, 8.0])}], [{}], {"cluster": 0}),
            ClientResult(2, 1, [{"w": torch.tensor([5.0, 5.0])}], [{}], {"cluster": 2}),
        ]

    keep = average_hard_clusters(server, results())
    assert torch.allclose(keep[0]["params"]["w"], torch.tensor([1.0, 6.0]))  # (2*4, 6*8)/8
    assert torch.equal(keep[1]["params"]["w"], torch.full((2,), 2.0))  # nobody picked 1: kept
    assert torch.equal(keep[2]["params"]["w"], torch.tensor([5.0, 5.0]))
    zero = average_hard_clusters(server, results(), "zero")
    assert torch.equal(zero[1]["params"]["w"], torch.zeros(2))
    assert torch.equal(zero[0]["params"]["w"], keep[0]["params"]["w"])
