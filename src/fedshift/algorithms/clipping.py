"""Norm-bounded aggregation (``train.clip_updates``): each client's update clipped to an L2
bound before the server aggregates it, a standard defence against a hostile client (Sun et
al., "Can You Really Backdoor Federated Learning?", 2019; the clipping of DP-FedAvg, McMahan
et al., ICLR 2018).

A client's update of model ``k`` is ``Δ = x_client − x_start``: the model it shares minus
the model it started that model from (its task's ``params[k]`` and ``buffers[k]``, which
the engine handed out: for the built-in algorithms a model of the server state, e.g. the
global model, each of FedRC's K models, or the cluster model IFCA's client chose; FedSoft's
client after its first round starts from its own model). ``Δ`` is scaled to
``Δ · min(1, bound / ‖Δ‖)`` and the server receives ``x_start + Δ``. The norm ``‖Δ‖`` is
one L2 norm per model, over all its floating-point tensors that leave the client:
parameters *and* floating-point buffers (BatchNorm's running mean and variance, which the
server averages too; the clipped statistics are convex combinations of the start's and the
client's, so a variance stays positive). Integer buffers (``num_batches_tracked``) are left
as they are, as is a tensor without a start (none of the built-in algorithms shares one). A
model whose update is within the bound is passed on as it is, bit for bit.

The bound is a fixed number, or ``"median"``: per model index, the (lower) median of the
norms of the round's updates of that model, which needs no tuning but holds the round's
shared results in memory until all of them are in (a fixed bound streams them).

Clipping bounds one update's influence on each averaged model: with every update within
``bound``, a weighted average moves at most ``bound`` from where it started. It does not
bound what is not a model the client trained from a start the server sent: uploads
(prototypes, label statistics, FedGen's counts) reach ``aggregate`` unchanged, and a server
optimiser or an aggregate that is not an average (FedNova's step normalisation, FedDyn's
correction) may scale the aggregated step. Nor does it stop many colluding clients, or
poisoning whose update has an ordinary norm (a backdoor within the bound).

Pure functions of tensors: the engine pairs each shared result with its start models and
calls :func:`clip_results`. A deployment's server does not see the tasks (the nodes build
them), so there a model's start is the model of the server state nearest to it
(:func:`nearest_origins`): within the bound of its true start, a reply is within the bound of
the nearest one too and passes unchanged; beyond it, the reply is brought within the bound of
a model the server sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Literal

import torch

from fedshift.algorithms.task import ClientResult, TensorDict

#: a clipping rule: a fixed L2 bound, or the median of the round's update norms
ClipRule = float | Literal["median"]
#: the start models of a result, as its task gave them: (params, buffers) per model index
Origins = tuple[Sequence[TensorDict], Sequence[TensorDict]]


def update_delta(model: TensorDict, start: TensorDict) -> TensorDict:
    """``model − start`` of every floating-point tensor of ``model`` that ``start`` holds with
    the same shape (the tensors an update can move)."""
    return {
        name: x - start[name]
        for name, x in model.items()
        if torch.is_floating_point(x) and name in start and start[name].shape == x.shape
    }


def update_norm(*deltas: TensorDict) -> float:
    """The L2 norm of the deltas' tensors taken together (in double precision)."""
    sq = sum(float(d.detach().double().pow(2).sum()) for delta in deltas for d in delta.values())
    return math.sqrt(sq)


def clip_scale(norm: float, bound: float) -> float:
    """The factor ``min(1, bound / norm)`` that brings an update of norm ``norm`` within
    ``bound`` (1 for a zero update)."""
    return 1.0 if norm <= bound else bound / norm


def clip_update(delta: TensorDict, bound: float) -> TensorDict:
    """``delta · min(1, bound / ‖delta‖)``: the update scaled to L2 norm at most ``bound``,
    its direction kept; an update within the bound is returned as it is."""
    scale = clip_scale(update_norm(delta), bound)
    return delta if scale == 1.0 else {k: v * scale for k, v in delta.items()}


