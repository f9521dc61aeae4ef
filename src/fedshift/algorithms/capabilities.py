"""Optional capabilities of an algorithm, as small mixins: what a class does beyond the required
hooks of :class:`~fedshift.algorithms.base.Algorithm` is visible at its class line
(``class Ditto(Personalised, FedAvg)``), and the engine calls a capability's hooks only on the
algorithms that have it.

- :class:`Personalised` — a client is scored with a model of its own (its state, or one tuned
  for it); ``own_mixture`` answers with the client's own model, else the shared one;
- :class:`FineTunes` — before scoring, the engine trains a task of the client's
  (``fine_tune_task``: FedRC-FT, FedBABU, FedAvg + FT) and asks ``tuned_mixture``;
- :class:`AdaptsTestClients` — test-only clients get a state from their labelled adaptation
  split at each evaluation (a cluster choice, FedRC's ω), optionally carried across rounds;
- :class:`DriftAware` — hooks at the start of each time step of a drift scenario (FedDAA,
  FedDrift, the Oracle), and its own drift verdicts for the diagnostics.

Each mixin goes before the algorithm base in the class line, so its defaults take precedence
over the base's.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from fedshift.algorithms.base import HyperParams, Mixture
from fedshift.algorithms.task import (
    ClientData,
    ClientResult,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
)


def own_model(
    client: State, fallback: tuple[TensorDict, TensorDict]
) -> tuple[TensorDict, TensorDict]:
    """The client's own model (``client["params"]``, ``client["buffers"]``), else ``fallback``
    (the global model, or the shared initialisation, for a client that never trained)."""
    if "params" in client:
        return client["params"], client["buffers"]
    return fallback


class Personalised:
    """A client is scored with a model of its own (its state, or one tuned for it): the engine
    scores its personalised-model metrics with the algorithm's own prediction.

    :meth:`own_mixture` is the usual prediction: the client's own model, else the shared one
    (test-only clients, clients that never trained)."""

    def shared_model(self, server: State) -> tuple[TensorDict, TensorDict]:
        """The model that answers for a client without one of its own (default: the server's
        ``params``/``buffers``)."""
        return server["params"], server["buffers"]

    def own_mixture(self, server: State, client: State, data: ClientData) -> Mixture:
        """The client's own model (never for a test-only client), else :meth:`shared_model`."""
        own = {} if data.test_only else client
        return [(1.0, *own_model(own, self.shared_model(server)))]


class FineTunes:
    """Before a client is scored, the engine trains the task :meth:`fine_tune_task` returns
    (through the run's executor) and scores the models of :meth:`tuned_mixture`."""

    def fine_tune_task(self, server: State, client: State, data: ClientData) -> LocalTask | None:
        """The task the engine trains on the client's data before scoring it (None: none, the
        client is scored with ``mixture``)."""
        return None

    def tuned_mixture(
        self, server: State, client: State, data: ClientData, result: ClientResult
    ) -> Mixture:
        """The models answering for a client after its fine-tuning (default: tuned model 0)."""
        return [(1.0, result.params[0], result.buffers[0])]


class AdaptsTestClients:
    """Test-only clients get a state from their labelled adaptation split at each evaluation
    (e.g. the cluster their adaptation data fits best, FedRC's ω)."""

    #: whether :meth:`adapt_test_client` carries its state from call to call (an iteration
    #: across rounds, FedRC's carried ω): the engine then calls it after every round, not only
    #: at evaluations, so the result does not depend on ``eval.every``
    test_state_carried: bool = False

    def adapt_test_client(self, server: State, data: ClientData, state: State) -> State:
        """A test-only client's state at an evaluation; ``state`` is what this hook returned
        at the previous call (``{}`` at the first)."""
        return {}


class DriftCheckParams(HyperParams):
    """The hyper-parameter of every drift-aware method: when its step hooks run."""

    check_every: int = Field(
        default=0,
        ge=0,
        description="drift scenarios: 0 runs the step hooks (re-clustering, drift detection) "
        "at every round where some client's data changed (a timeline: every step's start); k "
        "runs them at rounds 1 + k, 1 + 2k, ... whether or not the data changed, so a change "
        "is seen at the next of those rounds",
    )


class DriftAware:
    """Hooks run at the *checks* of a drift scenario: round 1, then every round where some
    client's data changed (the start of a time step, or any round of ``scenario.drift``), or,
    with the ``check_every`` hyper-parameter k (:class:`DriftCheckParams`), every k rounds. Called in this order: :meth:`step_upload` for every client,
    :meth:`start_step` on the server, :meth:`step_update` for every client; a client whose
    data changed since the last check sees its data then in ``ClientData.prev_idx``/``prev_y``,
    any other client none. Then :meth:`diagnostics` and :meth:`drift_flag` are logged against
    the scenario's truth."""

    @property
    def check_every(self) -> int:
        """Rounds between checks (0: at every data change), from the hyper-parameters."""
        return int(getattr(self.hp, "check_every", 0))

    def step_upload(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> dict[str, Any] | None:
        """What a client sends at a step's start (with its new data and, in ``data``, its
        previous step's); e.g. FedDAA's data prototype. None: nothing."""
        return None

    def start_step(
        self, server: State, uploads: dict[int, dict[str, Any]], ctx: RoundContext
    ) -> State:
        """The server state at a step's start, from the step uploads; the number of models may
        change here (FedDAA's clustering). Default: unchanged."""
        return server

    def step_update(
        self, server: State, client: State, data: ClientData, ctx: RoundContext
    ) -> State:
        """A client's state at a step's start, after ``start_step`` (FedDAA's drift detection
        and its choice of training data). Default: unchanged."""
        return client

    def diagnostics(self, server: State) -> dict[str, Any]:
        """Numbers the method reports about itself at a step's start, logged with every
        evaluation of the step (e.g. FedDAA's NCD count). Default: none."""
        return {}

    def drift_flag(self, client: State) -> bool | None:
        """Whether the method judged the client's data to have truly drifted at this step
        (None: the method does not say)."""
        return None
