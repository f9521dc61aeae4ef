"""A two-branch classifier and the critic networks of neural mutual-information estimators.

:class:`TwoBranchModel` is DFL's client network (spec dfl.md §2.2): two extractors of the same
architecture, ``inv`` (domain-invariant, E_c) and ``spec`` (domain-specific, E_s), and a
classifier ``head`` reading the concatenation ``[inv(x); spec(x)]``. It is made from any
:class:`~fedshift.models.base.SplitModel`: ``inv`` is the model's body, ``spec`` a freshly
initialised copy of it, ``head`` the model's head with its first linear layer widened to the
concatenated features (:class:`PairHead`, which never builds the concatenation). The MI critics live in the same module (``critic_s``, ``critic_c``) so
that one parameter dict holds the whole client and the executors train it like any model.

Every critic maps two feature batches ``a``, ``b`` to a ``[B, B]`` matrix over all pairs
``(a_i, b_j)``, the joint pairs on the diagonal (:func:`make_critic` builds one by kind):

- :class:`SeparableCritic`: ``S[i, j] = <g(a_i), h(b_j)>`` (Deep InfoMax's "encoder-and-dot"
  critic, the default);
- :class:`ConcatCritic`: ``S[i, j] = MLP([a_i; b_j])``, one scalar per pair (MINE-style);
- :class:`ClubCritic`: CLUB's variational Gaussian ``q(b | a)``; ``L[i, j] = log q(b_j | a_i)``
  up to a constant (Cheng et al., ICML 2020; not in DFL's paper).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshift.core.errors import FedshiftError
from fedshift.models.base import SplitModel


def _encoder(dim: int, hidden: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, out))


def standardised(x: Tensor) -> Tensor:
    """Each vector to zero mean and unit variance over its features (per sample: neither the
    batch's composition nor padded rows enter)."""
    return F.layer_norm(x, x.shape[-1:])


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


class ConcatCritic(nn.Module):
    """``T(a, b) = MLP([a; b])``: Linear(d_a + d_b, hidden), ReLU, Linear(hidden, out), ReLU,
    Linear(out, 1), scored on all ``B x B`` pairs of a batch. The first layer is computed
    per half (``W_a a_i + W_b b_j``, drawn as one layer of the concatenation), so the pairs cost
    ``B^2 x hidden x out``, not a ``[B^2, d_a + d_b]`` input. ``normalise``: each input vector
    standardised first (:func:`standardised`), so the scores do not grow with the features."""

    def __init__(
        self, dim_a: int, dim_b: int, hidden: int = 512, out: int = 128, normalise: bool = False
    ) -> None:
        super().__init__()
        whole = nn.Linear(dim_a + dim_b, hidden)
        self.first_a, self.first_b = nn.Linear(dim_a, hidden), nn.Linear(dim_b, hidden, bias=False)
        with torch.no_grad():
            self.first_a.weight.copy_(whole.weight[:, :dim_a])
            self.first_a.bias.copy_(whole.bias)
            self.first_b.weight.copy_(whole.weight[:, dim_a:])
        self.rest = nn.Sequential(nn.ReLU(), nn.Linear(hidden, out), nn.ReLU(), nn.Linear(out, 1))
        self.normalise = normalise

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        """The ``[B, B]`` score matrix of every (a_i, b_j) pair."""
        if self.normalise:
            a, b = standardised(a), standardised(b)
        h = self.first_a(a)[:, None, :] + self.first_b(b)[None, :, :]
        return self.rest(h).squeeze(-1)


class ClubCritic(nn.Module):
    """CLUB's variational net (Cheng et al., ICML 2020): ``q(b | a)`` a Gaussian with mean
    ``mu(a)`` and log-variance ``logvar(a)`` (each Linear(d_a, hidden), ReLU, Linear(hidden,
    d_b); the log-variance through tanh, as in the paper). ``forward`` gives the ``[B, B]``
    matrix ``L[i, j] = -1/2 sum_k ((b_jk - mu_ik)^2 / var_ik + logvar_ik)``, i.e. ``log q(b_j |
    a_i)`` without its constant, by three matrix products. ``normalise``: inputs standardised
    (:func:`standardised`), so the targets have unit scale."""

    def __init__(
        self, dim_a: int, dim_b: int, hidden: int = 512, out: int = 128, normalise: bool = False
    ) -> None:
        super().__init__()
        self.mu = _encoder(dim_a, hidden, dim_b)
        self.logvar = nn.Sequential(_encoder(dim_a, hidden, dim_b), nn.Tanh())
        self.normalise = normalise

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        if self.normalise:
            a, b = standardised(a), standardised(b)
        mu, logvar = self.mu(a), self.logvar(a)
        prec = torch.exp(-logvar)  # [B, d]
        sq = prec @ (b * b).T - 2 * (mu * prec) @ b.T + (mu * mu * prec).sum(-1, keepdim=True)
        return -0.5 * (sq + logvar.sum(-1, keepdim=True))


CRITICS = {"separable": SeparableCritic, "concat": ConcatCritic, "club": ClubCritic}


def make_critic(kind: str, dim_a: int, dim_b: int, hidden: int, out: int, normalise: bool):
    """A critic of ``kind`` (``separable``, ``concat`` or ``club``, see the module docstring)."""
    return CRITICS[kind](dim_a, dim_b, hidden, out, normalise)


class PairHead(nn.Module):
    """A classifier on the concatenation ``[a; b]`` of two feature vectors, computed without
    concatenating: its first linear layer ``W [a; b] + c`` is ``W_a a + c + W_b b``, held as
    two layers ``first_a`` (``W_a``, ``c``) and ``first_b`` (``W_b``), drawn together as one
    ``Linear(2d, h)`` (the initialisation of a widened head).

    ``b`` may carry leading dimensions of its own (``[J, B, d]``: J alternatives for the same
    ``a``, e.g. DFL's transferred specific features); ``W_a a`` is then computed once for all
    J instead of J times. ``pre`` are the layers before the first linear one (applied to each
    half), ``rest`` those after it (with normalisation layers: per leading index, as on
    separate batches)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        layers = [head] if isinstance(head, nn.Linear) else list(head.children())
        at = next((i for i, m in enumerate(layers) if isinstance(m, nn.Linear)), None)
        if at is None or not isinstance(head, nn.Linear | nn.Sequential):
            raise FedshiftError(
                f"a two-branch model needs a linear head or a Sequential with a linear layer, "
                f"not {type(head).__name__}; pick another model"
            )
        lin = layers[at]
        self.pre = nn.Sequential(*copy.deepcopy(layers[:at]))
        whole = nn.Linear(2 * lin.in_features, lin.out_features, bias=lin.bias is not None)
        self.first_a = nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
        self.first_b = nn.Linear(lin.in_features, lin.out_features, bias=False)
        with torch.no_grad():
            self.first_a.weight.copy_(whole.weight[:, : lin.in_features])
            self.first_b.weight.copy_(whole.weight[:, lin.in_features :])
            if lin.bias is not None:
                self.first_a.bias.copy_(whole.bias)
        self.rest = nn.Sequential(*copy.deepcopy(layers[at + 1 :]))
        norms = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
        self._per_index = any(isinstance(m, norms) for m in self.rest.modules())

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        lead = b.shape[: b.ndim - a.ndim]  # b's own leading dimensions (J alternatives)
        a, b = self.pre(a), _per_index(self.pre, b, len(lead))
        h = self.first_a(a) + self.first_b(b)
        return _per_index(self.rest, h, len(lead)) if self._per_index else self.rest(h)


def _per_index(f: nn.Module, x: Tensor, lead: int) -> Tensor:
    """``f`` applied to ``x[i]`` for every index of its first ``lead`` dimensions."""
    if not lead or not len(f):
        return f(x)
    flat = x.flatten(0, lead - 1)  # a loop, not vmap: BatchNorm updates its running statistics
    return torch.stack([f(xi) for xi in flat]).unflatten(0, x.shape[:lead])


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
    """Invariant and specific extractors, a classifier on their concatenation, two critics
    (``critic_kinds``: those of T_s and T_c, see :func:`make_critic`)."""

    def __init__(
        self,
        model: SplitModel,
        critic_hidden: int = 512,
        critic_out: int = 128,
        critic_normalise: bool = False,
        critic_kinds: tuple[str, str] = ("separable", "separable"),
    ) -> None:
        super().__init__()
        d = int(model.feature_dim)
        self.feature_dim, self.num_classes = 2 * d, int(model.num_classes)
        self.inv = model.body
        self.spec = reinitialised(model.body)
        self.head = PairHead(model.head)
        args = (d, d, critic_hidden, critic_out, critic_normalise)
        self.critic_s = make_critic(critic_kinds[0], *args)  # I(E_s; E_c)
        self.critic_c = make_critic(critic_kinds[1], *args)  # I(E_c; E_c^G)

    def forward(self, x: Tensor, return_features: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits of ``head([inv(x); spec(x)])`` (or ``(features, logits)``)."""
        zc, zs = self.inv(x), self.spec(x)
        logits = self.head(zc, zs)
        return (torch.cat([zc, zs], dim=1), logits) if return_features else logits
