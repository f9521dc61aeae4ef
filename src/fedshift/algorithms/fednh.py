"""FedNH (Dai et al., AAAI 2023): class prototypes fixed on the unit sphere as the classifier.

The head is a matrix of class prototypes W [C, d] with unit rows and a scale s: logits are
``s * W f / ||f||`` (scaled cosine, no bias) of the body features f. The server initialises W
uniformly spread on the sphere; clients never train W (it is a buffer, so local SGD leaves it
alone) and train the body and s. After local training each client sends the class means of its
normalised features (its local prototypes, :func:`local_prototypes`); the server averages the
bodies as FedAvg does and moves every prototype towards the clients' mean, ``W_c <- normalise(
rho W_c + (1 - rho) mean_c)`` with rho = 0.9 (:func:`update_prototypes`), so class semantics
slowly enter the initially uniform prototypes. FedNH keeps no per-client state: a client's
personalised model is its latest local model (not ``Personalised``: the evaluator scores
it, see :mod:`fedshift.reporting.protocols`).

Paper vs the authors' code (spec fednh.md §2.3, §2.5, §7), all selectable:

- ``init``: ``orthogonal`` (code default; orthonormal rows, pairwise cosine 0; the paper's
  numbers come from it), ``maxmin`` (the paper's Eq. 1, max-min pairwise distance on the sphere:
  solved exactly by the simplex ETF when C <= d, numerically otherwise).
- ``prototype_average``: ``code`` (default: client means renormalised, averaged weighted by the
  clients' class counts over the owners of the class, renormalised before the EMA; a class no
  sampled client owns is left unchanged) or ``paper`` (Algorithm 1: plain means averaged with
  alpha = 1/|S|, zero for clients without the class).
- ``scale_init`` / ``learn_scale``: the code trains s from 1.0 (CNN) or 20.0 (ResNet-18) and
  averages it with the body; ``learn_scale=false`` fixes it, by default at 30 (the paper's
  Eq. 2). ``scale_init`` unset: 1.0 when s is learned, 30 when it is fixed.
- ``weighting`` (from FedAvg): uniform by default, as Algorithm 1 (alpha = 1/|S|) and the code
  average the bodies; ``samples`` weights clients by their sample counts.

``rho = 1`` keeps the initial prototypes for good: the "uniform head" ablation (FedUH).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
    as_float,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register

EPS = 1e-12
#: default s: trained from 1.0 (the code's CNN), or fixed at 30 (the paper's Eq. 2)
LEARNED_SCALE_INIT, FIXED_SCALE = 1.0, 30.0


# ---------------------------------------------------------------------- the math
def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm (zero rows stay zero), as ``F.normalize`` (eps 1e-12)."""
    return F.normalize(x, dim=-1, eps=EPS)


def simplex_etf(num_classes: int, dim: int, generator: torch.Generator | None = None):
    """C unit vectors in R^d with pairwise inner product -1/(C-1): the optimum of FedNH's
    Eq. (1) (max-min pairwise distance on the sphere) for 2 <= C <= d."""
    C, d = num_classes, dim
    if not 2 <= C <= d:
        raise ValueError(f"the simplex ETF needs 2 <= classes <= dim, got C={C}, d={d}")
    u, _ = torch.linalg.qr(torch.randn(d, C, generator=generator, dtype=torch.float64))
    center = torch.eye(C, dtype=torch.float64) - 1.0 / C
    return (math.sqrt(C / (C - 1)) * (u @ center)).T.to(torch.get_default_dtype())


