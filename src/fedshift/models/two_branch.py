"""A two-branch classifier and the critic networks of neural mutual-information estimators.

:class:`TwoBranchModel` is DFL's client network (spec dfl.md §2.2): two extractors of the same
architecture, ``inv`` (domain-invariant, E_c) and ``spec`` (domain-specific, E_s), and a
classifier ``head`` reading the concatenation ``[inv(x); spec(x)]``. It is made from any
:class:`~fedshift.models.base.SplitModel`: ``inv`` is the model's body, ``spec`` a freshly
initialised copy of it, ``head`` the model's head with its first linear layer widened to the
concatenated features. The MI critics live in the same module (``critic_s``, ``critic_c``) so
that one parameter dict holds the whole client and the executors train it like any model.

:class:`SeparableCritic` scores every pair of a batch at once: ``S[i, j] = <g(a_i), h(b_j)>``,
positives on the diagonal and negatives off it (Deep InfoMax's "encoder-and-dot" critic).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshift.errors import FedshiftError
from fedshift.models.base import SplitModel


def _encoder(dim: int, hidden: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, out))


class SeparableCritic(nn.Module):
    """``T(a, b) = <g(a), h(b)>`` with ``g, h``: Linear-ReLU-Linear plus a linear shortcut.

    ``normalise``: each input vector is scaled to unit L2 norm first, so the scores, and the
    size of a gradient step on the critic, do not grow with the extractors' feature magnitude (a bilinear critic on unnormalised features
    diverged in DFL's min-max game on Colored-MNIST)."""

    def __init__(
        self, dim_a: int, dim_b: int, hidden: int = 512, out: int = 128, normalise: bool = False
    ) -> None:
        super().__init__()
        self.g, self.h = _encoder(dim_a, hidden, out), _encoder(dim_b, hidden, out)
        self.g_skip, self.h_skip = nn.Linear(dim_a, out), nn.Linear(dim_b, out)
        self.normalise = normalise

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        """The ``[B, B]`` score matrix of every (a_i, b_j) pair."""
        if self.normalise:
            a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
        ga = self.g(a) + self.g_skip(a)
        hb = self.h(b) + self.h_skip(b)
        return ga @ hb.T


def widen_head(head: nn.Module, factor: int) -> nn.Module:
    """A fresh copy of ``head`` whose first linear layer reads ``factor`` times its features."""
    head = copy.deepcopy(head)
    if isinstance(head, nn.Linear):
        return nn.Linear(head.in_features * factor, head.out_features, bias=head.bias is not None)
    if isinstance(head, nn.Sequential):
        layers = list(head)
        for i, m in enumerate(layers):
            if isinstance(m, nn.Linear):
                layers[i] = nn.Linear(
                    m.in_features * factor, m.out_features, bias=m.bias is not None
                )
                return nn.Sequential(*layers)
    raise FedshiftError(
        f"a two-branch model needs a linear head or a Sequential starting with one, not "
        f"{type(head).__name__}; pick another model"
    )


def reinitialised(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with every layer's parameters drawn afresh (same architecture)."""
    fresh = copy.deepcopy(module)
    for m in fresh.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
        if hasattr(m, "reset_running_stats"):
            m.reset_running_stats()
    return fresh


class TwoBranchModel(nn.Module):
    """Invariant and specific extractors, a classifier on their concatenation, two critics."""

    def __init__(
        self,
        model: SplitModel,
        critic_hidden: int = 512,
        critic_out: int = 128,
        critic_normalise: bool = False,
    ) -> None:
        super().__init__()
        d = int(model.feature_dim)
        self.feature_dim, self.num_classes = 2 * d, int(model.num_classes)
        self.inv = model.body
        self.spec = reinitialised(model.body)
        self.head = widen_head(model.head, 2)
        args = (d, d, critic_hidden, critic_out, critic_normalise)
        self.critic_s = SeparableCritic(*args)  # I(E_s; E_c)
        self.critic_c = SeparableCritic(*args)  # I(E_c; E_c^G)

    def forward(self, x: Tensor, return_features: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits of ``head([inv(x); spec(x)])`` (or ``(features, logits)``)."""
        features = torch.cat([self.inv(x), self.spec(x)], dim=1)
        logits = self.head(features)
        return (features, logits) if return_features else logits
