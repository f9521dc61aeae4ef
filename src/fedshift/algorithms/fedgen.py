"""FedGen (Zhu, Hong & Zhou, ICML 2021): data-free knowledge distillation with a server-side
generator of latent features; a baseline of DFL's Table 1 (spec dfl.md §4).

The server keeps a FedAvg global model (sample-weighted average of the participants) and a
small generator ``G(y, ε)`` of the *latent* input ``z`` of the classifier's last linear layer
(the 512-d input of ``convbn_cnn``'s last ``Linear``; the body's features for a one-layer head):
``[ε; one-hot(y)] -> Linear(hidden) -> BatchNorm1d -> ReLU -> Linear(latent)``.

- *Server*, every round after the clients trained: ``(ensemble_epochs // n_teacher_iters) ·
  n_teacher_iters`` Adam steps on G (lr decayed by ``gen_lr_decay`` per round, as the code's
  ``ExponentialLR``; Adam's moments persist across rounds). Each step draws labels uniformly
  from those the participants hold and minimises ``ensemble_alpha · Σ_i mean_b w_i(y_b)·
  CE(last_i(z_b), y_b) + ensemble_eta · diversity`` over the participants' trained last layers
  ``last_i``, with ``w_i(y) = n_i(y) / Σ_j n_j(y)`` (:func:`teacher_weights`) and FedGen's
  :func:`diversity_loss`. The server's student term (``ensemble_beta``) is 0 in the code's
  defaults and is left out.
- *Client*, from the second round on (the code's ``glob_iter > 0``): ``CE(model(x), y) +
  (gen_batch_size / B) · α_t · CE(last(G(ŷ)), ŷ) + β_t · KL(softmax(last(G(y))) ‖ model(x))``
  (batch-mean KL, target detached), ŷ drawn uniformly from the labels the server has seen; G is
  frozen (eval mode), so the second term trains the last layer only. ``α_t = max(1e-4,
  generative_alpha · decay^t)``, likewise β_t, t the 0-based round. Round 1 is plain FedAvg.
- *Prediction*: the global model, as FedAvg.

Choices and differences from the code (``zhuangdizhu/FedGen``):

- ε is uniform on [0, 1) as the code draws it (``torch.rand``, though the paper and the code's
  comment say Gaussian); ``noise="normal"`` draws N(0, I).
- Clients' label counts ``n_i(y)`` are their train split's histogram plus ``count_prior``; the
  code counts the labels of the batches trained in the round, each count starting at 1.
- The teacher loss weighs each sample by ``w_i(y_b)``; the code's ``mean(nll * weight)``
  broadcasts [B] against [B, 1], i.e. ``mean_b(CE) · mean_b(w_i(y_b))``.
- The clients' label set is every label the server has seen in uploads so far; the code knows
  every client's labels from the start.
- Random draws: the server's from a generator of (seed, round); a client's ε and ŷ of every
  local step are drawn in :meth:`client_task` from (seed, round, client) and indexed by
  ``Batch.step``, so both executors see the same draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cached_property
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    ModelOps,
    Phase,
    RoundContext,
    State,
    TensorDict,
    as_float,
    clone_params,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, average_models
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import GlobalModel
from fedshift.core.seeds import derive_seed

#: the stream id of FedGen's random draws (unused in :mod:`fedshift.core.seeds`, where it belongs)
FEDGEN_STREAM = 60


class FedGenParams(FedAvgParams):
    noise_dim: int = Field(default=32, ge=1, description="size of the generator's noise ε")
    noise: Literal["uniform", "normal"] = Field(
        default="uniform", description="ε's law: uniform [0, 1) (the code) or N(0, I)"
    )
    hidden_dim: int = Field(default=256, ge=1, description="generator hidden width")
    ensemble_epochs: int = Field(default=50, ge=0, description="server generator steps budget")
    n_teacher_iters: int = Field(default=5, ge=1, description="generator steps per epoch")
    gen_lr: float = Field(default=3e-4, gt=0, description="generator Adam lr")
    gen_weight_decay: float = Field(default=1e-2, ge=0, description="generator Adam L2 decay")
    gen_lr_decay: float = Field(default=0.98, gt=0, le=1, description="generator lr per round")
    gen_server_batch: int | None = Field(
        default=None, ge=1, description="labels per server step (None: train.batch_size)"
    )
    ensemble_alpha: float = Field(default=1.0, ge=0, description="server teacher loss weight")
    ensemble_eta: float = Field(default=1.0, ge=0, description="server diversity loss weight")
    gen_batch_size: int = Field(default=32, ge=1, description="generated samples per step")
    generative_alpha: float = Field(default=10.0, ge=0, description="α: generated-sample CE")
    generative_beta: float = Field(default=10.0, ge=0, description="β: latent KL weight")
    generative_decay: float = Field(default=0.98, gt=0, le=1, description="α, β per round")
    count_prior: float = Field(default=1.0, ge=0, description="added to every label count")


def decayed(base: float, decay: float, t: int) -> float:
    """The code's ``exp_lr_scheduler``: ``max(1e-4, base · decay^t)`` (0 when ``base`` is 0),
    t the 0-based round; FedGen's α_t and β_t."""
    return max(1e-4, base * decay**t) if base > 0 else 0.0


