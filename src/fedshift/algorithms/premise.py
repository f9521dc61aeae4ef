"""What an algorithm claims to be good at (its premise): declared by the class (``premise =``)
or read from its capabilities (drift-aware, clustered, personalised). The conformance harness
(:mod:`fedshift.testing`) checks each algorithm where its premise holds; ``fedshift list`` shows
it."""

from __future__ import annotations

from fedshift.algorithms import capabilities
from fedshift.algorithms.capabilities import DriftAware, Personalised
from fedshift.algorithms.clustered import ClusteredAlgorithm


def premise(cls: type) -> str:
    """What an algorithm claims to be good at (see the module docstring)."""
    declared = getattr(cls, "premise", None)
    if declared is not None:
        return declared
    if issubclass(cls, DriftAware) and "drift_flag" in _defined(cls):
        return "drift"
    if issubclass(cls, ClusteredAlgorithm):
        return "concepts"
    if issubclass(cls, Personalised):
        return "label_skew"
    return "iid"


def _defined(cls: type) -> set[str]:
    """Names defined by ``cls`` or a base outside the capability mixins."""
    return {
        name
        for klass in cls.__mro__
        if klass.__module__ != capabilities.__name__
        for name in vars(klass)
    }
