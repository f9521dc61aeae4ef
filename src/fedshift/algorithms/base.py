"""The algorithm contract: hooks that say what a client does and what the server does.

An algorithm is a class with a hyper-parameter schema (``Params``, a pydantic model) and a few
hooks, registered by name. State is explicit: the server state and each client's persistent
state are plain dicts of tensors (or lists/dicts of them), so the engine can store, checkpoint
and ship them; their keys are declared as TypedDicts (``ServerState``, ``ClientState``) and
checked whenever a hook returns one. The contract is one-way: an algorithm never imports the engine, reads files or
prints; it *describes* work and the engine runs it.

One round, in the order the engine calls the hooks:

1. ``client_task(server, client, data, ctx)`` -> :class:`LocalTask`: the start models, the
   per-client extras of ``local_loss`` and the stages of training. Pure: it does not change
   the client's state.
2. An executor trains the task (``local_loss`` per batch) and calls ``upload(task, params,
   buffers, data)``: what the client sends besides its models (FedRC's label statistics,
   FedNH's class means). The result carries it as ``upload``, apart from the executor's
   ``telemetry``.
3. ``client_update(server, client, task, result)`` -> the client's new persistent state
   (``server`` is what it received).
4. ``aggregate(server, results, ctx)`` -> the new server state, reading the results' models
   and uploads as they stream in.

Optional capabilities are mixins of :mod:`fedshift.algorithms.capabilities`, named at the
class line: ``Personalised`` (clients scored with a model of their own), ``FineTunes`` (a task
the engine trains before scoring: FedRC-FT, FedBABU), ``AdaptsTestClients`` (test-only clients'
state from their adaptation split: a cluster choice, FedRC's ω) and ``DriftAware`` (hooks at
the start of each time step: FedDAA, FedDrift). Evaluation asks, per client, ``mixture``
(weighted models) or ``predict``. The number of models lives in the server state;
``num_initial_models`` only says how many the engine initialises.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from fedshift.algorithms.ops import ModelOps
from fedshift.algorithms.server_opt import ServerOptimizer
from fedshift.algorithms.task import (
    DEFAULT_PHASES,
    Adversary,
    Batch,
    ClientData,
    ClientResult,
    LocalTask,
    Phase,
    RoundContext,
    State,
    TensorDict,
    loss_and_values,
)
from fedshift.core.errors import ConfigError, FedshiftError, did_you_mean

__all__ = [
    "as_float",
    "DEFAULT_PHASES",
    "Adversary",
    "Algorithm",
    "Batch",
    "ClientData",
    "ClientResult",
    "HyperParams",
    "LocalTask",
    "Mixture",
    "ModelOps",
    "TensorDict",
    "Phase",
    "RoundContext",
    "RunningAverage",
    "State",
    "TrainDefaults",
    "check_task",
    "clone_params",
    "loss_and_values",
    "softmax_probs",
    "weighted_average",
]


class HyperParams(BaseModel):
    """Base of every algorithm's hyper-parameter schema (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class TrainDefaults:
    """The run's local-training settings, for hyper-parameters that default to them (e.g.
    FedRC-FT's fine-tuning lr); given to the algorithm at construction."""

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 128
    local_epochs: int = 1
    local_steps: int | None = None


