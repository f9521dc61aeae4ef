"""Mutual-information estimation between two feature batches (DFL's critics): Deep InfoMax's
Jensen-Shannon estimate from a critic's ``[B, B]`` score matrix (row i scores sample i's first
features against every sample's second features: the diagonal holds the joint pairs, the rest
shuffled ones), the bounded "confusion" objective an encoder can minimise instead, and CLUB's
estimate and log-likelihood from a ``[B, B]`` matrix of variational log-densities. Pure
functions of the matrices, so they run under ``torch.func.vmap``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def jsd_mutual_information(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Deep InfoMax's Jensen-Shannon MI estimate from a ``[B, B]`` critic score matrix:
    ``mean_i -softplus(-S_ii) - mean_{i != j} softplus(S_ij)`` (= 2·JSD − log 4, so from
    −log 4 for independent variables up to 0). ``mask`` (1 = real sample) drops padding."""
    pos, neg = _pair_means(scores, mask)
    return pos(-F.softplus(-torch.diagonal(scores))) - neg(F.softplus(scores))


def _pair_means(scores: torch.Tensor, mask: torch.Tensor | None):
    """Two functions: the mean of a ``[B]`` vector over the real positive pairs (the diagonal)
    and of a ``[B, B]`` matrix over the real negative pairs (off the diagonal)."""
    b = scores.shape[0]
    m = torch.ones(b, device=scores.device) if mask is None else mask.to(scores.dtype)
    eye = torch.eye(b, device=scores.device, dtype=scores.dtype)
    pair = (m[:, None] * m[None, :]) * (1 - eye)

    def pos(v: torch.Tensor) -> torch.Tensor:
        return (v * m).sum() / m.sum().clamp_min(1)

    def neg(v: torch.Tensor) -> torch.Tensor:
        return (v * pair).sum() / pair.sum().clamp_min(1)

    return pos, neg


def critic_confusion(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The encoder's side of minimising a JSD MI estimate, bounded: the cross-entropy of the
    critic's joint-vs-shuffled decision ``σ(S)`` against the target 1/2, averaged over positive
    and over negative pairs like :func:`jsd_mutual_information`, minus its floor ``log 2``. It is
    0 exactly when every score is 0 (the critic cannot tell the pairs apart); at an optimal
    critic that means independent features, the fixed point of the minimax game too, but the
    encoder cannot win by inflating the scores (its gradient ``σ(S) − 1/2`` stays bounded)."""
    pos, neg = _pair_means(scores, mask)
    ce = 0.5 * (F.softplus(scores) + F.softplus(-scores)) - math.log(2.0)
    return pos(torch.diagonal(ce)) + neg(ce)


def club_log_likelihood(logq: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean over the real samples of ``L_ii = log q(b_i | a_i)``, from ``L[i, j] = log
    q(b_j | a_i)``: what CLUB's variational net maximises (Cheng et al., ICML 2020)."""
    pos, _ = _pair_means(logq, mask)
    return pos(torch.diagonal(logq))


def club_estimate(logq: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """CLUB's estimate ``mean_i L_ii - mean_{i,j} L_ij`` over the real samples (``mask``), every
    pair ``(i, j)`` in the second mean, the diagonal included (Cheng et al., ICML 2020: an upper
    bound on I(A; B) when q fits the conditional; constants of ``log q`` cancel)."""
    b = logq.shape[0]
    m = torch.ones(b, device=logq.device) if mask is None else mask.to(logq.dtype)
    pair = m[:, None] * m[None, :]
    return club_log_likelihood(logq, mask) - (logq * pair).sum() / pair.sum().clamp_min(1)
