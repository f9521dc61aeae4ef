"""The min-max stage contract (``Phase.adversary``): the adversary's own Adam (torch's
arithmetic), its warm-up steps at the start of a stage and its steps on every mini-batch
before the phase's step, parameters split between the two players, the values losses record
(``loss_and_values``), and the same numbers from the sequential and batched executors with
unequal clients (clients that finish early stop updating the adversary too)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedshift.algorithms.base import Adversary, Phase
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.simulator import Simulator
from fedshift.engine.training import adam_step
from fedshift.run.experiment import make_algorithm, sim_config
from tests.conftest import as_float64, assert_close64, float64, tiny_config


def test_adam_step_matches_torch_optim():
    torch.manual_seed(0)
    w0, target = torch.randn(5, 3), torch.randn(5, 3)
    ref = w0.clone().requires_grad_(True)
    opt = torch.optim.Adam([ref], lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    ours, state = w0.clone().requires_grad_(True), [None]
    for t in range(1, 6):
        opt.zero_grad()
        ((ref - target) ** 3).abs().sum().backward()
        opt.step()
        (g,) = torch.autograd.grad(((ours - target) ** 3).abs().sum(), [ours])
        adam_step([ours], [g], state, t, 0.01, (0.8, 0.99), 1e-6)
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-6, atol=1e-6)


def test_the_adversary_never_trains_in_the_phase_step_and_validates():
    adv = Adversary(loss="critic", trainable=((0, ("c.w",)),))
    phase = Phase(trainable=((0, None),), adversary=adv)
    assert phase.trained_names(0, ["a.w", "c.w"]) == ["a.w"]
    assert adv.trained_names(0, ["a.w", "c.w"]) == ["c.w"]
    with pytest.raises(ValueError, match="allowed: adam, sgd"):
        Adversary(loss="critic", trainable=(), optimizer="rmsprop")


def _game(cfg, warmup: int = 0, cast=None, calls: list | None = None):
    """FedAvg with a min-max stage: the adversary (the head's bias) is pulled towards the
    batch's mean input feature sum, while the rest minimises the cross-entropy; the phase loss
    records the batch's mean input sum, the adversary's loss its own value (``cast``: applied to
    the scenario; ``calls``: the adversary's loss appends the batch size of each call)."""
    data = build_scenario(cfg.scenario, cfg.seed)
    data = data if cast is None else cast(data)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    names = [n for n, _ in algo.ops.module.named_parameters()]
    bias = tuple(n for n in names if n.endswith("bias"))[-1:]
    adv = Adversary(loss="adv_loss", trainable=((0, bias),), steps=2, lr=0.05, warmup_steps=warmup)
    task_fn, loss_fn = algo.client_task, algo.local_loss

    def client_task(server, client, view, ctx):
        return replace(task_fn(server, client, view, ctx), phases=(Phase(adversary=adv),))

    def adv_loss(params, buffers, batch, extras):
        if calls is not None:
            calls.append(batch.x.shape[0])
        target = batch.mean(batch.x.sum(1))
        loss = (params[0][bias[0]] - target).pow(2).sum()
        return loss, {"adv_value": loss}

    def local_loss(params, buffers, batch, extras):
        return loss_fn(params, buffers, batch, extras), {"x_sum": batch.mean(batch.x.sum(1))}

    algo.client_task, algo.adv_loss, algo.local_loss = client_task, adv_loss, local_loss
    return algo, data, bias[0]


def _unequal(tmp_path, rounds: int = 2):
    return validate_config(
        tiny_config(
            tmp_path,
            train__rounds=rounds,
            train__participation=0.5,
            train__local_epochs=2,
            scenario__num_clients=8,
            scenario__label_shift={"kind": "quantity", "alpha": 0.5},
        )
    )


class _Uploads:
    """Every client's upload, by round and client (an aggregate spy)."""

    def __init__(self, algo) -> None:
        self.rows: dict[tuple[int, int], dict] = {}
        agg = algo.aggregate

        def spy(server, results, ctx):
            results = list(results)
            for r in results:
                self.rows[(ctx.round, r.cid)] = (r.upload, r.telemetry["steps"])
            return agg(server, iter(results), ctx)

        algo.aggregate = spy


@pytest.mark.parametrize(("vectorize", "warmup"), [("vmap", 0), ("loop", 0), ("vmap", 3)])
def test_batched_adversary_equals_sequential_with_unequal_clients(tmp_path, vectorize, warmup):
    """Same models and recorded values; with a warm-up, clients with fewer batches than warm-up
    steps cycle through theirs (their batch ``w mod S``) in both executors."""
    cfg = _unequal(tmp_path)
    out, ups = [], []
    with float64():  # see F64_ATOL in fedshift/testing.py
        for executor in (SequentialExecutor(), BatchedExecutor(3, vectorize=vectorize)):
            algo, data, bias = _game(cfg, warmup, as_float64)
            ups.append(_Uploads(algo))
            init = algo.ops.init(cfg.seed)[0][bias].clone()
            out.append(Simulator(algo, data, sim_config(cfg), executor).run().server["params"])
    seq, bat = out
    assert not torch.allclose(seq[bias], init, atol=1e-3)  # the adversary trained
    for k in seq:
        assert_close64(bat[k], seq[k], k)
    assert set(ups[0].rows) == set(ups[1].rows)
    assert len({s for _, s in ups[0].rows.values()}) > 1  # unequal clients
    for key, (up, _) in ups[0].rows.items():
        other = ups[1].rows[key][0]
        assert set(up) == {"x_sum", "adv_value"}
        for name, v in up.items():
            assert_close64(other[name], v, f"{key} {name}")


@pytest.mark.parametrize("executor", ["sequential", "vmap", "loop"])
def test_an_adversary_takes_warmup_plus_k_steps_per_batch(tmp_path, executor):
    """Per client and stage: ``warmup_steps + steps * S`` adversary steps (the vmapped path
    steps a whole chunk, here one client, at once)."""
    cfg = _unequal(tmp_path, rounds=1)
    calls: list[int] = []
    algo, data, _ = _game(cfg, warmup=4, calls=calls)
    ups = _Uploads(algo)
    ex = (
        SequentialExecutor()
        if executor == "sequential"
        else BatchedExecutor(chunk_size=1, vectorize=executor)
    )
    Simulator(algo, data, sim_config(cfg), ex).run()
    steps = [s for _, s in ups.rows.values()]
    assert len(calls) == sum(4 + 2 * s for s in steps)
