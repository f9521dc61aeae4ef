"""Server optimisers on FedAvg's pseudo-gradient, as named algorithms: FedAvgM (Hsu, Qi &
Brown, 2019) and the FedOpt family of Reddi et al. (ICLR 2021): FedAdam, FedYogi, FedAdagrad.

Clients train exactly as in FedAvg; the server treats ``Δ = mean_i(y_i) − x`` as a
pseudo-gradient and takes a step of its optimiser (the update rules are in
:mod:`fedshift.algorithms.server_opt`, shared with ``train.server_optimizer``, which puts the
same optimisers on any algorithm that averages models: FedAdam on FedProx, FedYogi on FedRC).

Hyper-parameters, named as in the papers:

- FedAvgM: ``server_lr`` (1.0) and ``server_momentum`` β (0.9; Hsu et al. sweep β in
  {0.7, 0.9, 0.97, 0.99} and use η = 1 with momentum as their main setting).
- FedAdam / FedYogi / FedAdagrad: ``server_lr`` η, ``beta1`` (0.9), ``beta2`` (0.99) and the
  adaptivity ``tau`` (1e-3), Reddi et al.'s defaults for β1, β2 and τ. The paper tunes η per task
  over a grid of powers of ten; our defaults, 0.01 for FedAdam and FedYogi and 0.1 for
  FedAdagrad (whose accumulated ``v`` only grows), are the orders of their tuned CIFAR-10
  values, not universal choices: tune η with the run's lr.

No bias correction (the paper's Algorithm 2 has none); ``v`` starts at τ².
"""

from __future__ import annotations

from pydantic import Field

from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register
from fedshift.algorithms.server_opt import ServerOptimizer


class FedAvgMParams(FedAvgParams):
    server_lr: float = Field(default=1.0, gt=0, description="server learning rate (eta)")
    server_momentum: float = Field(
        default=0.9, ge=0, lt=1, description="server momentum (beta) on the pseudo-gradient"
    )


class FedOptParams(FedAvgParams):
    server_lr: float = Field(default=0.01, gt=0, description="server learning rate (eta)")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="first-moment decay")
    beta2: float = Field(default=0.99, ge=0, lt=1, description="second-moment decay")
    tau: float = Field(default=1e-3, gt=0, description="adaptivity (degree of adaptivity)")


@register
class FedAvgM(FedAvg):
    """FedAvg with server momentum: m ← β·m + Δ, x ← x + η·m."""

    name = "fedavgm"
    paper = (
        'Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data Distribution for '
        'Federated Visual Classification", arXiv 2019'
    )
    Params = FedAvgMParams

    def server_optimizer(self) -> ServerOptimizer:
        return ServerOptimizer("sgd", lr=self.hp.server_lr, momentum=self.hp.server_momentum)


class _FedOpt(FedAvg):
    """FedAvg's clients with an adaptive server optimiser (``kind``)."""

    kind: str
    Params = FedOptParams
    paper = 'Reddi et al., "Adaptive Federated Optimization", ICLR 2021'

    def server_optimizer(self) -> ServerOptimizer:
        hp = self.hp
        return ServerOptimizer(
            self.kind, lr=hp.server_lr, beta1=hp.beta1, beta2=hp.beta2, tau=hp.tau
        )


@register
class FedAdam(_FedOpt):
    """Adam on the server: v ← β2·v + (1−β2)·Δ²."""

    name = "fedadam"
    kind = "adam"


@register
class FedYogi(_FedOpt):
    """Yogi on the server: v ← v − (1−β2)·Δ²·sign(v − Δ²)."""

    name = "fedyogi"
    kind = "yogi"


class FedAdagradParams(FedOptParams):
    server_lr: float = Field(default=0.1, gt=0, description="server learning rate (eta)")


@register
class FedAdagrad(_FedOpt):
    """Adagrad on the server: v ← v + Δ² (its sum only grows, so its default η is 10x
    FedAdam's, as in Reddi et al.'s tuned values for CIFAR-10)."""

    name = "fedadagrad"
    kind = "adagrad"
    Params = FedAdagradParams
