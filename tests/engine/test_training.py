"""The functional SGD and batch schedules match their definitions."""

import torch

from fedshift.core.seeds import derive_seed
from fedshift.engine.simulator import sample_clients
from fedshift.engine.training import SGDConfig, batch_schedule, num_local_steps, sgd_step


def test_sgd_step_matches_torch_optim():
    torch.manual_seed(0)
    w0 = torch.randn(5, 3)
    target = torch.randn(5, 3)
    cfg = SGDConfig(lr=0.1, momentum=0.9, weight_decay=5e-4)
    ref = w0.clone().requires_grad_(True)
    opt = torch.optim.SGD([ref], lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    ours = w0.clone().requires_grad_(True)
    bufs = [None]
    for _ in range(4):
        opt.zero_grad()
        ((ref - target) ** 3).abs().sum().backward()
        opt.step()
        (g,) = torch.autograd.grad(((ours - target) ** 3).abs().sum(), [ours])
        sgd_step([ours], [g], bufs, cfg)
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-6, atol=1e-6)


def test_num_local_steps():
    assert num_local_steps(180, 128, 1, drop_last=True) == 1
    assert num_local_steps(450, 128, 1, drop_last=True) == 3
    assert num_local_steps(450, 128, 2, drop_last=False) == 8
    assert num_local_steps(50, 128, 1, drop_last=True) == 1  # small clients still train
    assert num_local_steps(0, 128, 1, drop_last=True) == 0
    assert num_local_steps(450, 128, 1, drop_last=True, steps=7) == 7


def test_batch_schedule_is_a_permutation_per_epoch():
    gen = torch.Generator().manual_seed(0)
    batches = batch_schedule(10, 4, 4, drop_last=True, generator=gen)
    assert [len(b) for b in batches] == [4, 4, 4, 4]
    first_epoch = torch.cat(batches[:2])
    assert len(set(first_epoch.tolist())) == 8
    gen = torch.Generator().manual_seed(0)
    batches = batch_schedule(10, 4, 3, drop_last=False, generator=gen)
    assert sorted(torch.cat(batches).tolist()) == list(range(10))
    small = batch_schedule(3, 4, 1, drop_last=True, generator=gen)
    assert sorted(small[0].tolist()) == [0, 1, 2]


def test_sampling_streams():
    a = sample_clients(100, 0.1, seed=0, rnd=1)
    assert len(a) == 10 and a == sorted(set(a))
    assert a == sample_clients(100, 0.1, seed=0, rnd=1)
    assert a != sample_clients(100, 0.1, seed=0, rnd=2)
    assert sample_clients(100, 1.0, seed=0, rnd=1) == list(range(100))
    assert len(sample_clients(5, 0.01, seed=0, rnd=1)) == 1
    assert derive_seed(1, 2, 3) != derive_seed(1, 2, 4)
