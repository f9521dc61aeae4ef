"""DFL's critic objectives and read-outs, as pure functions of a critic's ``[B, B]`` output
(:mod:`fedshift.models.two_branch`: the joint pairs on its diagonal).

Two estimators of a mutual information I(A; B):

- ``jsd`` (the paper's, Deep InfoMax): :func:`~fedshift.algorithms.mi.jsd_mutual_information`
  of a score matrix; the critic ascends it; read out shifted by log 4 (0: independent, up to
  log 4 ≈ 1.386);
- ``club`` (CLUB, Cheng et al., ICML 2020; not in DFL's paper): from ``L[i, j] = log q(b_j |
  a_i)`` of a variational net, :func:`~fedshift.algorithms.mi.club_estimate` (an upper bound
  when ``q`` fits the conditional), while ``q`` itself is fitted by the log-likelihood of the
  joint pairs; read out as is, in nats (not comparable to the shifted JSD values).

:func:`refit_readout` is the read-out of a critic refitted on fixed features and read on held-
out ones (DFL's ``mi_s_refit``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedshift.algorithms.base import TensorDict
from fedshift.algorithms.mi import club_estimate, club_log_likelihood, jsd_mutual_information

LOG4 = math.log(4.0)


def estimate(estimator: str, out: Tensor, mask: Tensor | None = None) -> Tensor:
    """The estimate a critic's output gives (``jsd``: 2·JSD − log 4; ``club``: CLUB's)."""
    return club_estimate(out, mask) if estimator == "club" else jsd_mutual_information(out, mask)


def critic_loss(estimator: str, out: Tensor, mask: Tensor | None = None) -> Tensor:
    """What the critic minimises: the negative JSD estimate (it ascends the estimate), or for
    CLUB the negative log-likelihood of the joint pairs ``-mean_i L_ii`` (its fit of q)."""
    if estimator == "club":
        return -club_log_likelihood(out, mask)
    return -jsd_mutual_information(out, mask)


def readout(estimator: str, out: Tensor, mask: Tensor | None = None) -> float:
    """The logged value: the JSD estimate + log 4, or the CLUB estimate."""
    shift = 0.0 if estimator == "club" else LOG4
    return float(estimate(estimator, out, mask)) + shift


def refit_readout(
    critic: nn.Module,
    start: TensorDict,
    estimator: str,
    fit: tuple[Tensor, Tensor],
    held_out: tuple[Tensor, Tensor],
    steps: int,
    batch: int,
    lr: float,
    gen: torch.Generator,
) -> float:
    """A copy of ``critic`` at weights ``start`` trained for ``steps`` Adam steps (lr ``lr``,
    fresh state) on the fixed feature pairs ``fit`` (``(a, b)``, each step a batch of
    ``batch`` distinct samples drawn by ``gen``), then read on ``held_out`` in one batch
    (:func:`readout`). The features do not move: the critic only gets closer to its optimum."""
    p = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
    opt = torch.optim.Adam(list(p.values()), lr=lr)
    a, b = fit
    n = a.shape[0]
    with torch.enable_grad():
        for _ in range(steps):
            idx = torch.randperm(n, generator=gen)[:batch].to(a.device)
            loss = critic_loss(estimator, functional_call(critic, p, (a[idx], b[idx])))
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return readout(estimator, functional_call(critic, p, held_out))
