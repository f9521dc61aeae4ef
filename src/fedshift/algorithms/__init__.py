"""Federated algorithms, one module each, registered by name."""

from fedshift.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    LocalTask,
    ModelOps,
    Phase,
    RoundContext,
    keep_shared,
)
from fedshift.algorithms.registry import algorithm_names, get_algorithm, register

__all__ = [
    "Algorithm",
    "ClientData",
    "ClientResult",
    "LocalTask",
    "ModelOps",
    "Phase",
    "RoundContext",
    "algorithm_names",
    "get_algorithm",
    "keep_shared",
    "register",
]
