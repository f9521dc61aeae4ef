"""FedGen (Zhu, Hong & Zhou, ICML 2021): data-free knowledge distillation with a server-side
generator of latent features, a baseline of DFL's Table 1.

The server keeps a FedAvg global model and a small generator ``G(y, ε)`` of the *latent*
input of the classifier's last linear layer: ``[one-hot(y); ε] -> Linear(hidden) -> BN -> ReLU
-> Linear(latent)``. After the clients trained, the server fits G for ``gen_steps`` Adam steps so
that the sampled clients' last layers (the teachers) classify its outputs as the labels it was
asked for: ``Σ_i mean_b w_i(y_b)·CE(last_i(G(y_b, ε_b)), y_b) + η·diversity``, with
``w_i(y) = n_i(y) / Σ_j n_j(y)`` (:func:`teacher_weights`) and FedGen's diversity loss
(:func:`diversity_loss`). From the second round on, local training adds to the cross-entropy
``α_t·(B_g/B)·CE(last(G(ŷ, ε)), ŷ)`` on sampled labels ŷ (it reaches the client's last layer)
and ``β_t·KL(softmax(last(G(y, ε))) ‖ model(x))`` on the batch's labels, with ``α_t = α·d^t``,
``β_t = β·d^t``. Defaults: the FedGen code's MNIST settings (spec dfl.md §4).

Choices: the generator's noise is uniform on [0, 1) as the FedGen code draws it, drawn per
client, round and step in ``client_task`` (so both executors see the same draws); the
teachers' loss is a proper cross-entropy of their logits; the generator's Adam state persists
across rounds (in the server state) and its lr decays by ``gen_lr_decay`` per round.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cached_property
from typing import Any

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
    Params,
    RoundContext,
    State,
    clone_params,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, average_models
from fedshift.algorithms.registry import register


class FedGenParams(FedAvgParams):
    noise_dim: int = Field(default=32, ge=1, description="generator noise size")
    hidden_dim: int = Field(default=256, ge=1, description="generator hidden width")
    gen_steps: int = Field(default=50, ge=0, description="server Adam steps of G per round")
    gen_lr: float = Field(default=3e-4, gt=0, description="generator Adam lr")
    gen_weight_decay: float = Field(default=1e-2, ge=0, description="generator weight decay")
    gen_lr_decay: float = Field(default=0.98, gt=0, le=1, description="generator lr per round")
    gen_batch_size: int = Field(default=32, ge=1, description="generated samples per step")
    diversity_weight: float = Field(default=1.0, ge=0, description="η of the diversity loss")
    alpha: float = Field(default=10.0, ge=0, description="α: generated-sample CE weight")
    beta: float = Field(default=10.0, ge=0, description="β: latent KL weight")
    decay: float = Field(default=0.98, gt=0, le=1, description="α, β decay per round")


def teacher_weights(counts: torch.Tensor) -> torch.Tensor:
    """``w[i, y] = n_i(y) / Σ_j n_j(y)`` from clients' label counts ``[clients, classes]``
    (0 for a label nobody holds)."""
    return counts / counts.sum(0, keepdim=True).clamp_min(1e-12)


def diversity_loss(noise: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """FedGen's diversity term ``exp(-mean_{a,b} d_l1(out_a, out_b)·d_l2(ε_a, ε_b))`` (mean
    absolute / squared differences): small when distinct noise gives distinct outputs."""
    d_out = (out[:, None] - out[None]).abs().mean(-1)
    d_noise = (noise[:, None] - noise[None]).pow(2).mean(-1)
    return torch.exp(-(d_out * d_noise).mean())


class LatentGenerator(nn.Module):
    def __init__(self, num_classes: int, noise_dim: int, hidden: int, latent: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.fc = nn.Linear(num_classes + noise_dim, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.out = nn.Linear(hidden, latent)

    def forward(self, y: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        classes = torch.arange(self.num_classes, device=y.device)
        h = torch.cat([(y[:, None] == classes).to(noise.dtype), noise], dim=1)  # one-hot, vmap-safe
        return self.out(F.relu(self.bn(self.fc(h))))


@register
class FedGen(FedAvg):
    """FedAvg whose local training distils a server-trained generator of latent features."""

    name = "fedgen"
    Params = FedGenParams

    @cached_property
    def last_layer(self) -> str:
        """The module name of the classifier's last linear layer (its input is the latent)."""
        names = [n for n, m in self.ops.module.named_modules() if isinstance(m, nn.Linear)]
        return names[-1]

    @cached_property
    def generator(self) -> LatentGenerator:
        lin = self.ops.module.get_submodule(self.last_layer)
        hp = self.hp
        return LatentGenerator(self.num_classes, hp.noise_dim, hp.hidden_dim, lin.in_features)

    def _last(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        p = self.last_layer
        return F.linear(z, params[f"{p}.weight"], params.get(f"{p}.bias"))

    def init_server_state(self, init):
        state = super().init_server_state(init)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 7919)
            gen = LatentGenerator(
                self.num_classes,
                self.hp.noise_dim,
                self.hp.hidden_dim,
                self.generator.out.out_features,
            )
        dev = next(iter(state["params"].values())).device
        gp = {k: v.detach().to(dev) for k, v in gen.named_parameters()}
        gb = {k: v.detach().to(dev) for k, v in gen.named_buffers()}
        return {**state, "gen": (gp, gb), "adam": {}, "labels": torch.zeros(0, dtype=torch.long)}

    # ------------------------------------------------------------------ client
    def _steps(self, data: ClientData) -> int:
        t = self.train_defaults
        if t.local_steps is not None:
            return t.local_steps
        return t.local_epochs * max(1, math.ceil(data.num_train / t.batch_size))

    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        task = super().client_task(server, client, data, ctx)
        on = ctx.round > 1 and server["labels"].numel() > 0
        s, hp, b = self._steps(data), self.hp, self.train_defaults.batch_size
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + ctx.round * 7_919 + data.cid)
        labels = server["labels"] if on else torch.zeros(1, dtype=torch.long)
        pick = torch.randint(len(labels), (s, hp.gen_batch_size), generator=g)
        dev = next(iter(server["params"].values())).device
        task.extras = {
            "gen": server["gen"],
            "weights": torch.tensor([hp.alpha, hp.beta]) * (hp.decay ** (ctx.round - 1) * on),
            "gen_y": labels.cpu()[pick].to(dev),
            "gen_noise": torch.rand(s, hp.gen_batch_size, hp.noise_dim, generator=g).to(dev),
            "real_noise": torch.rand(s, b, hp.noise_dim, generator=g).to(dev),
        }
        task.extras["weights"] = task.extras["weights"].to(dev)
        return task

    def _generate(self, gen: tuple[Params, Params], y, noise) -> torch.Tensor:
        self.generator.eval()
        return functional_call(self.generator, gen, (y, noise)).detach()

    def local_loss(
        self, params: list[Params], buffers: list[Params], batch: Batch, extras: dict[str, Any]
    ) -> torch.Tensor:
        logits = self.ops.forward(params[0], buffers[0], batch.x)
        loss = batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))
        alpha, beta = extras["weights"][0], extras["weights"][1]
        n = batch.x.shape[0]
        z = self._generate(extras["gen"], batch.y, extras["real_noise"][batch.step][:n])
        target = F.softmax(self._last(params[0], z), dim=1).detach()
        kl = (target * (target.clamp_min(1e-12).log() - F.log_softmax(logits, 1))).sum(1)
        y_g = extras["gen_y"][batch.step]
        z_g = self._generate(extras["gen"], y_g, extras["gen_noise"][batch.step])
        teacher = F.cross_entropy(self._last(params[0], z_g), y_g)
        ratio = self.hp.gen_batch_size / self.train_defaults.batch_size
        return loss + alpha * ratio * teacher + beta * batch.mean(kl)

    def upload(self, task, params, buffers, data) -> dict[str, Any]:
        p = self.last_layer
        last = {k: v.detach() for k, v in params[0].items() if k.startswith(f"{p}.")}
        return {"counts": torch.bincount(data.y_train, minlength=self.num_classes), "last": last}

    # ------------------------------------------------------------------ server
    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        teachers: list[tuple[torch.Tensor, Params]] = []

        def recorded():
            for r in results:
                if r.num_samples > 0:
                    teachers.append((r.upload["counts"].float(), r.upload["last"]))
                yield r

        new = average_models(server, recorded(), self.hp.weighting)
        if not teachers:
            return new
        counts = torch.stack([c for c, _ in teachers])
        labels = torch.nonzero(counts.sum(0) > 0).flatten()
        gen, adam = self.train_generator(server, teachers, labels, ctx)
        return {**new, "gen": gen, "adam": adam, "labels": labels.cpu()}

    def train_generator(self, server: State, teachers, labels, ctx: RoundContext):
        """``gen_steps`` Adam steps of G against the round's teachers (deterministic)."""
        hp = self.hp
        gp = {k: v.clone().requires_grad_() for k, v in server["gen"][0].items()}
        gb = clone_params(server["gen"][1])
        lr = hp.gen_lr * hp.gen_lr_decay ** (ctx.round - 1)
        opt = torch.optim.Adam(list(gp.values()), lr=lr, weight_decay=hp.gen_weight_decay)
        if server["adam"]:
            opt.load_state_dict(server["adam"])
            for group in opt.param_groups:
                group["lr"] = lr
        w = teacher_weights(torch.stack([c for c, _ in teachers]))
        dev = labels.device
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + ctx.round * 7_919 + 104_729)
        self.generator.train()
        bsz = self.train_defaults.batch_size
        for _ in range(hp.gen_steps):
            y = labels[torch.randint(len(labels), (bsz,), generator=g).to(dev)]
            noise = torch.rand(bsz, hp.noise_dim, generator=g).to(dev)
            z = functional_call(self.generator, (gp, gb), (y, noise))
            loss = hp.diversity_weight * diversity_loss(noise, z)
            for i, (_, last) in enumerate(teachers):
                ce = F.cross_entropy(self._last(last, z), y, reduction="none")
                loss = loss + (ce * w[i, y]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.generator.eval()
        return ({k: v.detach() for k, v in gp.items()}, gb), opt.state_dict()
