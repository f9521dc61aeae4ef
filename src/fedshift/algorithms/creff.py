"""CReFF (Shang et al., IJCAI 2022): classifier re-training with federated features, as the
FedNH paper runs it (spec/fednh.md §4, the CReFF row and "CReFF details").

CReFF is FedAvg plus a server-side re-training of the linear classifier ``W [C, d]`` on the
body features. Each round:

1. Every sampled client computes, for each class ``c`` it owns, the gradient of the
   cross-entropy w.r.t. ``W`` on real samples of ``c`` (:func:`classifier_gradient`), with the
   round's global body and the previous round's re-trained ``W``, the model in eval mode,
   averaged over ``num_real_batches`` mini-batches of up to ``real_batch_size`` samples of the
   class (:func:`class_batches`). It uploads these rows with its (FedAvg) local model.
2. The server averages the models (FedAvg) and, per class, the real gradients over the clients
   owning the class.
3. It moves the synthetic ("federated") features ``S [C, m, d]`` by ``feature_iters`` full-batch
   SGD steps (:func:`feature_step`) on ``sum_{c present} D(g_syn(S_c), g_real_c)`` where
   ``g_syn`` is the same classifier gradient on the synthetic features and ``D`` the row-wise
   cosine distance :func:`gradient_match_distance`.
4. It trains a fresh ``nn.Linear(d, C)`` (with bias) on all synthetic features
   (:func:`retrain_classifier`) and keeps its weight. The global model (GM) is the FedAvg body
   with that weight as head; clients keep training from the plain FedAvg model, so the
   personalised metrics (latest local model) equal FedAvg's.

Choices (paper [P] vs the FedNH authors' code [C] vs ours):

- *Learning rates.* CReFF's code uses 0.1 for the features and 0.01 for the classifier; the FedNH
  paper found that unstable and set both to 0.01 [P] (our defaults).
- *"Epochs" of feature optimisation* are full-batch iterations [C]; the classifier re-training
  runs real epochs over the synthetic features (batch 64 = the clients' batch size in [C]; the
  last, smaller batch of an epoch is kept, as a ``DataLoader`` does; plain SGD).
- *Synthetic features persist across rounds* [C]: the code creates them (``N(0, 1)``) once in
  the server's constructor, with a momentum-free SGD optimiser (so no optimiser state). The spec
  is silent; we keep ``S`` in the server state. Classes absent from a round keep their features
  (zero gradient) but still take part in the re-training [C].
- *Distance* ``sum_rows (1 - <a, b> / (|a| |b| + 1e-6))`` ("ours" in [C]); only the weight
  gradient is matched (the matching classifier is bias-free in [C]).
- *Real gradients* are averaged unweighted over the clients owning the class [C] (each client's
  is itself the mean of its ``num_real_batches`` batch means).
- *Classifier at round 1.* [C] matches against a separate, randomly initialised bias-free linear
  layer in round 1; we use the global model's initial head weight (also a random init), so
  "the previous round's classifier" is always the head of the current GM.
- *Closed-form gradients.* ``dCE/dW = (softmax(W f) - onehot(y))^T f / n`` is computed in closed
  form: it equals autograd's gradient and, being an expression in ``f``, is differentiable in
  the synthetic features exactly as ``autograd.grad(..., create_graph=True)`` is (both checked in
  the tests); it is cheaper and vectorised over classes.
- *When the real gradients are computed.* [C] computes them before local training; we compute
  them in :meth:`CReFF.upload` from the task's start parameters (``task.params[0]``, the
  round's global model), which gives the same numbers.
- *Upload.* Only the rows of the classes a client owns are sent (``creff_classes [K]``,
  ``creff_grads [K, C, d]``), which carries the same information as a ``[C, C, d]`` tensor
  plus a presence mask without the memory of absent classes.
- *Heads with a bias* (not the FedNH setting, which is bias-free: ``model.head_bias=false``):
  clients and the server's matching use the round's start bias in the logits; the GM keeps the
  FedAvg bias and the re-trained bias is dropped (the code drops it too).
- *Randomness.* Its streams (synthetic-feature init, real-batch sampling per (round, client),
  re-training init and shuffles per round) derive from the run seed (``Algorithm.seed``):
  runs with different seeds differ, re-runs and both executors agree.
- *Prediction.* ``mixture`` (the FedRC-protocol metrics) answers with the GM, the model CReFF
  deploys; ``local_model`` (FedNH's PM) is the client's latest local model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from fedshift.algorithms.base import (
    ClientData,
    ClientResult,
    LocalTask,
    ModelOps,
    RoundContext,
    State,
    TensorDict,
)
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams
from fedshift.algorithms.registry import register
from fedshift.algorithms.states import GlobalModel
from fedshift.core.errors import FedshiftError
from fedshift.core.seeds import CREFF_STREAM, derive_seed
from fedshift.models.base import head_param_names

#: sub-streams of the CReFF seed (synthetic-feature init, real batches, re-training)
FEATURE_STREAM, REAL_STREAM, RETRAIN_STREAM = 41, 42, 43
#: the denominator guard of the cosine distance (CReFF's code)
COS_EPS = 1e-6


# ---------------------------------------------------------------------- pure math


def classifier_gradient(
    features: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient w.r.t. ``weight [C, d]`` of the mean cross-entropy of ``features @ weight.T
    (+ bias)`` against ``labels``: ``(softmax(W f) - onehot(y))^T f / n``.

    ``features [..., n, d]``, ``labels [..., n]`` and the optional 0/1 ``mask [..., n]``
    (padding) may carry leading batch dimensions (e.g. one set per class); the result is
    ``[..., C, d]``. Differentiable in ``features`` (what CReFF's ``create_graph=True`` gives).
    """
    logits = features @ weight.T
    if bias is not None:
        logits = logits + bias
    err = torch.softmax(logits, dim=-1) - F.one_hot(labels, weight.shape[0]).to(logits.dtype)
    if mask is None:
        return torch.einsum("...nc,...nd->...cd", err, features) / labels.shape[-1]
    mask = mask.to(err.dtype)
    grad = torch.einsum("...nc,...nd->...cd", err * mask.unsqueeze(-1), features)
    return grad / mask.sum(-1).clamp_min(1)[..., None, None]


