"""The after-the-fact probes: a linear probe decodes a linearly encoded label and not noise;
a fresh critic separates dependent from independent feature pairs."""

import torch

from fedshift.probes import fresh_critic_mi, linear_probe


def test_linear_probe_reads_a_linear_label_and_not_noise():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (800,), generator=g)
    signal = torch.nn.functional.one_hot(y, 5).float() @ torch.randn(5, 16, generator=g)
    x = signal + 0.3 * torch.randn(800, 16, generator=g)
    assert linear_probe(x, y) > 95
    assert linear_probe(torch.randn(800, 16, generator=g), y) < 35  # chance: 20%


def test_fresh_critic_separates_dependent_from_independent_pairs():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 8, generator=g)
    dep = fresh_critic_mi(a, a + 0.3 * torch.randn(1024, 8, generator=g), steps=200)
    ind = fresh_critic_mi(a, torch.randn(1024, 8, generator=g), steps=200)
    assert ind < 0.1 and dep > ind + 0.5
