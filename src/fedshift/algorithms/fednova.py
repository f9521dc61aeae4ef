"""FedNova (Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020): normalised averaging, so that clients that
take more local steps do not pull the global model towards their own objective.

Clients train exactly as in FedAvg (local SGD from the global model ``x``); client ``i`` takes
``τ_i`` steps (``ClientResult.steps``, unequal e.g. under ``train.local_epochs_max``, where
each client draws its local epochs per round). The server normalises each client's change by
its number of effective steps and rescales the average by the mean effective steps::

    a_i     = τ_i                                           (plain SGD)
    a_i     = [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)] / (1 − ρ)       (SGD with momentum ρ)
    d_i     = (x − y_i) / a_i                               (normalised update)
    τ_eff   = Σ_i p_i a_i,   p_i = n_i / Σ_j n_j            (over the sampled clients)
    x      ← x − τ_eff Σ_i p_i d_i

``a_i`` is the sum of the momentum counters ``1, 1 + ρ, 1 + ρ + ρ², ...`` over the client's
steps (the ℓ1 norm of the paper's vector ``a_i``); with ``ρ = 0`` it is ``τ_i``. With equal
steps every ``a_i`` is the same and the update is FedAvg's ``x ← Σ_i p_i y_i``.

Hyper-parameters: ``weighting`` (FedAvg's: ``samples`` gives the paper's ``p_i = n_i/n``,
``uniform`` gives ``p_i = 1/|S|``). FedNova has none of its own: ``ρ`` is the run's
``train.momentum``.

Choices and differences from the paper and the authors' code (JYWa/FedNova):

- ``τ_eff = Σ p_i a_i``, as the authors' code computes it (without a proximal term); the paper
  writes ``τ_eff = Σ p_i τ_i`` for plain SGD, which is the same when ``ρ = 0``. With momentum
  only ``Σ p_i a_i`` keeps "equal steps = FedAvg".
- The normaliser assumes each round's momentum buffers start at zero, as in the authors' code
  (it zeroes them after every round) and the engine's default. With ``train.keep_momentum``
  the buffers carry earlier rounds' gradients into the first steps, which ``a_i`` does not
  count: the normalisation is then approximate.
- Weight decay and gradient clipping act inside the local steps and do not change ``a_i``
  (as in the code). A phase with its own momentum is not used (FedNova trains one stage).
- The authors' server momentum (``gmf``) and FedNova + proximal term are not separate
  options: a server optimiser on the aggregate is ``train.server_optimizer`` (e.g. sgd with
  momentum), a proximal term is FedProx's.
- Buffers (BatchNorm statistics) are averaged with the weights ``p_i``, as FedAvg does.
- A client that took no step (or has no sample) does not count in the average.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fedshift.algorithms.base import ClientResult, RoundContext, RunningAverage, State, TensorDict
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, client_weight
from fedshift.algorithms.registry import register


def effective_steps(steps: int, momentum: float) -> float:
    """FedNova's ``a_i``: ``τ`` for plain SGD, ``[τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ)`` with
    momentum ``ρ`` (the sum over the steps of ``1 + ρ + ... + ρ^(j−1)``)."""
    if steps <= 0:
        return 0.0
    rho = float(momentum)
    if rho == 0.0:
        return float(steps)
    return (steps - rho * (1.0 - rho**steps) / (1.0 - rho)) / (1.0 - rho)


def normalised_update(x: TensorDict, y: TensorDict, a: float) -> TensorDict:
    """A client's normalised update ``d_i = (x − y_i) / a_i`` (floating tensors only)."""
    return {k: (x[k] - y[k]) / a for k in x if torch.is_floating_point(x[k])}


def fednova_step(x: TensorDict, d_mean: TensorDict, tau_eff: float) -> TensorDict:
    """The server step ``x − τ_eff · Σ p_i d_i`` (``d_mean``: the p-weighted mean of the d_i);
    tensors without an update keep x's value."""
    return {k: (x[k] - tau_eff * d_mean[k]) if k in d_mean else x[k] for k in x}


@register
class FedNova(FedAvg):
    """FedAvg's clients; the server averages the clients' changes normalised by their
    effective local steps and rescales by the mean effective steps."""

    name = "fednova"
    paper = (
        'Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated '
        'Optimization", NeurIPS 2020'
    )
    Params = FedAvgParams
    premise = "iid"

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        x, rho = server["params"], self.train_defaults.momentum
        d_avg, buffers = RunningAverage(), RunningAverage()
        weighted_a = 0.0
        for r in results:
            w = client_weight(r, self.hp.weighting)
            a = effective_steps(r.steps, rho)
            if w <= 0 or a <= 0:
                continue
            d_avg.add(normalised_update(x, r.params[0], a), w)
            buffers.add(r.buffers[0], w)
            weighted_a += w * a
        if d_avg.sums is None:
            return server
        tau_eff = weighted_a / d_avg.total
        return {
            **server,
            "params": fednova_step(x, d_avg.result(), tau_eff),
            "buffers": buffers.result() if buffers.sums else {},
        }