def gradient_match_distance(g_syn: torch.Tensor, g_real: torch.Tensor) -> torch.Tensor:
    """CReFF's distance between two gradients ``[..., R, d]``: the sum over the R rows of
    ``1 - cos`` (with ``|a| |b| + 1e-6`` as denominator), one value per leading index.
    0 for identical gradients, ``2 R`` for opposite ones."""
    dot = (g_syn * g_real).sum(-1)
    norms = g_syn.norm(dim=-1) * g_real.norm(dim=-1) + COS_EPS
    return (1 - dot / norms).sum(-1)


def matching_loss(
    features: torch.Tensor,
    real_grads: torch.Tensor,
    classes: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The feature-matching objective: ``sum_k D(g_syn(features[c_k]), real_grads[k])`` over
    the present classes ``classes [K]`` (``real_grads [K, C, d]``), where ``g_syn`` is the
    classifier gradient of class ``c_k``'s synthetic features ``features[c_k] [m, d]``."""
    syn = features[classes]  # [K, m, d]
    labels = classes[:, None].expand(-1, syn.shape[1])
    g_syn = classifier_gradient(syn, labels, weight, bias)
    return gradient_match_distance(g_syn, real_grads).sum()


def feature_step(
    features: torch.Tensor,
    real_grads: torch.Tensor,
    classes: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    lr: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One full-batch SGD step (no momentum) of the synthetic features ``[C, m, d]`` on
    :func:`matching_loss`; returns the new features and the (detached) loss before the step.
    Features of classes not in ``classes`` get no gradient and stay unchanged."""
    if classes.numel() == 0:
        return features, features.new_zeros(())
    with torch.enable_grad():
        f = features.detach().requires_grad_(True)
        loss = matching_loss(f, real_grads, classes, weight.detach(), _detach(bias))
        (grad,) = torch.autograd.grad(loss, f)
    return features.detach() - lr * grad, loss.detach()


def linear_init(
    num_classes: int, dim: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh ``nn.Linear(dim, num_classes)`` as PyTorch initialises it (weight and bias
    ``U(-1/sqrt(dim), 1/sqrt(dim))``), drawn from ``generator`` (CPU tensors)."""
    bound = 1.0 / math.sqrt(dim)
    weight = (torch.rand(num_classes, dim, generator=generator) * 2 - 1) * bound
    bias = (torch.rand(num_classes, generator=generator) * 2 - 1) * bound
    return weight, bias


def retrain_classifier(
    features: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train a linear classifier ``(weight, bias)`` on ``features [N, d]`` / ``labels [N]``
    with plain SGD on the mean cross-entropy: ``epochs`` epochs, each over the order
    ``torch.randperm(N, generator=generator)`` (one draw per epoch, in order) cut into batches
    of ``batch_size`` (the last one may be smaller). Gradients in closed form; returns new
    tensors on ``features``' device."""
    n = features.shape[0]
    dev = features.device
    w, b = weight.detach().clone().to(dev), bias.detach().clone().to(dev)
    if epochs <= 0 or n == 0:
        return w, b
    onehot = F.one_hot(labels, w.shape[0]).to(features.dtype)
    order = torch.stack([torch.randperm(n, generator=generator) for _ in range(epochs)]).to(dev)
    with torch.no_grad():
        for e in range(epochs):
            xs, ys = features[order[e]], onehot[order[e]]  # one gather per epoch; batches: views
            for s in range(0, n, batch_size):
                x, y = xs[s : s + batch_size], ys[s : s + batch_size]
                err = torch.softmax(torch.addmm(b, x, w.T), dim=-1) - y
                w.sub_(err.T @ x, alpha=lr / len(x))
                b.sub_(err.sum(0), alpha=lr / len(x))
    return w, b


def class_batches(
    labels: torch.Tensor,
    classes: torch.Tensor,
    batch_size: int,
    num_batches: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of ``num_batches`` random mini-batches per class: for batch ``r`` and class
    ``classes[k]``, the first ``min(batch_size, n_c)`` entries of a random permutation of the
    class's positions in ``labels`` (CPU). Returns ``pos [R, K, B]`` and ``mask [R, K, B]``
    (padding 0) with ``B = min(batch_size, max_c n_c)``; draws in the order r, then k."""
    members = [torch.nonzero(labels == c).flatten() for c in classes.tolist()]
    width = min(batch_size, max((len(m) for m in members), default=0))
    pos = torch.zeros(num_batches, len(members), width, dtype=torch.long)
    mask = torch.zeros(num_batches, len(members), width, dtype=torch.bool)
    for r in range(num_batches):
        for k, m in enumerate(members):
            pick = m[torch.randperm(len(m), generator=generator)[:batch_size]]
            pos[r, k, : len(pick)] = pick
            mask[r, k, : len(pick)] = True
    return pos, mask


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def rng_key(seed: int, rnd: int) -> torch.Tensor:
    """The server's random key: (base seed, the round the next client tasks belong to)."""
    return torch.tensor([seed, rnd], dtype=torch.long)


# ---------------------------------------------------------------------- the algorithm


class CReFFParams(FedAvgParams):
    num_features: int = Field(default=100, ge=1, description="synthetic features per class")
    feature_iters: int = Field(
        default=100, ge=0, description="full-batch SGD iterations on the features per round"
    )
    feature_lr: float = Field(
        default=0.01, gt=0, description="lr of the synthetic features (FedNH: 0.01; CReFF: 0.1)"
    )
    retrain_epochs: int = Field(
        default=300, ge=0, description="epochs of classifier re-training per round"
    )
    retrain_lr: float = Field(default=0.01, gt=0, description="lr of the classifier re-training")
    retrain_batch_size: int = Field(
        default=64, ge=1, description="batch size of the classifier re-training"
    )
    num_real_batches: int = Field(
        default=10, ge=1, description="real mini-batches per class averaged by a client"
    )
    real_batch_size: int = Field(
        default=64, ge=1, description="real samples per class mini-batch (at most)"
    )


class CReFFServer(GlobalModel):
    retrained_weight: torch.Tensor
    features: torch.Tensor
    rng_key: torch.Tensor


@register
class CReFF(FedAvg):
    """FedAvg whose global model's classifier is re-trained on the server on synthetic
    features matched to the clients' per-class classifier gradients."""

    name = "creff"
    paper = (
        'Shang et al., "Federated Learning on Heterogeneous and Long-Tailed '
        'Data via Classifier Re-Training with Federated Features", IJCAI 2022'
    )
    Params = CReFFParams
    premise = "long_tail"
    ServerState = CReFFServer

    def __init__(self, hp: CReFFParams, ops: ModelOps, num_classes: int, **run: Any) -> None:
        super().__init__(hp, ops, num_classes, **run)
        self.weight_name, self.bias_name = linear_head_names(ops.module, num_classes)

    # ------------------------------------------------------------------ server side
    def init_server_state(self, init) -> State:
        state = super().init_server_state(init)
        weight = state["params"][self.weight_name]
        seed = derive_seed(self.seed, CREFF_STREAM)
        gen = torch.Generator().manual_seed(derive_seed(seed, FEATURE_STREAM))
        c, d = weight.shape
        features = torch.randn(c, self.hp.num_features, d, generator=gen)
        return {
            **state,
            "retrained_weight": weight.detach().clone(),
            "features": features.to(device=weight.device, dtype=weight.dtype),
            "rng_key": rng_key(seed, 1),
        }

    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        weight = server["retrained_weight"]
        dev = weight.device
        sums = torch.zeros(self.num_classes, *weight.shape, device=dev, dtype=weight.dtype)
        owners = torch.zeros(self.num_classes, device=dev, dtype=weight.dtype)

        def tap():
            for r in results:
                classes = r.upload.get("creff_classes")
                if classes is not None and classes.numel():
                    classes = classes.to(dev)
                    sums.index_add_(0, classes, r.upload["creff_grads"].to(dev, weight.dtype))
                    owners.index_add_(0, classes, torch.ones_like(classes, dtype=weight.dtype))
                yield r

        new = super().aggregate(server, tap(), ctx)
        present = torch.nonzero(owners > 0).flatten()
        real = sums[present] / owners[present, None, None]
        bias = server["params"][self.bias_name] if self.bias_name else None  # round's start
        features = server["features"]
        for _ in range(self.hp.feature_iters):
            features, _loss = feature_step(
                features, real, present, weight, bias, self.hp.feature_lr
            )
        c, m, d = features.shape
        seed = int(server["rng_key"][0])
        gen = torch.Generator().manual_seed(derive_seed(seed, RETRAIN_STREAM, ctx.round))
        w0, b0 = linear_init(c, d, gen)
        labels = torch.arange(c, device=features.device).repeat_interleave(m)
        new_weight, _ = retrain_classifier(
            features.reshape(c * m, d),
            labels,
            w0.to(features.dtype),
            b0.to(features.dtype),
            self.hp.retrain_epochs,
            self.hp.retrain_batch_size,
            self.hp.retrain_lr,
            gen,
        )
        return {
            **new,
            "features": features,
            "retrained_weight": new_weight.to(weight.dtype),
            "rng_key": rng_key(seed, ctx.round + 1),
        }

    # ------------------------------------------------------------------ client side
    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        task = super().client_task(server, client, data, ctx)
        # the same objects for every client: the batched executor passes them once, unstacked
        task.extras["creff_weight"] = server["retrained_weight"]
        task.extras["creff_key"] = server["rng_key"]
        return task

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        """Per owned class, the classifier-weight gradient on real samples with the round's
        start model (``task.params[0]``'s body) and the previous re-trained weight."""
        ex = task.extras
        seed, rnd = (int(v) for v in ex["creff_key"])
        gen = torch.Generator().manual_seed(derive_seed(seed, REAL_STREAM, rnd, data.cid))
        labels = data.y_train.cpu()
        classes = torch.unique(labels)
        weight = ex["creff_weight"]
        if classes.numel() == 0:
            return {
                "creff_classes": classes,
                "creff_grads": weight.new_zeros(0, *weight.shape),
            }
        pos, mask = class_batches(
            labels, classes, self.hp.real_batch_size, self.hp.num_real_batches, gen
        )
        p0, b0 = task.params[0], task.buffers[0]
        bias = p0[self.bias_name] if self.bias_name else None
        dev = data.train_idx.device
        cls = classes.to(dev)
        module = self.ops.module
        was = module.training
        module.eval()
        total = None
        try:
            with torch.no_grad():
                for r in range(pos.shape[0]):
                    feats = self._features(p0, b0, data, pos[r][mask[r]].to(dev))
                    padded = feats.new_zeros(*pos.shape[1:], feats.shape[-1])
                    padded[mask[r].to(dev)] = feats
                    lab = cls[:, None].expand(-1, pos.shape[2])
                    g = classifier_gradient(padded, lab, weight, bias, mask[r].to(dev))
                    total = g if total is None else total + g
        finally:
            module.train(was)
        return {"creff_classes": cls, "creff_grads": total / pos.shape[0]}

    def _features(
        self, params: TensorDict, buffers: TensorDict, data: ClientData, pos: torch.Tensor
    ):
        """Body features of the train-split positions ``pos``, in chunks of eval_batch."""
        out = []
        for i in range(0, len(pos), data.eval_batch):
            x = data.inputs(data.train_idx[pos[i : i + data.eval_batch]])
            out.append(self.ops.forward(params, buffers, x, features=True)[0])
        return torch.cat(out)

    # ------------------------------------------------------------------ prediction
    def global_model(self, server: State):
        params = {**server["params"], self.weight_name: server["retrained_weight"]}
        return params, server["buffers"]

    def mixture(self, server: State, client: State, data: ClientData):
        return [(1.0, *self.global_model(server))]


def linear_head_names(module: Any, num_classes: int) -> tuple[str, str | None]:
    """The names of the model's linear classifier weight ``[C, d]`` and bias (None when the
    head is bias-free); a clear error for heads that are not one linear layer on the body
    features (dropout in front, as MobileNet's, is fine: eval-mode identity)."""
    names = head_param_names(module)
    shapes = dict(module.named_parameters())
    weights = [n for n in names if shapes[n].ndim == 2]
    biases = [n for n in names if shapes[n].ndim == 1]
    feature_dim = getattr(module, "feature_dim", None)
    if (
        len(weights) != 1
        or len(biases) > 1
        or len(names) != len(weights) + len(biases)
        or tuple(shapes[weights[0]].shape) != (num_classes, feature_dim)
    ):
        raise FedshiftError(
            "creff re-trains a linear classifier on the body features: the model's head must "
            f"be one nn.Linear(feature_dim, {num_classes}); got head parameters "
            f"{[(n, tuple(shapes[n].shape)) for n in names]}"
        )
    return weights[0], (biases[0] if biases else None)


__all__ = [
    "CReFF",
    "CReFFParams",
    "class_batches",
    "classifier_gradient",
    "feature_step",
    "gradient_match_distance",
    "linear_init",
    "linear_head_names",
    "matching_loss",
    "retrain_classifier",
]
