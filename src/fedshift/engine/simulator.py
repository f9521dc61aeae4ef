"""The simulator: rounds of client sampling, local work through an executor, aggregation,
evaluation, and callbacks (progress, logging, checkpoint).

The engine never knows which algorithm runs. Randomness comes from independent streams derived
from the run seed: client sampling (per round), each client's mini-batch order (per round and
client) and model initialisation (per model), so that changing the algorithm or the executor
does not change which clients are sampled, and a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from fedshift.algorithms.base import Algorithm, State
from fedshift.data.scenario import FederatedData
from fedshift.engine.evaluation import client_data, evaluate
from fedshift.engine.executors import LocalSchedule, SequentialExecutor
from fedshift.engine.training import SGDConfig, derive_seed, round_lr

SAMPLE_STREAM, INIT_STREAM = 11, 20


def sample_clients(num_clients: int, rate: float, seed: int, rnd: int) -> list[int]:
    """The clients sampled in round ``rnd`` (at least one), from their own RNG stream."""
    k = max(1, int(round(rate * num_clients)))
    if k >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(derive_seed(seed, SAMPLE_STREAM, rnd))
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


@dataclass
class SimState:
    """Everything a checkpoint must hold to resume exactly."""

    round: int  # rounds completed
    server: State
    clients: dict[int, State]
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0  # seconds of training+evaluation so far
    # latest local model (params, buffers) per client, kept only for personalised-model
    # metrics of methods whose personal model is the client's last local model (FedNH's protocol)
    local_models: dict[int, tuple[Any, Any]] = field(default_factory=dict)


class Callback(Protocol):
    def on_start(self, sim: Simulator, state: SimState) -> None: ...
    def on_round_end(self, sim: Simulator, state: SimState, metrics: dict | None) -> None: ...
    def on_end(self, sim: Simulator, state: SimState) -> None: ...


@dataclass
class SimConfig:
    rounds: int
    participation: float
    sgd: SGDConfig
    schedule: LocalSchedule
    eval_every: int = 1
    train_metrics: bool = True
    eval_batch: int = 1024
    seed: int = 0
    lr_decay: float = 1.0
    personal: str = "none"  # "none" | "active" | "all": see EvalConfig.personal


class Simulator:
    """Runs a federated algorithm on a :class:`FederatedData` for a number of rounds."""

    def __init__(
        self,
        algo: Algorithm,
        data: FederatedData,
        cfg: SimConfig,
        executor: Any | None = None,
        callbacks: list[Callback] | None = None,
    ) -> None:
        self.algo, self.data, self.cfg = algo, data, cfg
        self.executor = executor or SequentialExecutor()
        self.callbacks = list(callbacks or [])

    def initial_state(self) -> SimState:
        inits = [
            self.algo.ops.init(derive_seed(self.cfg.seed, INIT_STREAM, k))
            for k in range(self.algo.num_models)
        ]
        return SimState(round=0, server=self.algo.init_server_state(inits), clients={})

    def is_eval_round(self, rnd: int) -> bool:
        return rnd % self.cfg.eval_every == 0 or rnd == self.cfg.rounds

    def run_round(self, state: SimState) -> dict[str, Any] | None:
        """Run round ``state.round + 1`` in place; return its metrics if it is evaluated."""
        t0 = time.perf_counter()
        rnd = state.round + 1
        algo, data = self.algo, self.data
        sampled = sample_clients(len(data.clients), self.cfg.participation, self.cfg.seed, rnd)
        jobs = []
        for cid in sampled:
            cstate = state.clients.get(cid) or algo.init_client_state(cid)
            state.clients[cid] = cstate
            view = client_data(data, data.clients[cid], self.cfg.eval_batch)
            jobs.append((algo.client_task(state.server, cstate, view), view))
        losses: list[float] = []
        sgd = replace(self.cfg.sgd, lr=round_lr(self.cfg.sgd.lr, self.cfg.lr_decay, rnd))
        keep_local = self.cfg.personal != "none" and not algo.personalised
        if keep_local and self.cfg.personal == "active":
            state.local_models = {}

        def stream():  # client updates and loss statistics as results arrive
            for r in self.executor.train(algo, jobs, sgd, self.cfg.schedule, self.cfg.seed, rnd):
                state.clients[r.cid] = algo.client_update(state.server, state.clients[r.cid], r)
                if keep_local:
                    state.local_models[r.cid] = algo.local_model(r)
                if r.stats.get("steps"):
                    losses.append(r.stats["train_loss"])
                yield r

        results = stream()
        state.server = algo.aggregate(state.server, results, rnd)
        for _ in results:  # an aggregate that stopped early still updates every client
            pass
        state.round = rnd
        metrics = None
        if self.is_eval_round(rnd):
            metrics = {
                "round": rnd,
                **evaluate(
                    algo,
                    state.server,
                    state.clients,
                    data,
                    self.cfg.train_metrics,
                    self.cfg.eval_batch,
                    personal=self._personal_clients(state, sampled),
                    local_models=state.local_models,
                ),
            }
            metrics["local_loss"] = float(np.mean(losses)) if losses else float("nan")
            metrics["clients_sampled"] = len(sampled)
        state.elapsed += time.perf_counter() - t0
        if metrics is not None:
            metrics["elapsed_s"] = round(state.elapsed, 3)
            state.history.append(metrics)
        return metrics

    def _personal_clients(self, state: SimState, sampled: list[int]) -> list[int] | None:
        """Clients whose personalised models are scored this evaluation (None: no PM)."""
        if self.cfg.personal == "none":
            return None
        if self.cfg.personal == "active":
            return list(sampled)
        return sorted(state.clients)  # every client that has trained at least once

    def run(self, state: SimState | None = None) -> SimState:
        """Run (or continue) until ``cfg.rounds`` rounds are done."""
        state = state or self.initial_state()
        for cb in self.callbacks:
            cb.on_start(self, state)
        while state.round < self.cfg.rounds:
            metrics = self.run_round(state)
            for cb in self.callbacks:
                cb.on_round_end(self, state, metrics)
        for cb in self.callbacks:
            cb.on_end(self, state)
        return state
