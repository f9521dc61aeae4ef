"""The values that cross the algorithm contract: what a client trains (:class:`LocalTask`, in
:class:`Phase` s), what it sees of its data (:class:`ClientData`), what comes back
(:class:`ClientResult`) and the round it happens in (:class:`RoundContext`).

They flow one way. An algorithm *describes* local training (a task of phases and a per-batch
loss); the engine runs it through an executor and hands back a result whose ``upload`` is what
the algorithm's :meth:`~fedshift.algorithms.base.Algorithm.upload` produced, kept apart from the
executor's ``telemetry``. Nothing here knows an executor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

#: named tensors: a model's parameters or buffers, a momentum or optimiser state
TensorDict = dict[str, torch.Tensor]
State = dict[str, Any]


@dataclass(frozen=True)
class RoundContext:
    """Where a hook is called: the round (1-based), the clients sampled in it, the time step
    of drift scenarios (0 without time), the round's local learning rate (after the run's
    decay; None outside a training round) and the number of training clients of the
    federation (SCAFFOLD's and FedDyn's server steps scale by the sampled fraction)."""

    round: int
    sampled: tuple[int, ...] = ()
    step: int = 0
    lr: float | None = None
    num_clients: int = 0


@dataclass
class Batch:
    """One local mini-batch: inputs, labels and the samples' positions in the train split.

    ``mask`` (1 for real samples, 0 for padding) is set by executors that pad clients with
    fewer samples to a common batch size; losses must average with :meth:`mean`.
    """

    x: torch.Tensor
    y: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor | None = None
    #: the local step within the stage (0-based, the same for every client of a batched step),
    #: e.g. to index random draws a task made in ``client_task`` (FedGen's generator inputs)
    step: int = 0

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Mean of per-sample ``values`` over the real (unpadded) samples."""
        if self.mask is None:
            return values.mean()
        return (values * self.mask).sum() / self.mask.sum().clamp_min(1)


def _selected(
    trainable: tuple[tuple[int, tuple[str, ...] | None], ...] | None,
    model: int,
    names: Iterable[str],
) -> list[str]:
    """The names of model ``model``'s parameters a ``trainable`` selection picks (in order)."""
    names = list(names)
    if trainable is None:
        return names
    for m, sel in trainable:
        if m == model:
            return names if sel is None else [n for n in names if n in sel]
    return []


@dataclass(frozen=True)
class Adversary:
    """The other player of a min-max stage (a mutual-information critic, a discriminator).

    On every mini-batch of its phase, before the phase's own step, the adversary's parameters
    (``trainable``, never trained by the phase itself) take ``steps`` optimiser steps on
    ``loss`` (an algorithm method with the signature of ``local_loss``, minimised; a critic
    that maximises an estimate returns its negative), with every other parameter held fixed;
    then the phase's step sees the updated adversary. ``warmup_steps``: adversary-only steps
    at the start of the stage, before the phase's first step (nothing else moves): warm-up step
    ``w`` reuses the client's mini-batch ``w mod S`` of the stage (``S``: its steps in the
    stage), with ``Batch.step`` 0. ``optimizer``: ``adam`` (torch's Adam, ``betas``, ``eps``)
    or ``sgd``; its state starts fresh in every stage (warm-up steps count in Adam's step
    count). A client's adversary thus takes ``warmup_steps + steps * S`` steps in a stage.
    BatchNorm statistics are not updated by the adversary's forward passes.
    """

    loss: str
    trainable: tuple[tuple[int, tuple[str, ...] | None], ...]
    steps: int = 1
    lr: float = 1e-3
    optimizer: str = "adam"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"adversary optimizer {self.optimizer!r}: allowed: adam, sgd")
        if self.steps < 1 or self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError("an adversary needs steps >= 1, warmup_steps >= 0 and lr > 0")

    def trained_names(self, model: int, names: Iterable[str]) -> list[str]:
        """The names of model ``model``'s parameters the adversary trains (in ``names`` order)."""
        return _selected(self.trainable, model, names)


