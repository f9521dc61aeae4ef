"""Functional access to a model architecture: init, forward, sub-module calls, eval logits.

:class:`ModelOps` holds one module as a template; parameters are always passed in explicitly
(``torch.func.functional_call``), so one template serves every client and every cluster model,
and a batched executor can ``vmap`` over stacked parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedshift.algorithms.task import TensorDict


class ModelOps:
    """The model template of a run and functional calls of it."""

    def __init__(self, factory: Callable[[], nn.Module], device: torch.device) -> None:
        self.factory = factory
        self.device = device
        self.module = factory().to(device)
        # see memoised(): (model ids, index fingerprint) -> (params, buffers, inputs, logits)
        self._memo: dict[tuple, tuple] | None = None
        # see keep(): the last evaluation's passes, by model ids
        self._kept: dict[tuple[int, int], list[KeptPass]] = {}
        self.kept_reads = 0  # calls of logits() answered from a kept pass

    @contextmanager
    def memoised(self) -> Iterator[None]:
        """Within the block, :meth:`logits` of the same model objects over the same pool
        indices are computed once: e.g. the test-only clients of several concepts hold the
        same images and differ only in their labels, so one forward pass serves them all.
        The memo keeps what it stores alive until the block ends (ids stay unique)."""
        if self._memo is not None:  # already inside one
            yield
            return
        self._memo = {}
        try:
            yield
        finally:
            self._memo = None

    def forget(self) -> None:
        """Drop the kept passes (an evaluation keeps only its own, :meth:`keep`)."""
        self._kept.clear()

    def retain(self, models: list[tuple[TensorDict, TensorDict]]) -> None:
        """Drop the kept passes of every model but ``models``."""
        wanted = {(id(p), id(b)) for p, b in models}
        self._kept = {k: v for k, v in self._kept.items() if k in wanted}

    def has_kept(self, params, buffers, inputs, idx: torch.Tensor) -> bool:
        """Whether :meth:`logits` of this model over ``idx`` would read a kept pass."""
        return self._read_kept(params, buffers, inputs, idx) is not None

    def keep(
        self,
        params: TensorDict,
        buffers: TensorDict,
        inputs: Callable[[torch.Tensor], torch.Tensor],
        idx: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """Keep an evaluation's logits of a model over the distinct pool indices ``idx``, so
        that :meth:`logits` of the same model (the same objects, none of their tensors
        replaced or changed in place since) over any of those indices reads them instead of
        computing them again: the next round's E-step or cluster choice over the clients'
        train splits repeats the evaluation's pass exactly otherwise. Each sample's logits
        are a function of its row alone (a model in eval mode), so reading rows out of a pass
        over other batches gives the recomputed values (bit for bit where the kernels' results
        do not depend on the batch's size; a float rounding apart where they do)."""
        if not len(idx):
            return
        order = torch.sort(idx)
        kept = KeptPass(params, buffers, _versions(params, buffers), inputs, order, logits)
        self._kept.setdefault((id(params), id(buffers)), []).append(kept)

    def _read_kept(self, params, buffers, inputs, idx) -> torch.Tensor | None:
        """The rows of ``idx`` from a kept pass of this model that holds them all, or None."""
        for kept in self._kept.get((id(params), id(buffers)), ()):
            if kept.params is not params or kept.buffers is not buffers:
                continue
            if kept.inputs != inputs or kept.versions != _versions(params, buffers):
                continue
            values, rows = kept.order
            at = torch.searchsorted(values, idx).clamp_max(len(values) - 1)
            if bool((values[at] == idx).all()):
                return kept.logits[rows[at]]
        return None

    def init(self, seed: int) -> tuple[TensorDict, TensorDict]:
        """Fresh parameters and buffers, deterministic given ``seed`` (global RNG untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            m = self.factory().to(self.device)
        params = {k: v.detach().clone() for k, v in m.named_parameters()}
        buffers = {k: v.detach().clone() for k, v in m.named_buffers()}
        return params, buffers

    def forward(
        self, params: TensorDict, buffers: TensorDict, x: torch.Tensor, features: bool = False
    ) -> Any:
        """Logits (or ``(features, logits)``) of the model with the given parameters."""
        kwargs = {"return_features": True} if features else {}
        return functional_call(self.module, (params, buffers), (x,), kwargs)

    def call(
        self, name: str, params: TensorDict, buffers: TensorDict, *args: Any, **kwargs: Any
    ) -> Any:
        """Run the sub-module ``name`` (e.g. ``"body"``, ``"head"``, a branch of a two-branch
        network) functionally with the entries of ``params``/``buffers`` under its prefix."""
        sub = self.module.get_submodule(name)
        prefix = f"{name}."
        p = {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
        b = {k[len(prefix) :]: v for k, v in buffers.items() if k.startswith(prefix)}
        return functional_call(sub, (p, b), args, kwargs)

    @torch.no_grad()
    def logits(
        self,
        params: TensorDict,
        buffers: TensorDict,
        inputs: Callable[[torch.Tensor], torch.Tensor],
        idx: torch.Tensor,
        batch_size: int = 1024,
    ) -> torch.Tensor:
        """Eval-mode logits over pool indices ``idx``, in chunks of ``batch_size`` (once per
        model and indices inside :meth:`memoised`; read from the last evaluation's pass of the
        same model where it kept one, :meth:`keep`)."""
        if self._kept and len(idx):
            hit = self._read_kept(params, buffers, inputs, idx)
            if hit is not None:
                self.kept_reads += 1
                return hit
        if self._memo is None or not len(idx):
            return self._logits(params, buffers, inputs, idx, batch_size)
        key = (id(params), id(buffers), len(idx), _fingerprint(idx))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is params and hit[1] is buffers and hit[2] == inputs:
            return hit[3]
        out = self._logits(params, buffers, inputs, idx, batch_size)
        self._memo[key] = (params, buffers, inputs, out)
        return out

    def _logits(self, params, buffers, inputs, idx, batch_size) -> torch.Tensor:
        was = self.module.training
        self.module.eval()
        try:
            outs = [
                self.forward(params, buffers, inputs(idx[i : i + batch_size]))
                for i in range(0, len(idx), batch_size)
            ]
        finally:
            self.module.train(was)
        return torch.cat(outs) if outs else torch.empty(0, device=self.device)


@dataclass(frozen=True)
class KeptPass:
    """An evaluation's logits of one model (see :meth:`ModelOps.keep`): the model's objects and
    the (identity, in-place version) of each of its tensors when the pass ran, the inputs, the
    pass's pool indices sorted, with the row of each in ``logits`` (``torch.sort``)."""

    params: TensorDict
    buffers: TensorDict
    versions: tuple
    inputs: Callable[[torch.Tensor], torch.Tensor]
    order: Any  # torch.return_types.sort: (values, indices)
    logits: torch.Tensor


def _versions(params: TensorDict, buffers: TensorDict) -> tuple:
    """Each tensor's identity and in-place version counter: a tensor replaced in its dict or
    changed in place since makes a different tuple."""
    return tuple((k, id(t), t._version) for d in (params, buffers) for k, t in d.items())


def _fingerprint(idx: torch.Tensor) -> str:
    """A digest of an index tensor's values."""
    return hashlib.blake2b(idx.detach().cpu().numpy().tobytes(), digest_size=16).hexdigest()
