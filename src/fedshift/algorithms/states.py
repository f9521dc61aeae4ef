"""Typed state: an algorithm names the keys of its server and client states as ``TypedDict`` s
(``ServerState``, ``ClientState`` class attributes), and the engine checks every state a hook
returns against them (:func:`check_state`): a missing or misspelt key fails where it is made,
with the closest declared name, not rounds later where it is read.

The shapes shared by many algorithms are here; an algorithm with more state extends one
(``class FlashServer(GlobalModel, total=False): flash: dict``: keys of a ``total=False``
class are optional). States stay plain dicts (of
tensors, lists and dicts of them, numbers), so the engine checkpoints and ships them as before.
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch

from fedshift.algorithms.task import State, TensorDict
from fedshift.core.errors import FedshiftError, did_you_mean


class NoState(TypedDict):
    """A state with nothing in it (clients of FedAvg-like methods keep nothing)."""


class GlobalModel(TypedDict):
    """One global model: its parameters and buffers."""

    params: TensorDict
    buffers: TensorDict


class OwnModel(TypedDict, total=False):
    """A client's own model, once it has trained (Personalised methods)."""

    params: TensorDict
    buffers: TensorDict


class SharedInit(GlobalModel):
    """A global model plus the shared initialisation that answers for clients that never
    trained (Ditto, Local)."""

    init_params: TensorDict
    init_buffers: TensorDict


class Clusters(TypedDict):
    """K cluster models, each ``{"params": ..., "buffers": ...}``."""

    models: list[dict[str, TensorDict]]


class HardAssignment(TypedDict, total=False):
    """A client's cluster (index) and the one-hot ω of it."""

    cluster: int
    omega: torch.Tensor


def check_state(algo: Any, state: State, which: str, hook: str) -> State:
    """``state`` unchanged, or a :class:`FedshiftError` naming the keys the algorithm's
    declared ``ServerState`` / ``ClientState`` (``which``: server or client) misses or does
    not know; undeclared states are not checked."""
    spec = getattr(algo, "ServerState" if which == "server" else "ClientState", None)
    if spec is None or not isinstance(state, dict):
        return state
    required, optional = spec.__required_keys__, spec.__optional_keys__
    missing = sorted(required - state.keys())
    unknown = sorted(state.keys() - required - optional)
    if missing:
        raise FedshiftError(
            f"{algo.name}.{hook} returned a {which} state without {missing[0]!r}, which its "
            f"{spec.__name__} requires"
        )
    if unknown:
        known = sorted(required | optional)
        raise FedshiftError(
            f"{algo.name}.{hook} returned a {which} state with {unknown[0]!r}, which its "
            f"{spec.__name__} does not declare{did_you_mean(unknown[0], known)} (declared: "
            f"{', '.join(known) or 'none'})"
        )
    return state
