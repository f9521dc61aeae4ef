"""Federated algorithms, one module each, registered by name; and the contract they are written
against, in one import.

An author imports everything from here (``from fedshift.algorithms import FedAvg, register``):

- the hooks: :class:`Algorithm` (its hyper-parameter base :class:`HyperParams`, the run's
  :class:`TrainDefaults`) and the helpers of its hooks (:func:`keep_shared`,
  :class:`RunningAverage`, ...);
- what the hooks exchange with the engine: :class:`LocalTask` and its :class:`Phase` s,
  :class:`ClientData`, :class:`ClientResult`, :class:`RoundContext`, :class:`Batch`, ...;
- the optional capabilities, mixins named at the class line: :class:`Personalised`,
  :class:`FineTunes`, :class:`AdaptsTestClients`, :class:`DriftAware`;
- the K-model base of clustered methods, :class:`ClusteredAlgorithm`;
- the typed states (``ServerState``/``ClientState``): :class:`GlobalModel`, :class:`Clusters`, ...;
- the functional model calls, :class:`ModelOps`, and a server optimiser,
  :class:`ServerOptimizer`;
- the registry: :func:`register`, :func:`get_algorithm`, :func:`algorithm_names`;
- FedAvg and its reusable pieces, the usual base of a new method.

The built-in algorithm modules import from the submodules, never from this package, and the
registry imports them by name the first time an algorithm is looked up.
"""

from fedshift.algorithms.base import (
    Algorithm,
    HyperParams,
    Mixture,
    RunningAverage,
    TrainDefaults,
    clone_params,
    keep_shared,
    softmax_probs,
    weighted_average,
)
from fedshift.algorithms.capabilities import (
    AdaptsTestClients,
    DriftAware,
    DriftCheckParams,
    FineTunes,
    Personalised,
    own_model,
)
from fedshift.algorithms.clustered import ClusteredAlgorithm, ClusteredParams
from fedshift.algorithms.fedavg import FedAvg, FedAvgParams, average_models, client_weight
from fedshift.algorithms.ops import ModelOps
from fedshift.algorithms.registry import algorithm_names, get_algorithm, register
from fedshift.algorithms.server_opt import ServerOptimizer
from fedshift.algorithms.states import (
    Clusters,
    GlobalModel,
    HardAssignment,
    NoState,
    OwnModel,
    SharedInit,
)
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

__all__ = [
    # the hooks and their helpers
    "Algorithm",
    "HyperParams",
    "TrainDefaults",
    "keep_shared",
    "RunningAverage",
    "weighted_average",
    "clone_params",
    "softmax_probs",
    # what the hooks take and return
    "LocalTask",
    "Phase",
    "Adversary",
    "DEFAULT_PHASES",
    "loss_and_values",
    "Batch",
    "ClientData",
    "ClientResult",
    "RoundContext",
    "State",
    "TensorDict",
    "Mixture",
    # optional capabilities (mixins)
    "Personalised",
    "FineTunes",
    "AdaptsTestClients",
    "DriftAware",
    "DriftCheckParams",
    "own_model",
    # clustered methods
    "ClusteredAlgorithm",
    "ClusteredParams",
    # typed states
    "NoState",
    "GlobalModel",
    "OwnModel",
    "SharedInit",
    "Clusters",
    "HardAssignment",
    # model calls and server optimisers
    "ModelOps",
    "ServerOptimizer",
    # the registry
    "register",
    "get_algorithm",
    "algorithm_names",
    # FedAvg, the usual base, and its reusable pieces
    "FedAvg",
    "FedAvgParams",
    "average_models",
    "client_weight",
]