def spread_on_sphere(
    num_classes: int, dim: int, steps: int = 2000, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Numerical solution of Eq. (1) when no closed form applies: projected gradient descent
    on the sphere minimising a soft maximum (log-sum-exp) of the pairwise cosines."""
    w = normalize_rows(torch.randn(num_classes, dim, generator=generator, dtype=torch.float64))
    off = ~torch.eye(num_classes, dtype=torch.bool)
    for t in range(steps):
        w.requires_grad_(True)
        tau = 10.0 + 90.0 * t / max(1, steps - 1)  # sharpen the soft maximum over time
        loss = torch.logsumexp(tau * (w @ w.T)[off], dim=0) / tau
        (g,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w = normalize_rows(w - 0.05 * g)
    return w.detach().to(torch.get_default_dtype())


def init_prototypes(
    kind: str, num_classes: int, dim: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Initial prototypes [C, d] with unit rows: ``orthogonal`` (the code's
    ``orthogonal_(rand(C, d))``; orthonormal rows when C <= d) or ``maxmin`` (Eq. 1)."""
    C, d = num_classes, dim
    if kind == "orthogonal":
        w = torch.rand(C, d, generator=generator)
        return normalize_rows(nn.init.orthogonal_(w, generator=generator))
    if kind == "maxmin":
        if C == 1:
            return normalize_rows(torch.randn(1, d, generator=generator))
        if d >= C:
            return simplex_etf(C, d, generator)
        return spread_on_sphere(C, d, generator=generator)
    raise ValueError(f"unknown prototype init {kind!r}; allowed: orthogonal, maxmin")


def cosine_logits(features: torch.Tensor, prototypes: torch.Tensor, scale: torch.Tensor):
    """FedNH's classifier: ``s * <W_c, f / max(||f||, 1e-12)>`` for every class c."""
    return scale * normalize_rows(features) @ prototypes.T


def local_prototypes(
    features: torch.Tensor, y: torch.Tensor, num_classes: int, mode: str = "code"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's class statistics of its normalised features: (vectors [C, d], counts [C]).

    ``code``: n_c * normalise(mean_c), so a count-weighted sum over clients divided by the
    summed counts is the count-weighted mean of the unit means. ``paper``: the plain means
    mu_c of Eq. (3). Classes the client lacks get a zero vector and count 0.
    """
    z = normalize_rows(as_float(features))
    counts = torch.bincount(y, minlength=num_classes).to(z.dtype)
    sums = torch.zeros(num_classes, z.shape[1], dtype=z.dtype, device=z.device)
    sums.index_add_(0, y, z)
    means = sums / counts.clamp_min(1).unsqueeze(1)
    if mode == "paper":
        return means, counts
    return counts.unsqueeze(1) * normalize_rows(means), counts


def update_prototypes(
    protos: torch.Tensor,
    vec_sum: torch.Tensor,
    count_sum: torch.Tensor,
    num_clients: int,
    rho: float,
    mode: str = "code",
) -> torch.Tensor:
    """The server's prototype step, Eq. (4): ``normalise(rho W + (1 - rho) mean)``.

    ``vec_sum`` / ``count_sum`` are the sums over the round's clients of
    :func:`local_prototypes`. ``code``: mean_c = normalise(vec_sum_c / count_sum_c), zero for
    a class nobody owns (which then keeps its prototype); ``paper``: mean_c = vec_sum_c /
    num_clients (alpha_k = 1/|S|).
    """
    if mode == "paper":
        mean = vec_sum / max(1, num_clients)
    else:
        mean = normalize_rows(vec_sum / count_sum.clamp_min(EPS).unsqueeze(1))
        mean = torch.where(count_sum.unsqueeze(1) > 0, mean, torch.zeros_like(mean))
    return normalize_rows(rho * protos + (1.0 - rho) * mean.to(protos.dtype))


class CosineHead(nn.Module):
    """Bias-free scaled-cosine classifier over fixed prototypes (a buffer, never trained)."""

    def __init__(
        self, dim: int, num_classes: int, init: str, scale_init: float, learn_scale: bool
    ) -> None:
        super().__init__()
        self.register_buffer("prototypes", init_prototypes(init, num_classes, dim))
        scale = torch.tensor([float(scale_init)])
        if learn_scale:
            self.scale = nn.Parameter(scale)
        else:
            self.register_buffer("scale", scale)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return cosine_logits(features, self.prototypes, self.scale)


# ---------------------------------------------------------------------- the algorithm
class FedNHParams(FedAvgParams):
    weighting: Literal["samples", "uniform"] = Field(
        default="uniform", description="client weights of the body average (Alg. 1: uniform)"
    )
    rho: float = Field(default=0.9, ge=0, le=1, description="prototype smoothing (EMA weight)")
    init: Literal["orthogonal", "maxmin"] = Field(
        default="orthogonal", description="prototype init: the code's (orthogonal) or Eq. 1"
    )
    scale_init: float | None = Field(
        default=None,
        gt=0,
        description="initial s (None: 1 when learned, as the code's CNN; 30 when fixed, Eq. 2)",
    )
    learn_scale: bool = Field(default=True, description="train s (code) or keep it fixed")
    prototype_average: Literal["code", "paper"] = Field(
        default="code", description="how client prototypes are averaged (see module doc)"
    )


@register
class FedNH(FedAvg):
    """FedAvg of the body (and s) with fixed-then-smoothed class prototypes as the head."""

    name = "fednh"
    paper = (
        'Dai et al., "Tackling Data Heterogeneity in Federated Learning with '
        'Class Prototypes", AAAI 2023'
    )
    Params = FedNHParams
    premise = "long_tail"

    @classmethod
    def adapt_model(cls, model: nn.Module, hp: FedNHParams) -> nn.Module:
        scale = hp.scale_init
        if scale is None:
            scale = LEARNED_SCALE_INIT if hp.learn_scale else FIXED_SCALE
        model.head = CosineHead(
            model.feature_dim, model.num_classes, hp.init, scale, hp.learn_scale
        )
        return model

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        feats = []
        module = self.ops.module
        was = module.training
        module.eval()
        with torch.no_grad():
            for i in range(0, data.num_train, data.eval_batch):
                x = data.inputs(data.train_idx[i : i + data.eval_batch])
                feats.append(self.ops.forward(params[0], buffers[0], x, features=True)[0])
        module.train(was)
        if not feats:
            return {}
        vec, count = local_prototypes(
            torch.cat(feats), data.y_train, self.num_classes, self.hp.prototype_average
        )
        return {"proto_vec": vec, "proto_count": count}

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        acc: dict[str, Any] = {"vec": None, "count": None, "n": 0}

        def tap():  # collect the prototype statistics while FedAvg averages the models
            for r in results:
                if "proto_vec" in r.upload:
                    v, c = r.upload["proto_vec"], r.upload["proto_count"]
                    acc["vec"] = v.clone() if acc["vec"] is None else acc["vec"] + v
                    acc["count"] = c.clone() if acc["count"] is None else acc["count"] + c
                    acc["n"] += 1
                yield r

        new = super().aggregate(server, tap(), ctx)
        if acc["vec"] is None:
            return new
        key = "head.prototypes"
        buffers = dict(new["buffers"])
        buffers[key] = update_prototypes(
            server["buffers"][key],
            acc["vec"],
            acc["count"],
            acc["n"],
            self.hp.rho,
            self.hp.prototype_average,
        )
        return {**new, "buffers": buffers}
