"""Server optimisers on the pseudo-gradient (Reddi et al., "Adaptive Federated Optimization",
ICLR 2021; Hsu et al., 2019, for server momentum).

After an algorithm's ``aggregate`` the engine treats the change of each averaged model as a
pseudo-gradient ``Δ = x_aggregated − x_previous`` and replaces the aggregated model by
``x_previous`` plus a server optimiser's step on ``Δ``. It applies to every averaged model of
the server state (``params``, one global model, or ``models[k]["params"]``, K cluster
models), so it composes with any algorithm that produces one (FedAdam on FedProx, FedYogi on
FedRC's cluster models), chosen by ``train.server_optimizer`` in the config or declared by an
algorithm (:meth:`~fedshift.algorithms.base.Algorithm.server_optimizer`: FedAvgM, FedAdam,
FedYogi, FedAdagrad). Buffers (BatchNorm statistics) keep the aggregated values.

The update of each tensor (Reddi et al., Algorithm 2; no bias correction, as in the paper)::

    sgd:      m ← momentum·m + Δ;                 x ← x + lr·m      (FedAvgM; lr 1, momentum 0: FedAvg)
    adagrad:  m ← β1·m + (1−β1)·Δ;  v ← v + Δ²                      x ← x + lr·m / (√v + τ)
    adam:     m ← β1·m + (1−β1)·Δ;  v ← β2·v + (1−β2)·Δ²
    yogi:     m ← β1·m + (1−β1)·Δ;  v ← v − (1−β2)·Δ²·sign(v − Δ²)

``v`` starts at τ² (the paper asks ``v_{-1} ≥ τ²``), ``m`` at zero. The optimiser state is
kept by the engine per model index and checkpointed with the run; a model whose shape changed
(or that is new, e.g. after FedDAA's re-clustering) starts a fresh state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from fedshift.algorithms.task import State, TensorDict

KINDS = ("sgd", "adam", "yogi", "adagrad")


@dataclass(frozen=True)
class ServerOptimizer:
    """A server optimiser's kind and hyper-parameters (names as in Reddi et al.: server lr
    ``η``, ``β1``, ``β2``, adaptivity ``τ``; ``momentum`` is FedAvgM's ``β``)."""

    kind: Literal["sgd", "adam", "yogi", "adagrad"]
    lr: float = 1.0
    momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"server optimizer {self.kind!r}: allowed: {', '.join(KINDS)}")

    def describe(self) -> dict[str, Any]:
        used = {"sgd": ("lr", "momentum")}.get(self.kind, ("lr", "beta1", "beta2", "tau"))
        return {"kind": self.kind, **{k: v for k, v in asdict(self).items() if k in used}}


@torch.no_grad()
def server_step(
    x: torch.Tensor,
    delta: torch.Tensor,
    m: torch.Tensor | None,
    v: torch.Tensor | None,
    opt: ServerOptimizer,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One server-optimiser step on one tensor: (new x, new m, new v). ``m``/``v`` None: the
    first step (m = 0, v = τ²)."""
    m = torch.zeros_like(x) if m is None else m
    if opt.kind == "sgd":
        m = opt.momentum * m + delta
        return x + opt.lr * m, m, None
    v = torch.full_like(x, opt.tau**2) if v is None else v
    m = opt.beta1 * m + (1 - opt.beta1) * delta
    d2 = delta * delta
    if opt.kind == "adagrad":
        v = v + d2
    elif opt.kind == "adam":
        v = opt.beta2 * v + (1 - opt.beta2) * d2
    else:  # yogi
        v = v - (1 - opt.beta2) * d2 * torch.sign(v - d2)
    return x + opt.lr * m / (v.sqrt() + opt.tau), m, v


def averaged_models(server: State) -> list[TensorDict] | None:
    """The averaged models' parameter dicts of a server state (``params``, or each
    ``models[k]["params"]``); None when it has neither."""
    if not isinstance(server, dict):
        return None
    if isinstance(server.get("params"), dict):
        return [server["params"]]
    models = server.get("models")
    if isinstance(models, list) and all(isinstance(m, dict) and "params" in m for m in models):
        return [m["params"] for m in models]
    return None


def _with_models(server: State, new: list[TensorDict]) -> State:
    if isinstance(server.get("params"), dict):
        return {**server, "params": new[0]}
    models = zip(server["models"], new, strict=True)
    return {**server, "models": [{**m, "params": p} for m, p in models]}


def apply_server_optimizer(
    before: State, after: State, opt: ServerOptimizer, state: dict[str, Any]
) -> tuple[State, dict[str, Any]]:
    """The server state ``after`` (an algorithm's aggregate of ``before``) with each averaged
    model replaced by the optimiser's step from ``before`` on ``Δ = after − before``, and the
    optimiser's new ``state`` (``{"m": [...], "v": [...]}``, one dict per model index)."""
    old, agg = averaged_models(before), averaged_models(after)
    if old is None or agg is None:
        raise ValueError("the server state has no averaged model (params or models)")
    ms, vs = list(state.get("m", [])), list(state.get("v", []))
    out, new_m, new_v = [], [], []
    for k, p_new in enumerate(agg):
        p_old = old[k] if k < len(old) else None
        m_k = ms[k] if k < len(ms) else {}
        v_k = vs[k] if k < len(vs) else {}
        model, mk, vk = {}, {}, {}
        for name, x_new in p_new.items():
            x = None if p_old is None else p_old.get(name)
            if x is None or x.shape != x_new.shape or not torch.is_floating_point(x_new):
                model[name] = x_new  # a new model (or tensor) starts where aggregate put it
                continue
            m, v = m_k.get(name), v_k.get(name)
            if m is not None and m.shape != x.shape:
                m = v = None
            model[name], mk[name], v_out = server_step(x, x_new - x, m, v, opt)
            if v_out is not None:
                vk[name] = v_out
        out.append(model)
        new_m.append(mk)
        new_v.append(vk)
    return _with_models(after, out), {"m": new_m, "v": new_v}
