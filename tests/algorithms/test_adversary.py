"""The min-max stage contract (``Phase.adversary``): the adversary's own Adam (torch's
arithmetic), its steps on every mini-batch before the phase's step, parameters split between
the two players, and the same numbers from the sequential and batched executors with
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
from tests.conftest import tiny_config


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


def _game(cfg):
    """FedAvg with a min-max stage: the adversary (the head's bias) is pulled towards the
    batch's mean input feature sum, while the rest minimises the cross-entropy."""
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    names = [n for n, _ in algo.ops.module.named_parameters()]
    bias = tuple(n for n in names if n.endswith("bias"))[-1:]
    adv = Adversary(loss="adv_loss", trainable=((0, bias),), steps=2, lr=0.05)
    task_fn = algo.client_task

    def client_task(server, client, view, ctx):
        return replace(task_fn(server, client, view, ctx), phases=(Phase(adversary=adv),))

    def adv_loss(params, buffers, batch, extras):
        target = batch.mean(batch.x.sum(1))
        return (params[0][bias[0]] - target).pow(2).sum()

    algo.client_task, algo.adv_loss = client_task, adv_loss
    return algo, data, bias[0]


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_batched_adversary_equals_sequential_with_unequal_clients(tmp_path, vectorize):
    cfg = validate_config(
        tiny_config(
            tmp_path,
            train__rounds=2,
            train__participation=0.5,
            train__local_epochs=2,
            scenario__num_clients=8,
            scenario__label_shift={"kind": "quantity", "alpha": 0.5},
        )
    )
    out = []
    for executor in (SequentialExecutor(), BatchedExecutor(chunk_size=3, vectorize=vectorize)):
        algo, data, bias = _game(cfg)
        init = algo.ops.init(cfg.seed)[0][bias].clone()
        out.append(Simulator(algo, data, sim_config(cfg), executor).run().server["params"])
    seq, bat = out
    assert not torch.allclose(seq[bias], init, atol=1e-3)  # the adversary trained
    for k in seq:
        torch.testing.assert_close(bat[k], seq[k], atol=2e-5, rtol=1e-4, msg=k)
