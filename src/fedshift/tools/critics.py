"""Fresh critics that read the dependence between two sets of paired features (e.g. DFL's
``E_s(x)`` and ``E_c(x)``) after the fact, as Deep InfoMax's Jensen-Shannon estimate
``Î + log 4`` (0: independent, at most ``log 4``; :func:`~fedshift.algorithms.mi.
jsd_mutual_information`):

- :func:`within_client_critic` — one fresh critic per client, trained and read on that
  client's pairs only (its negatives are shuffled *within* the client): the dependence each
  client's own Î(E_s; E_c) term sees. The figure to compare with DFL's objective;
- :func:`pooled_critic` — one critic on every client's pairs pooled ("between clients"): most
  of its negatives pair two different clients, so it also reads *which client* a pair comes
  from, up to :func:`client_only_ceiling` when the features reveal nothing else;
- :func:`client_only_ceiling` — that ceiling in closed form, from the clients' sizes;
- :func:`shuffled_within_clients` — the null control (pairs broken up inside each client).

Two critic families (``family``): ``separable``, ``T(a, b) = <g(a), h(b)>`` on unit-norm
features (:class:`~fedshift.models.two_branch.SeparableCritic`, DFL's own critic), and
``concat``, a one-hidden-layer MLP on the concatenation of the two sides standardised with the
statistics of the fit part (:class:`ConcatCritic`, :func:`_standardised`). Both start at zero
scores (a reading of exactly 0) and train with Adam.

How a critic is trained and read (:func:`fit_and_read`): the samples are split at random into
halves; the first half is split again, 3:1, into a fit part (Adam mini-batches) and a
validation part, on which the estimate is taken every ``steps // 20`` steps; the critic of the
best validation estimate is kept (early stopping; step 0, zero scores, included) and read on
the second half. Reading on the stopping set would select the luckiest of noisy values; the
second half never informs the training. ``best_step`` is where the kept critic stopped: a best
step at the last check (:attr:`CriticReading.climbing`) means the plateau was not reached.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from fedshift.algorithms.mi import jsd_mutual_information
from fedshift.core.errors import FedshiftError
from fedshift.models.two_branch import SeparableCritic

LOG4 = math.log(4.0)
FAMILIES = ("separable", "concat")


class ConcatCritic(nn.Module):
    """``T(a, b) = w · relu(W_a a + W_b b + c) + d``: a one-hidden-layer MLP on ``[a; b]``,
    scored for every pair of a batch at once (``W_a a`` and ``W_b b`` computed per sample, then
    broadcast: a ``[B, B, hidden]`` layer, never the ``[B, B, dim_a + dim_b]`` inputs). The
    output layer starts at zero, so every score starts at 0."""

    def __init__(self, dim_a: int, dim_b: int, hidden: int = 256) -> None:
        super().__init__()
        self.first_a = nn.Linear(dim_a, hidden)
        self.first_b = nn.Linear(dim_b, hidden, bias=False)
        self.out = nn.Linear(hidden, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        """The ``[B, B]`` score matrix of every (a_i, b_j) pair."""
        h = self.first_a(a)[:, None, :] + self.first_b(b)[None, :, :]
        return self.out(torch.relu(h)).squeeze(-1)


def make_critic(family: str, dim_a: int, dim_b: int, hidden: int = 256) -> nn.Module:
    """A fresh critic of ``family`` whose scores all start at 0 (the separable critic's ``h``
    side starts at zero output; the concat critic's output layer)."""
    if family == "concat":
        return ConcatCritic(dim_a, dim_b, hidden)
    if family != "separable":
        raise FedshiftError(f"unknown critic family {family!r}; pick one of {FAMILIES}")
    critic = SeparableCritic(dim_a, dim_b, hidden=hidden, out=64, normalise=True)
    for layer in (critic.h[-1], critic.h_skip):
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
    return critic


@dataclass(frozen=True)
class CriticReading:
    """A fresh critic's ``Î + log 4``: ``mean`` and ``sd`` over the clients' ``values`` (one
    value for a pooled critic), each critic's ``best_step`` of ``steps``, and for a pooled
    critic the ``ceiling`` that client identity alone reaches (:func:`client_only_ceiling`)."""

    mean: float
    sd: float
    values: tuple[float, ...]
    best_steps: tuple[int, ...]
    steps: int
    ceiling: float | None = None

    @property
    def climbing(self) -> int:
        """How many critics were best at their last check (still rising: no plateau seen)."""
        return sum(s >= self.steps for s in self.best_steps)

    def as_dict(self) -> dict:
        return {**asdict(self), "climbing": self.climbing}


def client_only_ceiling(sizes: list[int] | tuple[int, ...]) -> float:
    """``2·JSD`` (= the best ``Î + log 4``) of a pooled critic whose pairs reveal only their
    client, for clients of ``sizes`` samples (a pair's two sides always come from one client).

    With ``p_k = n_k / N``, the joint puts ``p_k`` on each pair (k, k) and the product of the
    marginals ``p_i p_j`` on every (i, j); with ``M`` their mixture,
    ``2·JSD = KL(P‖M) + KL(Q‖M)
    = Σ_k p_k log(2 / (1 + p_k)) + Σ_k p_k² log(2 p_k / (1 + p_k)) + (1 − Σ_k p_k²) log 2``.
    For K equal clients: ``log(2K/(K+1)) + log(2/(K+1))/K + (1 − 1/K) log 2`` (K = 20: 1.185,
    K = 1: 0, K → ∞: log 4)."""
    total = float(sum(sizes))
    p = [n / total for n in sizes if n > 0]
    if not p:
        raise FedshiftError("client_only_ceiling needs at least one client with samples")
    kl_p = sum(q * math.log(2.0 / (1.0 + q)) for q in p)
    kl_q = sum(q * q * math.log(2.0 * q / (1.0 + q)) for q in p)
    return kl_p + kl_q + (1.0 - sum(q * q for q in p)) * math.log(2.0)


def shuffled_within_clients(b: Tensor, client: Tensor, seed: int = 0) -> Tensor:
    """``b`` with its rows permuted inside each client: every client keeps its own features
    (its marginal) but loses the pairing, so a within-client critic should read about 0."""
    g = torch.Generator().manual_seed(seed)
    out = b.clone()
    for k in client.unique():
        idx = (client == k).nonzero().squeeze(1)
        out[idx] = b[idx[torch.randperm(len(idx), generator=g)]]
    return out


def _split(n: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """(fit, validation, read) indices of ``n`` samples: halves, the first cut 3:1."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    half = perm[: n // 2]
    cut = max(1, (3 * len(half)) // 4)
    return half[:cut], half[cut:], perm[n // 2 :]


def _prepare(family: str, a: Tensor, b: Tensor, fit: Tensor) -> tuple[Tensor, Tensor]:
    """Float copies of the features; for ``concat`` standardised by the fit part's statistics
    (the separable critic normalises each vector itself)."""
    a, b = a.detach().float().flatten(1), b.detach().float().flatten(1)
    if family == "concat":
        a, b = _standardised(a, fit), _standardised(b, fit)
    return a, b


def _standardised(x: Tensor, fit: Tensor) -> Tensor:
    """``x`` standardised per feature by the fit rows' mean and sd; an sd under a tenth of the
    mean sd counts as that tenth (a feature nearly constant on the fit rows, e.g. a ReLU unit
    that is rarely on, would otherwise be blown up on the held-out ones)."""
    std = x[fit].std(0)
    return (x - x[fit].mean(0)) / std.clamp_min(0.1 * float(std.mean()) + 1e-6)


@torch.no_grad()
def read_estimate(critic: nn.Module, a: Tensor, b: Tensor, idx: Tensor, batch: int) -> float:
    """``Î + log 4`` of ``critic`` on the pairs ``idx``: the mean of the estimate over
    consecutive chunks of ``batch`` pairs (each chunk's negatives are its own shuffled pairs)."""
    chunks = [i for i in idx.split(batch) if len(i) > 1]
    if not chunks:
        return float("nan")
    vals = [float(jsd_mutual_information(critic(a[i], b[i]))) for i in chunks]
    return sum(vals) / len(vals) + LOG4


def fit_and_read(
    a: Tensor,
    b: Tensor,
    family: str = "separable",
    steps: int = 400,
    batch: int = 256,
    lr: float = 1e-3,
    hidden: int = 256,
    seed: int = 0,
) -> tuple[float, int]:
    """(``Î + log 4`` read on the held-out half, the kept critic's step) of a fresh critic of
    ``family`` trained on the pairs ``(a_i, b_i)`` (see the module docstring: fit part,
    validation part for early stopping, read half)."""
    fit, val, read = _split(len(a), seed)
    a, b = _prepare(family, a, b, fit)
    torch.manual_seed(seed)
    critic = make_critic(family, a.shape[1], b.shape[1], hidden)
    opt = torch.optim.Adam(critic.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)
    every = max(1, steps // 20)
    best, best_step = read_estimate(critic, a, b, val, batch), 0
    best_state = copy.deepcopy(critic.state_dict())
    for step in range(1, steps + 1):
        i = fit[torch.randperm(len(fit), generator=g)[:batch]]
        opt.zero_grad()
        (-jsd_mutual_information(critic(a[i], b[i]))).backward()
        opt.step()
        if step % every == 0 or step == steps:
            est = read_estimate(critic, a, b, val, batch)
            if est > best:
                best, best_step, best_state = est, step, copy.deepcopy(critic.state_dict())
    critic.load_state_dict(best_state)
    return read_estimate(critic, a, b, read, batch), best_step


def _reading(values: list[float], steps_at: list[int], steps: int, **kw) -> CriticReading:
    t = torch.tensor(values, dtype=torch.float64)
    sd = float(t.std()) if len(values) > 1 else 0.0
    return CriticReading(float(t.mean()), sd, tuple(values), tuple(steps_at), steps, **kw)


def within_client_critic(
    a: Tensor, b: Tensor, client: Tensor, family: str = "separable", seed: int = 0, **kw
) -> CriticReading:
    """One fresh critic per client (:func:`fit_and_read` on that client's pairs only, so its
    mini-batches, negatives and held-out half all come from the one client): the mean and
    spread over clients of the dependence between ``a`` and ``b`` *inside* a client, where
    knowing the client tells nothing. ``client``: each row's client id; ``kw``:
    :func:`fit_and_read`'s training settings."""
    values, at = [], []
    for k in client.unique().tolist():
        idx = (client == k).nonzero().squeeze(1)
        v, s = fit_and_read(a[idx], b[idx], family, seed=seed + 1000 * int(k), **kw)
        values.append(v)
        at.append(s)
    return _reading(values, at, kw.get("steps", 400))


def pooled_critic(
    a: Tensor, b: Tensor, client: Tensor, family: str = "separable", seed: int = 0, **kw
) -> CriticReading:
    """One fresh critic on every client's pairs pooled ("between clients"): its negatives pair
    mostly different clients, so it reads the client as well as any dependence inside it;
    ``ceiling`` is what the client alone reaches (:func:`client_only_ceiling` of the sizes)."""
    v, s = fit_and_read(a, b, family, seed=seed, **kw)
    sizes = torch.bincount(client.long() - int(client.min())).tolist()
    return _reading([v], [s], kw.get("steps", 400), ceiling=client_only_ceiling(sizes))