def teacher_weights(counts: torch.Tensor) -> torch.Tensor:
    """``w[i, y] = n_i(y) / Σ_j n_j(y)`` from clients' label counts ``[clients, classes]``
    (0 for a label nobody holds)."""
    return counts / counts.sum(0, keepdim=True).clamp_min(1e-12)


def teacher_loss(logits: torch.Tensor, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ_i mean_b w[i, y_b] · CE(logits[i, b], y_b)`` for teachers' logits ``[T, B, C]``."""
    ce = F.cross_entropy(logits.flatten(0, 1), y.repeat(len(logits)), reduction="none")
    return (ce.view(len(logits), -1) * weights[:, y]).mean(1).sum()


def diversity_loss(noise: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """FedGen's ``DiversityLoss(metric="l1")``: ``exp(-mean_{a,b} d1(out_a, out_b) · d2(ε_a,
    ε_b))`` over all ordered pairs, d1 the mean absolute and d2 the mean squared difference;
    small when distinct noise gives distinct outputs."""
    d_out = (out[:, None] - out[None]).abs().mean(-1)
    d_noise = (noise[:, None] - noise[None]).pow(2).mean(-1)
    return torch.exp(-(d_out * d_noise).mean())


@torch.no_grad()
def adam_step(
    params: TensorDict, grads: TensorDict, moments: State, lr: float, weight_decay: float
) -> State:
    """One step of ``torch.optim.Adam`` (betas (0.9, 0.999), eps 1e-8, L2 ``weight_decay``)
    in place on ``params``; ``moments`` (``step``, ``m``, ``v``; ``{}`` at the start) is
    returned updated, a dict of tensors the server state can hold."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    step = int(moments.get("step", 0)) + 1
    m = {k: moments["m"][k].clone() if moments else torch.zeros_like(p) for k, p in params.items()}
    v = {k: moments["v"][k].clone() if moments else torch.zeros_like(p) for k, p in params.items()}
    for k, p in params.items():
        g = grads[k] + weight_decay * p if weight_decay else grads[k]
        m[k].mul_(b1).add_(g, alpha=1 - b1)
        v[k].mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v[k] / (1 - b2**step)).sqrt().add_(eps)
        p.addcdiv_(m[k], denom, value=-lr / (1 - b1**step))
    return {"step": torch.tensor(step), "m": m, "v": v}


class LatentGenerator(nn.Module):
    """``G(y, ε)``: ``[ε; one-hot(y)] -> Linear -> BatchNorm1d -> ReLU -> Linear(latent)``."""

    def __init__(self, num_classes: int, noise_dim: int, hidden: int, latent: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.fc = nn.Linear(noise_dim + num_classes, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.out = nn.Linear(hidden, latent)

    def forward(self, y: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        classes = torch.arange(self.num_classes, device=y.device)
        one_hot = (y[:, None] == classes).to(noise.dtype)  # F.one_hot does not vmap
        return self.out(F.relu(self.bn(self.fc(torch.cat([noise, one_hot], dim=1)))))


class FedGenServer(GlobalModel):
    gen_params: TensorDict
    gen_buffers: TensorDict
    gen_adam: dict
    labels: torch.Tensor  # the classes some client has held


@register
class FedGen(FedAvg):
    """FedAvg whose local training distils a server-trained generator of latent features.

    Server state: FedAvg's ``params``/``buffers``, the generator's ``gen_params``/
    ``gen_buffers``, its Adam moments ``gen_adam`` and ``labels`` (a bool mask of the labels
    seen in uploads). Uploads: the client's label ``counts`` and its trained ``last`` layer.
    """

    name = "fedgen"
    paper = (
        'Zhu, Hong & Zhou, "Data-Free Knowledge Distillation for Heterogeneous '
        'Federated Learning", ICML 2021'
    )
    Params = FedGenParams
    ServerState = FedGenServer

    def __init__(self, hp: FedGenParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)
        # the generator's template, built here (outside any vmap of the executors); its
        # parameters live in the server state
        self.generator = self._new_generator(seed=0)

    @cached_property
    def last_layer(self) -> str:
        """The module name of the classifier's last linear layer (its input is the latent)."""
        head = getattr(self.ops.module, "head", self.ops.module)
        names = [n for n, m in head.named_modules() if isinstance(m, nn.Linear)]
        if not names or head.get_submodule(names[-1]).out_features != self.num_classes:
            raise ValueError("fedgen needs a model whose last layer is a Linear to the classes")
        prefix = "head." if head is not self.ops.module else ""
        return (prefix + names[-1]).rstrip(".")

    def _new_generator(self, seed: int) -> LatentGenerator:
        """A generator on the run's device, initialised from ``seed`` (global RNG untouched)."""
        latent = self.ops.module.get_submodule(self.last_layer).in_features
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            g = LatentGenerator(self.num_classes, self.hp.noise_dim, self.hp.hidden_dim, latent)
        return g.to(self.ops.device).eval()

    def _last(self, params: TensorDict, z: torch.Tensor) -> torch.Tensor:
        p = self.last_layer
        return F.linear(z, params[f"{p}.weight"], params.get(f"{p}.bias"))

    def _noise(self, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        draw = torch.rand if self.hp.noise == "uniform" else torch.randn
        return draw(shape, generator=gen).to(self.ops.device)

    def init_server_state(self, init):
        g = self._new_generator(derive_seed(self.seed, FEDGEN_STREAM))
        return {
            **super().init_server_state(init),
            "gen_params": clone_params(dict(g.named_parameters())),
            "gen_buffers": clone_params(dict(g.named_buffers())),
            "gen_adam": {},
            "labels": torch.zeros(self.num_classes, dtype=torch.bool, device=self.ops.device),
        }

    # ------------------------------------------------------------------ client
    def _num_steps(self, data: ClientData) -> int:
        """An upper bound of the client's local steps (for its pre-drawn noise)."""
        t = self.train_defaults
        if t.local_steps is not None:
            return t.local_steps
        return t.local_epochs * math.ceil(data.num_train / t.batch_size)

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        task = super().client_task(server, client, data, ctx)
        labels = torch.nonzero(server["labels"]).flatten().cpu()
        if ctx.round < 2 or not len(labels):  # round 1: no generator yet, plain FedAvg
            return task
        hp, steps, bsz = self.hp, self._num_steps(data), self.train_defaults.batch_size
        gen = torch.Generator().manual_seed(
            derive_seed(self.seed, FEDGEN_STREAM, ctx.round, data.cid)
        )
        pick = torch.randint(len(labels), (steps, hp.gen_batch_size), generator=gen)
        t = ctx.round - 1
        alpha = decayed(hp.generative_alpha, hp.generative_decay, t) * hp.gen_batch_size / bsz
        beta = decayed(hp.generative_beta, hp.generative_decay, t)
        task.phases = (Phase(loss="distill_loss"),)
        task.extras = {
            "gen": {"params": server["gen_params"], "buffers": server["gen_buffers"]},
            "coef": torch.tensor([alpha, beta], device=self.ops.device),
            "gen_y": labels[pick].to(self.ops.device),
            "gen_noise": self._noise((steps, hp.gen_batch_size, hp.noise_dim), gen),
            "real_noise": self._noise((steps, bsz, hp.noise_dim), gen),
        }
        return task

    def _generate(self, gen: dict[str, TensorDict], y: torch.Tensor, noise: torch.Tensor):
        """Latents of the frozen generator (eval mode) for labels ``y``."""
        out = functional_call(self.generator, (gen["params"], gen["buffers"]), (y, noise))
        return out.detach()

    def distill_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """The local loss from round 2 on: CE + the generated samples' CE + the latent KL."""
        logits = self.ops.forward(params[0], buffers[0], batch.x)
        ce = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        gen, s = extras["gen"], batch.step
        z = self._generate(gen, batch.y, extras["real_noise"][s][: batch.x.shape[0]])
        target = F.softmax(self._last(params[0], z), dim=1).detach()
        kl = (target * (target.clamp_min(1e-30).log() - F.log_softmax(logits, 1))).sum(1)
        y_g = extras["gen_y"][s]
        z_g = self._generate(gen, y_g, extras["gen_noise"][s])
        teacher = F.cross_entropy(self._last(params[0], z_g), y_g)
        return ce + extras["coef"][0] * teacher + extras["coef"][1] * batch.mean(kl)

    def upload(self, task, params, buffers, data) -> dict[str, Any]:
        p = f"{self.last_layer}."
        return {
            "counts": as_float(torch.bincount(data.y_train, minlength=self.num_classes)),
            "last": {k[len(p) :]: v.detach() for k, v in params[0].items() if k.startswith(p)},
        }

    # ------------------------------------------------------------------ server
    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        teachers: list[tuple[torch.Tensor, TensorDict]] = []

        def recorded() -> Iterable[ClientResult]:  # keep each upload's last layer, stream on
            for r in results:
                if r.num_samples > 0:
                    teachers.append((r.upload["counts"], r.upload["last"]))
                yield r

        new = average_models(server, recorded(), self.hp.weighting)
        if not teachers:
            return new
        counts = torch.stack([c for c, _ in teachers]).to(self.ops.device)
        held = counts.sum(0) > 0
        gen = self.train_generator(server, counts + self.hp.count_prior, held, teachers, ctx)
        return {**new, **gen, "labels": server["labels"] | held}

    def train_generator(
        self,
        server: State,
        counts: torch.Tensor,
        held: torch.Tensor,
        teachers: list[tuple[torch.Tensor, TensorDict]],
        ctx: RoundContext,
    ) -> State:
        """The server's generator fit against the round's teachers (last layers, with label
        ``counts [T, C]``) on the labels ``held``; deterministic given the seed and round."""
        hp = self.hp
        steps = (hp.ensemble_epochs // hp.n_teacher_iters) * hp.n_teacher_iters
        params = {k: v.clone() for k, v in server["gen_params"].items()}
        buffers = clone_params(server["gen_buffers"])
        adam = server["gen_adam"]
        lr = hp.gen_lr * hp.gen_lr_decay ** (ctx.round - 1)
        w = teacher_weights(counts)
        weight = torch.stack([t["weight"] for _, t in teachers])  # [T, C, latent]
        bias = torch.stack([t["bias"] for _, t in teachers]) if "bias" in teachers[0][1] else None
        labels = torch.nonzero(held).flatten().cpu()
        bsz = hp.gen_server_batch or self.train_defaults.batch_size
        gen = torch.Generator().manual_seed(derive_seed(self.seed, FEDGEN_STREAM, ctx.round))
        self.generator.train()
        for _ in range(steps):
            y = labels[torch.randint(len(labels), (bsz,), generator=gen)].to(self.ops.device)
            noise = self._noise((bsz, hp.noise_dim), gen)
            p = {k: v.requires_grad_() for k, v in params.items()}
            z = functional_call(self.generator, (p, buffers), (y, noise))
            logits = torch.einsum("tcl,bl->tbc", weight, z)
            logits = logits if bias is None else logits + bias[:, None]
            loss = hp.ensemble_alpha * teacher_loss(logits, y, w)
            loss = loss + hp.ensemble_eta * diversity_loss(noise, z)
            grads = dict(zip(p, torch.autograd.grad(loss, list(p.values())), strict=True))
            params = {k: v.detach() for k, v in p.items()}
            adam = adam_step(params, grads, adam, lr, hp.gen_weight_decay)
        self.generator.eval()
        return {"gen_params": params, "gen_buffers": buffers, "gen_adam": adam}