@dataclass(frozen=True)
class Phase:
    """One stage of a client's local training (FedRep trains head then body, for example).

    ``loss`` names the algorithm method computing the batch loss (same signature as
    :meth:`~fedshift.algorithms.base.Algorithm.local_loss`); it may return ``(loss, values)``,
    ``values`` a dict of scalar tensors to record (:func:`loss_and_values`; an adversary's loss
    too). ``trainable`` lists, per model
    index, the parameter names trained in this stage (``None``: all of that model's); models not
    listed are frozen; ``trainable`` None trains every parameter of every model.

    Every other field overrides the run's train settings for this stage when set: ``lr``
    (absolute, instead of the round's lr), ``epochs`` or ``steps`` (a fixed number of steps),
    ``batch_size``, ``drop_last``, ``momentum``, ``weight_decay`` and ``clip`` (True: the run's
    gradient clipping, False: none, a number: that max norm). Momentum buffers start fresh in
    every stage (or, with ``train.keep_momentum``, from the client's stored buffer of each
    parameter). ``stop_below``: early stopping; after each epoch from the second, a client
    ends the stage when its epoch's mean training loss fell by less than this (Flash).
    ``stop_std_below``: a client ends the stage once the standard deviation of the last
    ``stop_window`` passes' losses (each pass's last step) is below this, after at least
    ``stop_window + 1`` passes; a pass is an epoch, or ``pass_steps`` steps of a stage counted
    in ``steps`` (which are then the most it runs): FedALA's "until convergence".
    ``adversary``: the max player of a min-max stage (:class:`Adversary`), stepped with its
    own optimiser on each mini-batch before the phase's step (DFL's critics).
    """

    loss: str = "local_loss"
    trainable: tuple[tuple[int, tuple[str, ...] | None], ...] | None = None
    epochs: int | None = None
    steps: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    drop_last: bool | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    clip: bool | float = True
    stop_below: float | None = None
    stop_std_below: float | None = None
    stop_window: int = 10
    pass_steps: int | None = None
    adversary: Adversary | None = None

    def trained_names(self, model: int, names: Iterable[str]) -> list[str]:
        """The names of model ``model``'s parameters this stage's own step trains (in ``names``
        order; never the adversary's)."""
        names = list(names)
        own = _selected(self.trainable, model, names)
        if self.adversary is None:
            return own
        theirs = set(self.adversary.trained_names(model, names))
        return [n for n in own if n not in theirs]


DEFAULT_PHASES = (Phase(),)


def loss_and_values(out: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A loss method's result as ``(loss, values)``: a loss (a scalar tensor) may come alone or
    with a dict of scalar tensors it records (e.g. a critic's estimate as the step saw it).
    Executors detach the values, average each one over the client's steps that returned it
    (a phase's and its adversary's, warm-up included; finished clients' masked steps not
    counted) and add the means to the client's upload under their names (a name the
    algorithm's ``upload`` also returns is an error). Values cost nothing extra to return and
    work under ``vmap``, where a loss cannot write anywhere else."""
    if isinstance(out, tuple):
        loss, values = out
        return loss, dict(values)
    return out, {}


@dataclass
class LocalTask:
    """What a client trains: K models' start points, per-client extras of the loss, and
    client-side values for its upload and state.

    Start points are read, never written, by executors (they copy before training), so a task
    may reference the server's tensors directly: building all tasks of a round then costs no
    memory per client. ``extras`` are passed to the loss (stacked over clients by the batched
    executor); ``info`` is not (e.g. IFCA's chosen cluster, read by ``upload`` and
    ``client_update``). ``stream``: the seed parts of the generator of the batch order and
    augmentation (None: the engine's per round and client stream).
    """

    params: list[TensorDict]
    buffers: list[TensorDict]
    extras: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    train: bool = True  # False: the client does no local SGD this round
    phases: tuple[Phase, ...] = DEFAULT_PHASES  # stages of local training, in order
    stream: tuple[int, ...] | None = None
    # the data to train on, when not the client's train split (e.g. FedDAA's clean clients
    # train on the previous and the current step's data): pool indices and labels
    train_idx: torch.Tensor | None = None
    y_train: torch.Tensor | None = None
    # the client's SGD momentum buffers per model (name -> tensor), set by the engine when
    # momentum is kept across rounds (train.keep_momentum); None: every stage starts fresh
    momentum: list[TensorDict] | None = None
    # the client's local epochs this round, set by the engine when local work is unequal
    # (train.local_epochs_max): replaces the run's epochs in phases without their own
    epochs: int | None = None


@dataclass
class ClientResult:
    """What comes back from a client's local training.

    ``upload``: what the algorithm's ``upload`` hook computed (sent to the server with the
    models) and the mean over the client's steps of each value its losses recorded
    (:func:`loss_and_values`); ``telemetry``: the executor's measurements (``train_loss``,
    ``steps``), never read by algorithms; ``momentum``: the client's SGD momentum buffers, kept by the engine;
    ``steps``: the local SGD steps the client took, over all stages (FedNova normalises by
    them, SCAFFOLD's option II divides by them).
    """

    cid: int
    num_samples: int
    params: list[TensorDict]
    buffers: list[TensorDict]
    upload: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, float] = field(default_factory=dict)
    momentum: list[TensorDict] | None = None
    steps: int = 0


@dataclass
class ClientData:
    """A client's data as an algorithm sees it: pool indices, labels, an input function, and
    whether it is a test-only client (its train split is then its labelled adaptation split).

    Drift scenarios add the time step and the client's previous step's train split
    (``prev_idx``/``prev_y``, empty at the first step). ``concept``/``prev_concept`` are ground
    truth, for oracle methods only.
    """

    cid: int
    train_idx: torch.Tensor
    y_train: torch.Tensor
    inputs: Callable[..., torch.Tensor]
    eval_batch: int = 1024
    test_only: bool = False
    step: int = 0
    prev_idx: torch.Tensor | None = None
    prev_y: torch.Tensor | None = None
    concept: int | None = None
    prev_concept: int | None = None

    @property
    def num_train(self) -> int:
        return int(self.train_idx.numel())