def median_bound(norms: Sequence[float]) -> float:
    """The lower median of ``norms`` (with two clients, the smaller norm: an even count never
    averages in the largest update)."""
    if not norms:
        raise ValueError("no update norms to take the median of")
    return sorted(norms)[(len(norms) - 1) // 2]


def _scaled(model: TensorDict, start: TensorDict, scale: float) -> TensorDict:
    """``model`` with every tensor of :func:`update_delta` moved to ``start + scale · Δ``."""
    delta = update_delta(model, start)
    return {k: (start[k] + scale * delta[k] if k in delta else x) for k, x in model.items()}


def model_norms(result: ClientResult, origins: Origins) -> list[float | None]:
    """Per model index of ``result``, the norm of its update (params and buffers together),
    or None where the result shares nothing of that model."""
    starts, start_buffers = origins
    out: list[float | None] = []
    for k, params in enumerate(result.params):
        buffers = result.buffers[k] if k < len(result.buffers) else {}
        if (not params and not buffers) or k >= len(starts):
            out.append(None)
            continue
        sb = start_buffers[k] if k < len(start_buffers) else {}
        out.append(update_norm(update_delta(params, starts[k]), update_delta(buffers, sb)))
    return out


def clip_result(
    result: ClientResult, origins: Origins, bounds: Sequence[float | None]
) -> ClientResult:
    """``result`` with model ``k``'s update clipped to ``bounds[k]`` (None: left as it is);
    the result itself where no model is over its bound."""
    norms = model_norms(result, origins)
    scales = [
        1.0 if n is None or b is None else clip_scale(n, b)
        for n, b in zip(norms, bounds, strict=False)
    ]
    if all(s == 1.0 for s in scales):
        return result
    starts, start_buffers = origins
    params, buffers = list(result.params), list(result.buffers)
    for k, scale in enumerate(scales):
        if scale != 1.0:
            params[k] = _scaled(params[k], starts[k], scale)
            if k < len(buffers) and k < len(start_buffers):
                buffers[k] = _scaled(buffers[k], start_buffers[k], scale)
    return replace(result, params=params, buffers=buffers)


def round_bounds(norms: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Per model index, the median bound over the clients' norms of that model (``norms``: one
    list per client, None where a client shares nothing of the model)."""
    width = max((len(n) for n in norms), default=0)
    out: list[float | None] = []
    for k in range(width):
        seen = [n[k] for n in norms if k < len(n) and n[k] is not None]
        out.append(median_bound(seen) if seen else None)
    return out


def clip_results(
    pairs: Iterable[tuple[ClientResult, Origins]], rule: ClipRule | None
) -> Iterator[ClientResult]:
    """The results of a round with every model's update clipped by ``rule``: None (off: each
    result as it is), a fixed bound (each result as it arrives) or ``"median"`` (the bound of
    each model index the median of the round's norms, so every result is read before the
    first is passed on)."""
    if rule is None:
        for result, _ in pairs:
            yield result
        return
    if rule != "median":
        bound = float(rule)
        for result, origins in pairs:
            yield clip_result(result, origins, [bound] * len(result.params))
        return
    held = list(pairs)
    bounds = round_bounds([model_norms(r, o) for r, o in held])
    for result, origins in held:
        yield clip_result(result, origins, bounds)


def tensor_dicts(tree: Any) -> Iterator[TensorDict]:
    """Every non-empty dict of tensors in ``tree`` (dicts, lists and tuples walked): the models
    and buffer sets a server state holds."""
    if isinstance(tree, dict):
        if tree and all(isinstance(v, torch.Tensor) for v in tree.values()):
            yield tree
            return
        for v in tree.values():
            yield from tensor_dicts(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from tensor_dicts(v)


def nearest(model: TensorDict, candidates: Sequence[TensorDict]) -> TensorDict:
    """The candidate with ``model``'s tensor names and shapes nearest to it in L2 (``{}``
    when none has them: no update to measure)."""
    best, best_norm = {}, math.inf
    for cand in candidates:
        if cand.keys() != model.keys() or any(cand[k].shape != x.shape for k, x in model.items()):
            continue
        norm = update_norm(update_delta(model, cand))
        if norm < best_norm:
            best, best_norm = cand, norm
    return best


def nearest_origins(result: ClientResult, server: Any) -> Origins:
    """The start models of ``result`` where the tasks are not known (a deployment's server):
    for each model and buffer set it shares, the nearest of the same shape in ``server``."""
    candidates = list(tensor_dicts(server))
    params = [nearest(m, candidates) if m else {} for m in result.params]
    buffers = [nearest(b, candidates) if b else {} for b in result.buffers]
    return params, buffers
