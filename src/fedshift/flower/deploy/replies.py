"""The server's checks of its nodes' replies: a reply is taken only when it fits what the
server sent (the model's tensor names, shapes and dtypes, a norm not far beyond the sent
model's, finite values) and what its node declared at the handshake (its clients, their split
sizes). Each check returns what is wrong in a few words, or None; nothing here imports Flower.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from fedshift.algorithms.task import ClientResult


def _leaves(tree: Any, name: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(the innermost dict key above it, tensor) of every tensor in ``tree``."""
    if isinstance(tree, torch.Tensor):
        yield name, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, str(k))
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from _leaves(v, name)


class ModelSpec:
    """The tensors a server state holds, by name: each name's (shape, dtype) pairs and the
    largest norm of a tensor of that name and shape (what a reply's models are checked
    against)."""

    def __init__(self, server: Any) -> None:
        self.norms: dict[str, dict[tuple, float]] = {}
        for name, t in _leaves(server):
            key = (tuple(t.shape), t.dtype)
            norm = float(t.detach().double().norm()) if t.is_floating_point() else 0.0
            seen = self.norms.setdefault(name, {})
            seen[key] = max(seen.get(key, 0.0), norm)

    def check_model(self, model: Any, what: str, ratio: float | None) -> str | None:
        if not isinstance(model, dict):
            return f"{what} is a {type(model).__name__}, not a dict of tensors"
        sq_reply = sq_ref = 0.0
        for name, t in model.items():
            if not isinstance(t, torch.Tensor):
                return f"{what}[{name!r}] is a {type(t).__name__}, not a tensor"
            seen = self.norms.get(str(name))
            if seen is None:
                return f"{what} holds {name!r}, a tensor the server did not send"
            key = (tuple(t.shape), t.dtype)
            if key not in seen:
                sent = ", ".join(f"{list(s)} {d}" for s, d in seen)
                return f"{what}[{name!r}] is {list(t.shape)} {t.dtype}, the server sent {sent}"
            if t.is_floating_point():
                if not bool(torch.isfinite(t).all()):
                    return f"{what}[{name!r}] holds non-finite values"
                sq_reply += float(t.detach().double().norm()) ** 2
                sq_ref += seen[key] ** 2
        if ratio is not None:
            limit = ratio * (math.sqrt(sq_ref) + 1.0)
            if math.sqrt(sq_reply) > limit:
                return (
                    f"{what} has norm {math.sqrt(sq_reply):.3g}, over {limit:.3g} "
                    f"({ratio:g} x the sent model's {math.sqrt(sq_ref):.3g} + 1)"
                )
        return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _finite_tensors(tree: Any, what: str) -> str | None:
    for name, t in _leaves(tree):
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            return f"{what} {name!r} holds non-finite values"
    return None


def check_result(
    result: ClientResult, cid: int, declared: dict[str, Any], spec: ModelSpec, ratio: float
) -> str | None:
    """What is wrong with the training reply ``result`` to client ``cid``'s job (None: it
    fits); ``declared``: what the client's node said of it at the handshake."""
    if result.cid != cid:
        return f"it answers for client {result.cid!r}, the job was client {cid}'s"
    n, most = result.num_samples, int(declared["num_train"])
    if not _count(n) or n > most:
        return f"num_samples={n!r}, the client declared {most} training samples"
    if not _count(result.steps):
        return f"steps={result.steps!r} is not a count"
    if not isinstance(result.params, list) or not isinstance(result.buffers, list):
        return "its models are not lists"
    if len(result.params) != len(result.buffers):
        return f"{len(result.params)} parameter sets but {len(result.buffers)} buffer sets"
    for k, m in enumerate(result.params):
        if why := spec.check_model(m, f"model {k}", ratio):
            return why
    for k, m in enumerate(result.buffers):
        if why := spec.check_model(m, f"buffers {k}", None):
            return why
    for k, m in enumerate(result.momentum or []):
        if why := spec.check_model(m, f"momentum {k}", None):
            return why
    if why := _finite_tensors(result.upload, "upload"):
        return why
    telemetry = result.telemetry
    if not all(isinstance(v, int | float) for v in telemetry.values()):
        return "its telemetry holds values that are not numbers"
    if telemetry.get("steps") and not math.isfinite(float(telemetry.get("train_loss", 0.0))):
        return "its training loss is not finite"
    return None


def check_rows(
    rows: Any, cids: list[int], declared: dict[int, dict[str, Any]], train: bool
) -> str | None:
    """What is wrong with an evaluation reply's ``rows`` for clients ``cids`` (None: they
    fit): one row per client asked, counts with correct <= total <= the declared split (the
    train split's counts where ``train``, the train metrics, was asked for)."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "its rows are not a list of dicts"
    got = [r.get("cid") for r in rows]
    if sorted(got, key=repr) != sorted(cids, key=repr):
        return f"it has rows for clients {got}, asked for {cids}"
    for r in rows:
        cid, info = r["cid"], declared[r["cid"]]
        for split in ("test", "train"):
            total, correct = r.get(f"num_{split}"), r.get(f"{split}_correct")
            if split == "train" and not train:
                if total is not None or correct is not None:
                    return f"client {cid}: train counts that were not asked for"
                continue
            most = int(info[f"num_{split}"])
            if not (_count(total) and _count(correct) and correct <= total <= most):
                return (
                    f"client {cid}: {split}_correct={correct!r} of num_{split}={total!r}, the "
                    f"client declared {most} {split} samples"
                )
        nll = r.get("train_nll", 0.0)
        if not isinstance(nll, int | float) or not math.isfinite(nll) or nll < 0:
            return f"client {cid}: train_nll={nll!r}"
        k = r.get("cluster")
        if k is not None and not _count(k):
            return f"client {cid}: cluster={k!r}"
    return None
