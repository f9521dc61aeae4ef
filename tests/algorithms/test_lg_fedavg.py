"""LG-FedAvg: FedPer mirrored. The server averages the heads only (bodies untouched), a client
starts from its own body and the global head, is scored with them, and the optional FedAvg
warm-up averages whole models first."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedshift.algorithms.base import ClientData, ClientResult, ModelOps, RoundContext
from fedshift.algorithms.capabilities import Personalised
from fedshift.algorithms.lg_fedavg import LGFedAvg
from fedshift.models.base import SplitModel
from tests.conftest import RUN


def _model() -> SplitModel:
    return SplitModel(nn.Linear(2, 2), nn.Linear(2, 3), 2, 3)


def _algo(**params) -> LGFedAvg:
    ops = ModelOps(_model, torch.device("cpu"))
    return LGFedAvg(LGFedAvg.parse_params(params), ops, 3, **RUN)


def _model_params(v: float) -> dict[str, torch.Tensor]:
    return {
        "body.weight": torch.full((2, 2), v),
        "body.bias": torch.full((2,), v + 0.1),
        "head.weight": torch.full((3, 2), v + 0.2),
        "head.bias": torch.full((3,), v + 0.3),
    }


def _data(test_only: bool = False) -> ClientData:
    return ClientData(
        0, torch.arange(4), torch.zeros(4, dtype=torch.long), None, test_only=test_only
    )


def _result(cid: int, n: int, v: float) -> ClientResult:
    return ClientResult(cid, n, [_model_params(v)], [{"bn": torch.tensor(v)}])


def test_head_is_averaged_body_untouched():
    algo = _algo()
    assert algo.averaged_names == {"head.weight", "head.bias"}
    server = {"params": _model_params(0.0), "buffers": {"bn": torch.tensor(-1.0)}}
    new = algo.aggregate(server, iter([_result(0, 1, 1.0), _result(1, 3, 2.0)]), RoundContext(1))
    for k in ("body.weight", "body.bias"):
        assert new["params"][k] is server["params"][k]
    # sample-weighted: (1 * (1 + d) + 3 * (2 + d)) / 4 = 1.75 + d
    torch.testing.assert_close(new["params"]["head.weight"], torch.full((3, 2), 1.75 + 0.2))
    torch.testing.assert_close(new["params"]["head.bias"], torch.full((3,), 1.75 + 0.3))
    assert new["buffers"] is server["buffers"]  # buffers belong to the private bodies
    uniform = _algo(weighting="uniform").aggregate(
        server, iter([_result(0, 1, 1.0), _result(1, 3, 2.0)]), RoundContext(1)
    )
    torch.testing.assert_close(uniform["params"]["head.bias"], torch.full((3,), 1.5 + 0.3))


def test_start_model_is_own_body_and_global_head():
    algo = _algo()
    server = {"params": _model_params(0.0), "buffers": {"bn": torch.tensor(-1.0)}}
    own = {"params": _model_params(5.0), "buffers": {"bn": torch.tensor(7.0)}}
    task = algo.client_task(server, own, _data(), RoundContext(3))
    p = task.params[0]
    torch.testing.assert_close(p["body.weight"], own["params"]["body.weight"])
    torch.testing.assert_close(p["body.bias"], own["params"]["body.bias"])
    torch.testing.assert_close(p["head.weight"], server["params"]["head.weight"])
    torch.testing.assert_close(p["head.bias"], server["params"]["head.bias"])
    assert task.buffers[0] is own["buffers"]
    new = algo.client_task(server, {}, _data(), RoundContext(3))  # never trained: the server's
    assert new.params[0] is server["params"] and new.buffers[0] is server["buffers"]
    # scored with the same model: own body, the current global head
    ((w, mp, mb),) = algo.mixture(server, own, _data())
    assert w == 1.0 and mb is own["buffers"]
    for k in p:
        torch.testing.assert_close(mp[k], p[k])
    ((_, tp, _),) = algo.mixture(server, own, _data(test_only=True))
    assert tp is server["params"]
    # the trained model is kept whole (its stale head is replaced at the next start)
    res = _result(0, 4, 9.0)
    assert algo.client_update(server, own, task, res)["params"] is res.params[0]


def test_fedavg_warm_up_averages_whole_models_and_keeps_no_client_model():
    algo = _algo(fedavg_rounds=2)
    server = {"params": _model_params(0.0), "buffers": {"bn": torch.tensor(-1.0)}}
    own: dict = {}
    task = algo.client_task(server, own, _data(), RoundContext(2))
    assert task.params[0] is server["params"]
    res = _result(0, 4, 3.0)
    assert algo.client_update(server, own, task, res) == {}
    new = algo.aggregate(server, iter([_result(0, 1, 1.0), _result(1, 3, 2.0)]), RoundContext(2))
    torch.testing.assert_close(new["params"]["body.weight"], torch.full((2, 2), 1.75))
    torch.testing.assert_close(new["buffers"]["bn"], torch.tensor(1.75))
    after = algo.aggregate(new, iter([_result(0, 1, 4.0)]), RoundContext(3))
    assert after["params"]["body.weight"] is new["params"]["body.weight"]
    torch.testing.assert_close(after["params"]["head.bias"], torch.full((3,), 4.3))
    task3 = algo.client_task(after, {}, _data(), RoundContext(3))
    assert task3.params[0] is after["params"] and not task3.info.get("warmup")


@pytest.mark.parametrize("name", ["lg-fedavg"])
def test_registered_with_paper(name):
    from fedshift.algorithms import get_algorithm

    cls = get_algorithm(name)
    assert cls is LGFedAvg and issubclass(cls, Personalised) and "Liang" in cls.paper
