"""The simulator: rounds of client sampling, local work through an executor, aggregation,
evaluation, and callbacks (progress, logging, checkpoint).

The engine never knows which algorithm runs. Randomness comes from independent streams derived
from the run seed: client sampling (per round), each client's mini-batch order (per round and
client) and model initialisation (per model), so that changing the algorithm or the executor
does not change which clients are sampled, and a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fedshift.algorithms.base import (
    Algorithm,
    ClientResult,
    LocalTask,
    RoundContext,
    State,
    TensorDict,
    check_task,
)
from fedshift.algorithms.capabilities import AdaptsTestClients, DriftAware, Personalised
from fedshift.algorithms.clipping import clip_results
from fedshift.algorithms.server_opt import (
    ServerOptimizer,
    apply_server_optimizer,
    averaged_models,
)
from fedshift.algorithms.states import check_state
from fedshift.config import TrainConfig
from fedshift.core.errors import ConfigError, DivergedError
from fedshift.core.seeds import INIT_STREAM, SAMPLE_STREAM, WORK_STREAM, derive_seed
from fedshift.data.federated import FederatedData
from fedshift.engine.evaluation import adapt_test_clients, client_data, evaluate, task_logits
from fedshift.engine.executors.base import (
    ClientJob,
    Executor,
    LazyJobs,
    RoundWork,
    SequentialExecutor,
)
from fedshift.engine.memory import MemoryPlan, release_freed_memory
from fedshift.engine.store import ClientStore
from fedshift.engine.trees import float_tensors

#: the run directory's folder of client states (see :class:`~fedshift.engine.store.ClientStore`)
STORE_DIR = "store"


def sample_clients(
    num_clients: int, rate: float, seed: int, rnd: int, available: list[int] | None = None
) -> list[int]:
    """The clients sampled in round ``rnd`` (at least one), from their own RNG stream: a share
    ``rate`` of the ``available`` clients (default: all; none available: nobody trains)."""
    pool = list(range(num_clients)) if available is None else list(available)
    if not pool:
        return []
    k = max(1, int(round(rate * len(pool))))
    if k >= len(pool):
        return pool
    rng = np.random.default_rng(derive_seed(seed, SAMPLE_STREAM, rnd))
    return sorted(np.asarray(pool)[rng.choice(len(pool), size=k, replace=False)].tolist())


def check_rounds(data: FederatedData, rounds: int, every: int = 0) -> dict[int, int]:
    """The rounds at which a drift scenario's step hooks run, each with the step of the last
    earlier check (0 for round 1): round 1, then the first round of every step (``every`` 0),
    or, with ``every`` k, the rounds 1 + k, 1 + 2k, ... whether or not the data changed (a
    method that looks every k rounds, and sees a change only at its next look)."""
    if not data.steps:
        return {}
    out, last = {1: 0}, data.step_of_round(1)
    for r in range(2, rounds + 1):
        step = data.step_of_round(r)
        if (every == 0 and step != last) or (every > 0 and (r - 1) % every == 0):
            out[r], last = last, step
    return out


@dataclass
class SimState:
    """Everything a checkpoint must hold to resume exactly."""

    round: int  # rounds completed
    server: State
    clients: MutableMapping[int, State]
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0  # seconds of training+evaluation so far
    eval_elapsed: float = 0.0  # of which evaluation
    sample_steps: int = 0  # samples of every local step so far, once per model trained
    # latest local model (params, buffers) per client, kept only for personalised-model
    # metrics of methods whose personal model is the client's last local model (FedNH's protocol)
    local_models: MutableMapping[int, tuple[Any, Any]] = field(default_factory=dict)
    # each client's SGD momentum buffers per model, kept only with train.keep_momentum
    momentum: MutableMapping[int, list[TensorDict]] = field(default_factory=dict)
    # test-only clients' states between evaluations (e.g. FedRC's carried ω)
    test_clients: dict[int, State] = field(default_factory=dict)
    # drift scenarios: diagnostics of the current step's start (models, drift detection)
    step_info: dict[str, Any] = field(default_factory=dict)
    # the server optimiser's moments per averaged model (train.server_optimizer)
    server_opt: dict[str, Any] = field(default_factory=dict)


class Callback(Protocol):
    def on_start(self, sim: Simulator, state: SimState) -> None: ...
    def on_round_end(self, sim: Simulator, state: SimState, metrics: dict | None) -> None: ...
    def on_end(self, sim: Simulator, state: SimState) -> None: ...


@dataclass
class SimConfig:
    """A simulation's settings: the run's training settings as they are (``train``, which
    every round hands the executor inside its :class:`RoundWork`), then evaluation and memory."""

    train: TrainConfig  # resolved: rounds, sampling, local training, server optimiser
    eval_every: int = 1
    train_metrics: bool = True
    eval_batch: int = 1024
    seed: int = 0
    personal: str = "none"  # "none" | "active" | "all": see EvalConfig.personal
    clients_in_memory: int | None = None  # bound on in-memory client states (see ClientStore)
    store_budget: int | None = None  # bytes of client state kept in memory (None: all)
    eval_chunk: int | None = None  # clients scored at a time (None: all at once)
    store_dir: str | None = None  # where spilled client states go (the run directory)

    @property
    def rounds(self) -> int:
        return self.train.rounds

    def work(self, rnd: int) -> RoundWork:
        """What the executor gets in round ``rnd``."""
        return RoundWork(self.train, self.seed, rnd)

    def server_optimizer(self) -> ServerOptimizer | None:
        """The configured server optimiser (``train.server_optimizer``), or None."""
        opt = self.train.server_optimizer
        return None if opt is None else ServerOptimizer(**opt.model_dump())


class Simulator:
    """Runs a federated algorithm on a :class:`FederatedData` for a number of rounds."""

    def __init__(
        self,
        algo: Algorithm,
        data: FederatedData,
        cfg: SimConfig,
        executor: Executor | None = None,
        callbacks: list[Callback] | None = None,
    ) -> None:
        self.algo, self.data, self.cfg = algo, data, cfg
        self.executor = executor or SequentialExecutor()
        self.callbacks = list(callbacks or [])
        self.server_opt = cfg.server_optimizer() or algo.server_optimizer()
        every = algo.check_every if isinstance(algo, DriftAware) else 0
        self.checks = check_rounds(data, cfg.rounds, every)
        #: the run's memory plan (set by the runner before the first round; None without one)
        self.memory_plan: MemoryPlan | None = None

    def initial_state(self) -> SimState:
        inits = [
            self.algo.ops.init(derive_seed(self.cfg.seed, INIT_STREAM, k))
            for k in range(self.algo.num_initial_models())
        ]
        server = check_state(self.algo, self.algo.init_server_state(inits), "server", "init")
        if self.server_opt is not None and averaged_models(server) is None:
            raise ConfigError(
                f"train.server_optimizer needs an algorithm that averages models (a server "
                f"state with params or models); {self.algo.name}'s has neither: remove "
                "train.server_optimizer or choose another algorithm"
            )
        store = self.new_store()
        return SimState(
            round=0,
            server=server,
            clients=store.table("clients"),
            momentum=store.table("momentum"),
            local_models=store.table("local_models"),
        )

    def new_store(self) -> ClientStore:
        """The client store of a new run: the run's budget, spilling into ``store_dir``."""
        cfg = self.cfg
        folder = None if cfg.store_dir is None else Path(cfg.store_dir) / STORE_DIR
        return ClientStore(cfg.store_budget, folder, self.data.device, cfg.clients_in_memory)

    def is_eval_round(self, rnd: int) -> bool:
        """Every ``eval_every`` rounds, the last round, and the last round of every time step
        (the steps protocol reads each step's end, whatever ``eval_every`` is)."""
        step_end = self.data.ends_step(rnd)
        return rnd % self.cfg.eval_every == 0 or rnd == self.cfg.rounds or step_end

    def run_round(self, state: SimState) -> dict[str, Any] | None:
        """Run round ``state.round + 1`` in place; return its metrics if it is evaluated."""
        t0 = time.perf_counter()
        rnd = state.round + 1
        algo = self.algo
        data = self.data.at_step(self.data.step_of_round(rnd))
        rate = self.cfg.train.participation
        sampled = sample_clients(len(data.clients), rate, self.cfg.seed, rnd, data.available(rnd))
        work = self.cfg.work(rnd)
        ctx = RoundContext(
            round=rnd,
            sampled=tuple(sampled),
            step=data.step,
            lr=work.lr,
            num_clients=len(data.clients),
        )
        if data.starts_step(rnd):  # the data has just changed: kept momentum starts again
            for c in self._changed(data, data.step_of_round(rnd - 1) if rnd > 1 else 0):
                state.momentum.pop(c.cid, None)
        if rnd in self.checks:
            self._start_step(state, data, ctx, self.checks[rnd])
        losses: list[float] = []
        results = self.client_round(state, data, ctx, work, losses)
        server = check_state(
            algo, algo.aggregate(state.server, results, ctx), "server", "aggregate"
        )
        for _ in results:  # an aggregate that stopped early still updates every client
            pass
        if self.server_opt is not None:
            server, state.server_opt = apply_server_optimizer(
                state.server, server, self.server_opt, state.server_opt
            )
        check_finite(rnd, losses, server, work.lr)
        state.server = server
        state.round = rnd
        metrics = None
        t_eval = time.perf_counter()
        carried = isinstance(algo, AdaptsTestClients) and algo.test_state_carried
        if carried and data.test_clients and not self.is_eval_round(rnd):
            # an iteration across rounds (FedRC's carried ω): one step every round, so the
            # result does not depend on eval.every (evaluation rounds take theirs in evaluate)
            with torch.no_grad(), algo.ops.memoised():
                adapt_test_clients(algo, server, data, self.cfg.eval_batch, state.test_clients)
        if self.is_eval_round(rnd):
            metrics = {
                "round": rnd,
                **({"step": data.step, **state.step_info} if data.steps else {}),
                **self.evaluation(state, data, sampled, work),
            }
            metrics["local_loss"] = float(np.mean(losses)) if losses else float("nan")
            metrics["clients_sampled"] = len(sampled)
            metrics.update(algo.round_diagnostics(state.server))
        t_end = time.perf_counter()
        state.elapsed += t_end - t0
        state.eval_elapsed += t_end - t_eval
        if metrics is not None:
            # this round's seconds: client tasks, training and aggregation, then evaluation
            metrics["train_s"] = round(t_eval - t0, 3)
            metrics["eval_s"] = round(t_end - t_eval, 3)
            metrics["elapsed_s"] = round(state.elapsed, 3)
            state.history.append(metrics)
        return metrics

    def client_round(
        self,
        state: SimState,
        data: FederatedData,
        ctx: RoundContext,
        work: RoundWork,
        losses: list[float],
    ) -> Iterator[ClientResult]:
        """The client side of a round: every sampled client's task, its training (through the
        executor) and its state update; yields what each result shares with the server (see
        :meth:`~fedshift.algorithms.base.Algorithm.shared_result`; clipped by
        ``train.clip_updates``) and appends the clients' training losses to ``losses``. A
        deployment (:mod:`fedshift.flower.deploy.server`) runs this on the nodes."""
        algo, rnd = self.algo, ctx.round
        tasks: dict[int, LocalTask] = {}  # the tasks handed out and not yet trained

        def job(cid: int) -> ClientJob:  # built when the executor asks for it
            cstate = state.clients.get(cid) or check_state(
                algo, algo.init_client_state(cid), "client", "init_client_state"
            )
            state.clients[cid] = cstate
            view = client_data(data, data.clients[cid], self.cfg.eval_batch)
            task = check_task(algo, algo.client_task(state.server, cstate, view, ctx))
            if self.cfg.train.keep_momentum:
                task = replace(task, momentum=state.momentum.get(cid, [{} for _ in task.params]))
            if self.cfg.train.local_epochs_max is not None:
                task = replace(task, epochs=self._local_epochs(rnd, cid))
            tasks[cid] = task
            return task, view

        keep_local = self.cfg.personal != "none" and not isinstance(algo, Personalised)
        if keep_local and self.cfg.personal == "active":
            state.local_models.clear()
        # what the tasks read of the server models: one pass per model for the round
        task_logits(
            algo, state.server, data, ctx.sampled, self.cfg.eval_batch, self.release_if_over
        )
        jobs = LazyJobs(ctx.sampled, job)

        def stream():  # client updates and loss statistics as results arrive
            for r in self.executor.train(algo, jobs, work):
                task = tasks.pop(r.cid)
                new = algo.client_update(state.server, state.clients[r.cid], task, r)
                state.clients[r.cid] = check_state(algo, new, "client", "client_update")
                if keep_local:
                    state.local_models[r.cid] = algo.local_model(r)
                if r.momentum is not None:
                    state.momentum[r.cid] = r.momentum
                if r.telemetry.get("steps"):
                    losses.append(r.telemetry["train_loss"])
                state.sample_steps += r.telemetry.get("sample_steps", 0)
                yield algo.shared_result(task, r), (task.params, task.buffers)  # sent, start
                self.release_if_over()

        return clip_results(stream(), self.cfg.train.clip_updates)

    def evaluation(
        self, state: SimState, data: FederatedData, sampled: list[int], work: RoundWork
    ) -> dict[str, Any]:
        """The metrics of an evaluation round: every client's test split (and the test-only
        clients'), and the validation split where the scenario has one."""
        algo = self.algo
        metrics = evaluate(
            algo,
            state.server,
            state.clients,
            data,
            self.cfg.train_metrics,
            self.cfg.eval_batch,
            personal=self._personal_clients(state, sampled),
            local_models=state.local_models,
            test_states=state.test_clients,
            tune=self._tuner(work),
            chunk=self.cfg.eval_chunk,
            per_client=bool(data.steps),
            release=self.release_if_over,
            keep_logits=True,
        )
        if data.has_validation:  # every client's validation split: for tuning, not test
            val = evaluate(
                algo, state.server, state.clients, data.validation_view(), False,
                self.cfg.eval_batch, tune=self._tuner(work), chunk=self.cfg.eval_chunk,
                release=self.release_if_over,
            )  # fmt: skip
            metrics["val_acc"] = val["local_acc"]
        return metrics

    def _local_epochs(self, rnd: int, cid: int) -> int:
        """A client's local epochs in a round under unequal local work: uniform over
        ``train.local_epochs..local_epochs_max``, from its own stream (the same in a resumed
        run)."""
        lo, hi = self.cfg.train.local_epochs, self.cfg.train.local_epochs_max
        rng = np.random.default_rng(derive_seed(self.cfg.seed, WORK_STREAM, rnd, cid))
        return int(rng.integers(lo, hi + 1))

    def _changed(self, data: FederatedData, since: int) -> list:
        """The current records of the clients whose data differs from step ``since``'s (all at
        ``since`` 0), each with ``prev`` = its record then (None at ``since`` 0)."""
        if since == 0:
            return list(data.clients)
        before = data.steps[since - 1]
        return [
            replace(c, prev=b) for c, b in zip(data.clients, before, strict=True)
            if c.version != b.version
        ]  # fmt: skip

    def _start_step(
        self, state: SimState, data: FederatedData, ctx: RoundContext, since: int
    ) -> None:
        """A check of a drift scenario (:func:`check_rounds`; ``since``: the step of the last
        one): a drift-aware algorithm's pass (:class:`~fedshift.algorithms.capabilities.
        DriftAware`: every client's step upload, the server's step, every client's step
        update), in which a client whose data changed since the last check sees its record
        then as ``prev`` and every other client none; then the diagnostics."""
        changed = {c.cid: c for c in self._changed(data, since)} if since else {}
        records = [changed.get(c.cid, replace(c, prev=None)) for c in data.clients]
        if isinstance(self.algo, DriftAware):
            self._drift_hooks(state, data, ctx, records)
        state.step_info = step_diagnostics(self.algo, state, data, records)

    def _drift_hooks(
        self, state: SimState, data: FederatedData, ctx: RoundContext, records
    ) -> None:
        algo = self.algo
        views = {c.cid: client_data(data, c, self.cfg.eval_batch) for c in records}

        def state_of(cid: int) -> State:
            return state.clients.get(cid) or algo.init_client_state(cid)

        uploads = {}
        for cid, view in views.items():
            up = algo.step_upload(state.server, state_of(cid), view, ctx)
            if up is not None:
                uploads[cid] = up
        state.server = check_state(
            algo, algo.start_step(state.server, uploads, ctx), "server", "start_step"
        )
        for cid, view in views.items():
            before = state_of(cid)
            after = check_state(
                algo, algo.step_update(state.server, before, view, ctx), "client", "step_update"
            )
            if after is not before or cid in state.clients:
                state.clients[cid] = after

    def _tuner(self, work: RoundWork):
        """Trains an evaluation's fine-tuning tasks through the run's executor (batched where
        it batches), with the round's settings (no augmentation); each task's phases say its
        own."""
        tuning = work.tuning()

        def tune(jobs):
            return self.executor.train(self.algo, jobs, tuning)

        return tune

    def _personal_clients(self, state: SimState, sampled: list[int]) -> list[int] | None:
        """Clients whose personalised models are scored this evaluation (None: no PM)."""
        if self.cfg.personal == "none":
            return None
        if self.cfg.personal == "active":
            return list(sampled)
        return list(range(len(self.data.clients)))  # every client

    def release_if_over(self) -> None:
        """Return freed heap memory to the system when the process holds more than its memory
        plan's estimate (:func:`~fedshift.engine.memory.release_freed_memory`); without a
        plan, always. Within the estimate nothing is returned: it would only be faulted in
        again by the next client."""
        if self.memory_plan is None or self.memory_plan.over():
            release_freed_memory()

    def run(self, state: SimState | None = None) -> SimState:
        """Run (or continue) until ``cfg.rounds`` rounds are done.

        A round that diverges raises :class:`~fedshift.core.errors.DivergedError` before its server
        state, round counter and evaluation are committed; callbacks with an ``on_diverged``
        method hear of it first (the run directory records it), and no checkpoint is written,
        so the last completed round stays the one a resume starts from."""
        state = state or self.initial_state()
        for cb in self.callbacks:
            cb.on_start(self, state)
        while state.round < self.cfg.rounds:
            try:
                metrics = self.run_round(state)
            except DivergedError as err:
                for cb in self.callbacks:
                    if hasattr(cb, "on_diverged"):
                        cb.on_diverged(self, state, err)
                raise
            self.release_if_over()  # the round's chunks: back to the system, not kept by malloc
            for cb in self.callbacks:
                cb.on_round_end(self, state, metrics)
        for cb in self.callbacks:
            cb.on_end(self, state)
        return state


