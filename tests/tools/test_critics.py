"""Fresh critics: within a client they read no dependence on features that share only the
client, while a pooled critic reads the client up to its closed-form ceiling; both read a
dependence that is there."""

import math

import pytest
import torch

from fedshift.tools.critics import (
    client_only_ceiling,
    pooled_critic,
    shuffled_within_clients,
    within_client_critic,
)
from tests.tools.conftest import client_features

FAST = {"steps": 150, "batch": 64, "hidden": 64}


@pytest.mark.parametrize("family", ["separable", "concat"])
def test_within_client_critic_reads_nothing_where_only_the_client_is_shared(family):
    a, b, client = client_features(clients=4, per_client=160)
    within = within_client_critic(a, b, client, family, **FAST)
    pooled = pooled_critic(a, b, client, family, **FAST)
    assert len(within.values) == 4
    assert abs(within.mean) < 0.05
    assert pooled.ceiling == pytest.approx(client_only_ceiling([160] * 4))
    assert abs(pooled.mean - pooled.ceiling) < 0.1  # the client alone, read between clients


@pytest.mark.parametrize("family", ["separable", "concat"])
def test_within_client_critic_reads_content_shared_inside_a_client(family):
    a, _, client = client_features(clients=4, per_client=160, seed=1)
    b = a + 0.3 * torch.randn(a.shape, generator=torch.Generator().manual_seed(2))
    assert within_client_critic(a, b, client, family, **FAST).mean > 0.3
    null = within_client_critic(a, shuffled_within_clients(b, client), client, family, **FAST)
    assert abs(null.mean) < 0.05


def test_shuffling_within_clients_keeps_each_client_its_own_rows():
    a, b, client = client_features(clients=3, per_client=10)
    s = shuffled_within_clients(b, client, seed=0)
    for k in range(3):
        rows = client == k
        assert sorted(s[rows].sum(1).tolist()) == sorted(b[rows].sum(1).tolist())
    assert not torch.equal(s, b)


def _optimal_critic_reading(p: torch.Tensor) -> float:
    """Î + log 4 of the optimal critic T = log(P/Q) on (client of a, client of b): the joint
    P = diag(p), the product Q = p pᵀ, pairs P = 0 scored -inf."""
    joint, prod = torch.diag(p), torch.outer(p, p)
    t = torch.log(joint / prod)
    pos = (joint * -torch.nn.functional.softplus(-t)).nan_to_num().sum()
    neg = (prod * torch.nn.functional.softplus(t)).sum()
    return float(pos - neg) + math.log(4.0)


def test_client_only_ceiling_closed_form():
    assert client_only_ceiling([50] * 20) == pytest.approx(1.185, abs=5e-4)
    assert client_only_ceiling([123]) == 0.0
    assert client_only_ceiling([1] * 10**5) == pytest.approx(math.log(4.0), abs=1e-3)  # K → ∞
    for sizes in ([50] * 20, [10, 30, 60], [1, 1, 98], [7, 7]):
        p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
        assert client_only_ceiling(sizes) == pytest.approx(_optimal_critic_reading(p), abs=1e-9)
    # unequal sizes: one dominant client gives away less than equal ones
    assert client_only_ceiling([1, 1, 98]) < client_only_ceiling([33, 33, 34])