class Algorithm(ABC):
    """Base class: subclasses set ``name``, ``Params`` and implement the hooks."""

    name: ClassVar[str]
    Params: ClassVar[type[HyperParams]] = HyperParams
    #: the paper that proposed the method (authors, title, venue and year), for ``fedshift
    #: list`` and the README's algorithm table
    paper: ClassVar[str] = ""
    #: whether local training can run on the batched executor (a pure, vmap-able local_loss)
    supports_batched: ClassVar[bool] = True
    #: what the method claims to be good at, checked by :mod:`fedshift.testing` (``iid``,
    #: ``concepts``, ``label_skew``, ``feature_skew``, ``drift``); None: follows from its
    #: capabilities (clustered: concepts, personalised: label skew, drift flags: drift)
    premise: ClassVar[str | None] = None
    #: the keys of the server and client states, as TypedDicts (:mod:`fedshift.algorithms.
    #: states`); the engine checks every state a hook returns against them
    ServerState: ClassVar[type | None] = None
    ClientState: ClassVar[type | None] = None
    #: training settings (``train.<key>``) the authors' code uses where they change the result,
    #: taken when a config leaves the key unset (a set key wins); ``reference_train_source``
    #: says where in the code they come from. Runs list what they took (``summary.json``
    #: ``algorithm_defaults``, the ``run`` command's header) and ``compare`` notes differences.
    reference_train: ClassVar[dict[str, Any]] = {}
    reference_train_source: ClassVar[str] = ""
    #: client-state keys that hold copies of what the client uploads anyway (MOON's previous
    #: local model is its last upload): the server knows them, so they are not private. Every
    #: other key of a client state never leaves the client (see :meth:`shared_result`).
    shared_state_keys: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        hp: HyperParams,
        ops: ModelOps,
        num_classes: int,
        *,
        seed: int,
        train: TrainDefaults,
    ) -> None:
        """``seed``: the run seed, the root of the method's own random draws; ``train``: the
        run's local-training settings (for hyper-parameters that default to them). Both are
        required: an algorithm built outside the runner must say them."""
        self.hp, self.ops, self.num_classes = hp, ops, num_classes
        self.seed, self.train_defaults = int(seed), train

    def server_optimizer(self) -> ServerOptimizer | None:
        """The server optimiser the method applies to its averaged models' pseudo-gradient
        (:mod:`fedshift.algorithms.server_opt`; FedAvgM, FedAdam, ...); a config's
        ``train.server_optimizer`` replaces it. Default: none (the aggregate is the model)."""
        return None

    def num_initial_models(self) -> int:
        """How many fresh models ``init_server_state`` receives (K of clustered methods)."""
        return 1

    @classmethod
    def adapt_model(cls, model: nn.Module, hp: HyperParams) -> nn.Module:
        """The network this method trains, made from the configured body + head model
        (default: unchanged; FedNH swaps the head for fixed prototypes, for example)."""
        return model

    @classmethod
    def parse_params(cls, raw: dict[str, Any]) -> HyperParams:
        """Validate hyper-parameters; a wrong key or value is a one-line ConfigError."""
        try:
            return cls.Params.model_validate(raw)
        except ValidationError as err:
            e = err.errors()[0]
            key = ".".join(str(p) for p in e["loc"])
            allowed = ", ".join(cls.Params.model_fields) or "none"
            msg = e["msg"].replace("Input should be", "must be").replace("Value error, ", "")
            if e["type"] == "extra_forbidden":
                msg = f"unknown key{did_you_mean(str(e['loc'][-1]), cls.Params.model_fields)}"
            raise ConfigError(
                f"algorithm.params.{key}: {msg} (parameters of {cls.name}: {allowed})"
            ) from None

    # ------------------------------------------------------------------ server side
    @abstractmethod
    def init_server_state(self, init: Sequence[tuple[TensorDict, TensorDict]]) -> State:
        """Server state from ``num_initial_models()`` fresh (params, buffers) pairs."""

    def init_client_state(self, cid: int) -> State:
        """Persistent per-client state before the client first participates."""
        return {}

    @abstractmethod
    def aggregate(self, server: State, results: Iterable[ClientResult], ctx: RoundContext) -> State:
        """New server state from the sampled clients' results (models and ``upload``).

        ``results`` is streamed from the executor (one chunk of clients at a time): iterate it
        once, keeping only what the new state needs, so memory does not grow with clients.
        """

    # ------------------------------------------------------------------ client side
    @abstractmethod
    def client_task(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> LocalTask:
        """The local training task of a sampled client (pure: the client state is read only)."""

    def local_loss(
        self,
        params: list[TensorDict],
        buffers: list[TensorDict],
        batch: Batch,
        extras: dict[str, Any],
    ) -> torch.Tensor:
        """Per-batch loss over the client's K models (default: cross-entropy of model 0); a
        loss may also return values to record: ``(loss, values)``, see
        :func:`~fedshift.algorithms.task.loss_and_values`."""
        logits = self.ops.forward(params[0], buffers[0], batch.x)
        return batch.mean(F.cross_entropy(logits, batch.y, reduction="none"))

    def upload(
        self, task: LocalTask, params: list[TensorDict], buffers: list[TensorDict], data: ClientData
    ) -> dict[str, Any]:
        """What the client sends besides its models, computed after local training from the
        task (its start models, extras and info) and the trained models. Default: nothing."""
        return {}

    def client_update(
        self, server: State, client: State, task: LocalTask, result: ClientResult
    ) -> State:
        """The client's persistent state after the round (default: unchanged); ``server`` is
        the state the round started from (what the client received)."""
        return client

    def shared_result(self, task: LocalTask, result: ClientResult) -> ClientResult:
        """What of a client's result leaves the client: ``aggregate`` receives only this, in
        simulation as in a deployment (a Flower node sends nothing else), so a method cannot
        come to depend on what a deployment keeps private. ``client_update`` still sees the
        whole result. Default: the result without its momentum buffers; personalised methods
        also drop their private models or layers (:func:`keep_shared`)."""
        return keep_shared(result)

    def private_state(self, client: State) -> State:
        """The part of a client state that never leaves the client: a Flower node refuses to
        send a message holding any of its tensors. Default: every key but
        :attr:`shared_state_keys`; a method whose state mixes shared and private layers in one
        key (FedPer's local model: the body is uploaded, the head is not) says it finer."""
        return {k: v for k, v in client.items() if k not in self.shared_state_keys}

    def round_diagnostics(self, server: State) -> dict[str, Any]:
        """Numbers the method reports about its latest round (e.g. DFL's critics' MI
        estimates), logged with each evaluation. Default: none."""
        return {}

    def task_logit_models(self, server: State) -> list[tuple[TensorDict, TensorDict]]:
        """The server models whose eval-mode logits over a client's train split its
        :meth:`client_task` reads (through ``self.ops.logits``), e.g. an E-step's or a cluster
        choice's models. The engine computes each one's logits over the round's sampled
        clients in one pass before the tasks (or reads the last evaluation's), so a client's
        task reads its rows instead of running the model on its own. Default: none."""
        return []

    def mixture(self, server: State, client: State, data: ClientData) -> Mixture | None:
        """The models answering for a client, as (weight, params, buffers) triples.

        Prediction is sum_k weight_k * softmax(model_k(x)). Clients that share a model object
        are evaluated in one pass over all their samples. Return None to use :meth:`predict`.
        """
        return None

    def predict(
        self, server: State, client: State, data: ClientData, idx: torch.Tensor
    ) -> torch.Tensor:
        """Class probabilities [n, C] for pool indices ``idx`` of a client: the mixture's
        (override it for predictions that are no model mixture, e.g. FedProto's nearest
        prototype)."""
        mix = self.mixture(server, client, data)
        if mix is None:
            raise TypeError(f"{self.name} defines neither mixture() nor predict()")
        out = None
        for w, p, b in mix:
            probs = w * softmax_probs(self.ops.logits(p, b, data.inputs, idx, data.eval_batch))
            out = probs if out is None else out + probs
        return out

    def cluster_of(self, server: State, client: State) -> int | None:
        """The cluster a client is assigned to (arg-max weight), for clustering diagnostics;
        None for methods without clusters."""
        return None

    def global_model(self, server: State) -> tuple[TensorDict, TensorDict] | None:
        """The single global model, if the method has one (for GM-style metrics)."""
        return None

    def local_model(self, result: ClientResult) -> tuple[TensorDict, TensorDict]:
        """A client's personal model after local training, for methods without a personal
        model of their own (FedNH's protocol scores the latest local model): model 0."""
        return result.params[0], result.buffers[0]


# ---------------------------------------------------------------------- sharing


def keep_shared(
    result: ClientResult,
    private: Sequence[int] = (),
    names: Mapping[int, Container[str]] | None = None,
    buffer_names: Mapping[int, Container[str]] | None = None,
) -> ClientResult:
    """``result`` as the server may see it: no momentum, the models at the indices in
    ``private`` emptied (indices keep their meaning), and of model ``k`` only the parameters
    in ``names[k]`` and the buffers in ``buffer_names[k]`` where those are given."""

    def part(models: list[TensorDict], keep: Mapping[int, Container[str]] | None):
        return [
            {} if k in private
            else m if keep is None or k not in keep
            else {n: t for n, t in m.items() if n in keep[k]}
            for k, m in enumerate(models)
        ]  # fmt: skip

    return replace(
        result,
        params=part(result.params, names),
        buffers=part(result.buffers, buffer_names),
        momentum=None,
    )


# ---------------------------------------------------------------------- checks


def check_task(algo: Algorithm, task: LocalTask, hook: str = "client_task") -> LocalTask:
    """``task`` unchanged, or a :class:`~fedshift.core.errors.FedshiftError` naming what in it cannot
    run: a phase or adversary whose ``loss`` is no method of the algorithm, a ``trainable``
    model index or parameter name the task's models do not have, or unequal params and
    buffers. The engine calls it on every task it is given, so a typo fails when the task is
    built, not in the middle of training."""
    where = f"{algo.name}.{hook}"
    if len(task.params) != len(task.buffers):
        raise FedshiftError(
            f"{where}: {len(task.params)} models' params but {len(task.buffers)} buffers"
        )
    for i, phase in enumerate(task.phases):
        players = [("phase", phase)] + ([("adversary", phase.adversary)] if phase.adversary else [])
        for what, player in players:
            _check_loss(algo, player.loss, f"{where}: {what} {i}")
            _check_trainable(player.trainable, task.params, f"{where}: {what} {i}")
    return task


def _check_loss(algo: Algorithm, name: str, where: str) -> None:
    if not callable(getattr(algo, name, None)):
        methods = [m for m in dir(algo) if m.endswith("loss") and not m.startswith("__")]
        raise FedshiftError(
            f"{where} names the loss {name!r}, which {type(algo).__name__} does not define"
            f"{did_you_mean(name, methods)}"
        )


def _check_trainable(trainable, params: list[TensorDict], where: str) -> None:
    for m, names in trainable or ():
        if not 0 <= m < len(params):
            raise FedshiftError(f"{where} trains model {m}, but the task has {len(params)}")
        unknown = [n for n in names or () if n not in params[m]]
        if unknown:
            raise FedshiftError(
                f"{where} trains {unknown[0]!r}, not a parameter of model {m}"
                f"{did_you_mean(unknown[0], params[m])}"
            )


# ---------------------------------------------------------------------- shared math helpers


def clone_params(p: TensorDict) -> TensorDict:
    """A detached copy of a parameter dict."""
    return {k: v.detach().clone() for k, v in p.items()}


class RunningAverage:
    """Sample-weighted average of tensor dicts, accumulated one dict at a time.

    One pass and O(one model) memory, so the server can aggregate client results as the
    executor streams them. Integer tensors (e.g. BatchNorm's ``num_batches_tracked``) are
    taken from the first dict.
    """

    def __init__(self) -> None:
        self.sums: TensorDict | None = None
        self.total = 0.0

    def add(self, d: TensorDict, weight: float) -> None:
        w = float(weight)
        if self.sums is None:
            self.sums = {
                k: (v * w if torch.is_floating_point(v) else v.clone()) for k, v in d.items()
            }
        else:
            for k, v in d.items():
                if torch.is_floating_point(v):
                    self.sums[k].add_(v, alpha=w)
        self.total += w

    def result(self) -> TensorDict:
        if self.sums is None or self.total <= 0:
            raise ValueError("no (positively weighted) client results to average")
        return {
            k: (v / self.total if torch.is_floating_point(v) else v) for k, v in self.sums.items()
        }


def weighted_average(dicts: Iterable[TensorDict], weights: Iterable[float]) -> TensorDict:
    """Weighted average of tensor dicts (see :class:`RunningAverage`)."""
    avg = RunningAverage()
    for d, w in zip(dicts, weights, strict=True):
        avg.add(d, w)
    return avg.result()


def as_float(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the run's float precision: float32 and float64 as they are, half precision
    widened to float32, integer and boolean tensors (counts, masks) in torch's default dtype
    (float32, unless a caller set another: the test suite compares executors in float64)."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    if t.is_floating_point():
        return t.float()
    return t.to(torch.get_default_dtype())


def softmax_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(as_float(logits), dim=-1)


Mixture = list[tuple[float, TensorDict, TensorDict]]