def check_finite(rnd: int, losses: list[float], server: State, lr: float | None = None) -> None:
    """Raise :class:`DivergedError` when a client's training loss or any floating-point tensor
    of the new server state is NaN or infinite (one device synchronisation)."""
    if any(not math.isfinite(v) for v in losses):
        raise DivergedError(rnd, "a client's training loss is not finite", lr)
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for t in float_tensors(server):
        flags.setdefault(t.device, []).append(torch.isfinite(t).all())
    if not all(bool(torch.stack(f).all()) for f in flags.values()):
        raise DivergedError(rnd, "the server's model parameters are not finite", lr)


def step_diagnostics(
    algo: Algorithm, state: SimState, data: FederatedData, records: list | None = None
) -> dict[str, Any]:
    """At a step's start: the number of models against the step's true number of concepts,
    the step's leakage audit (test leak, single-model bound; :mod:`fedshift.data.audit`) and
    the method's drift flags against the truth (precision, recall, accuracy)."""
    models = state.server.get("models") if isinstance(state.server, dict) else None
    out: dict[str, Any] = {"true_concepts": data.active_concepts()}
    for entry in data.meta.get("audit") or []:
        if entry["step"] == data.step:
            out.update({k: v for k, v in entry.items() if k != "step"})
    if models is not None:
        out["num_models"] = len(models)
    if not isinstance(algo, DriftAware):
        return out
    out.update(algo.diagnostics(state.server))
    records = data.clients if records is None else records
    flags = [(algo.drift_flag(state.clients.get(c.cid) or {}), c.drifted) for c in records]
    flags = [(f, t) for f, t in flags if f is not None]
    if flags and data.step > 1:
        tp = sum(f and t for f, t in flags)
        out["drift_precision"] = 100.0 * tp / max(1, sum(f for f, _ in flags))
        out["drift_recall"] = 100.0 * tp / max(1, sum(t for _, t in flags))
        out["drift_accuracy"] = 100.0 * sum(f == t for f, t in flags) / len(flags)
    return out
