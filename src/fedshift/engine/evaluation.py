"""Evaluation over all clients (not only the sampled ones) and all test-only clients.

Methods that fine-tune before they predict (FedRC-FT, FedBABU) describe it with
``fine_tune_task``; :func:`fine_tune` trains those tasks through an executor (the run's, so
they are batched where training is) once per evaluation, and every score of that client uses
the tuned models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from fedshift.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    LocalTask,
    State,
    as_float,
    check_task,
)
from fedshift.algorithms.capabilities import AdaptsTestClients, FineTunes, Personalised
from fedshift.config import TrainConfig
from fedshift.core.errors import FedshiftError
from fedshift.data.federated import Client, FederatedData
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.metrics import (
    class_weighted_accuracy,
    clustering_diagnostics,
    correct_count,
    nll_sum,
    per_class_counts,
    pm_weights,
    pooled_and_mean,
    spread,
)


def client_data(data: FederatedData, client: Client, eval_batch: int = 1024) -> ClientData:
    """The algorithm's view of a client: its train split (or a test client's labelled split)."""
    return ClientData(
        cid=client.cid,
        train_idx=client.train_idx,
        y_train=client.y_train,
        inputs=data.inputs,
        eval_batch=eval_batch,
        test_only=client.test_only,
        step=client.step,
        prev_idx=None if client.prev is None else client.prev.train_idx,
        prev_y=None if client.prev is None else client.prev.y_train,
        concept=client.concept,
        prev_concept=None if client.prev is None else client.prev.concept,
    )


#: trains fine-tuning jobs and yields their results (the simulator binds its executor)
Tuner = Callable[[Sequence[tuple[LocalTask, ClientData]]], Iterable[ClientResult]]


#: the neutral round of :func:`sequential_tuner` (lr 0, no momentum, batches of one sample,
#: one epoch), built unvalidated: a learning rate of 0 is no run's setting
NEUTRAL_WORK = RoundWork(
    TrainConfig.model_construct(
        lr=0.0, momentum=0.0, weight_decay=0.0, batch_size=1, local_epochs=1, drop_last=False
    ),
    seed=0,
    round=0,
)


def sequential_tuner(algo: Algorithm) -> Tuner:
    """A tuner on the sequential executor; a fine-tuning task's phases set every training
    setting, so the neutral round settings here are not used."""
    ex = SequentialExecutor()
    return lambda jobs: ex.train(algo, jobs, NEUTRAL_WORK)


def fine_tune(
    algo: Algorithm, server: State, entries: Iterable[tuple[State, ClientData]], tune: Tuner
) -> dict[int, ClientResult]:
    """Each client's tuned models (by client id), for the clients with a fine-tuning task."""
    if not isinstance(algo, FineTunes):
        return {}
    jobs = []
    for state, view in entries:
        task = algo.fine_tune_task(server, state, view)
        if task is not None:
            jobs.append((check_task(algo, task, "fine_tune_task"), view))
    if not jobs:
        return {}
    with torch.enable_grad():
        return {r.cid: r for r in tune(jobs)}


#: inference batches of one slice of an evaluation's pass (see :meth:`_Predictions._logits`)
SLICE_BATCHES = 16


class _Predictions:
    """Collects prediction requests and answers them with one pass per distinct model.

    A request is (client view, pool indices, mixture). Requests whose mixtures share a model
    (e.g. FedAvg's global model, FedRC's cluster models) are concatenated, so the model runs
    over all their samples in large batches instead of once per client.
    """

    def __init__(
        self,
        algo: Algorithm,
        eval_batch: int,
        tuned: dict[int, ClientResult] | None = None,
        release: Callable[[], None] | None = None,
        keep: frozenset[int] = frozenset(),
    ) -> None:
        self.algo, self.eval_batch, self.tuned = algo, eval_batch, tuned or {}
        self.release, self.keep = release, keep  # ids of the models whose passes are kept
        self.out: list[torch.Tensor | None] = []
        self.by_model: dict[int, tuple[Any, Any, list[tuple[int, torch.Tensor, Any]]]] = {}
        self.inputs = None

    def add(
        self, server: State, state: State, view: ClientData, idx: torch.Tensor, mix=None
    ) -> int:
        """Request the client's predictions on ``idx``, from ``mix`` (weight, params, buffers)
        triples when given, else from the client's tuned models, the algorithm's mixture or
        its own ``predict``."""
        slot = len(self.out)
        if mix is None:
            tuned = self.tuned.get(view.cid)
            mix = (
                self.algo.mixture(server, state, view)
                if tuned is None
                else self.algo.tuned_mixture(server, state, view, tuned)
            )
        if mix is None:  # the algorithm predicts by itself
            self.out.append(self.algo.predict(server, state, view, idx))
            return slot
        self.out.append(None)
        self.inputs = view.inputs
        for w, p, b in mix:
            entry = self.by_model.setdefault(id(p), (p, b, []))
            entry[2].append((slot, idx, w))
        return slot

    def run(self) -> list[torch.Tensor]:
        for p, b, reqs in self.by_model.values():
            idx = torch.cat([r[1] for r in reqs])
            # each distinct sample once (test-only clients of several concepts share images;
            # drift scenarios deal the same data to several clients)
            uniq, where = torch.unique(idx, return_inverse=True)
            if len(uniq) == len(idx):
                uniq, where = idx, None
            logits = self._logits(p, b, uniq)
            if id(p) in self.keep:  # the next round's E-step / cluster choice reads it
                self.algo.ops.keep(p, b, self.inputs, uniq, logits)
            probs = torch.softmax(as_float(logits), dim=-1)
            probs = probs if where is None else probs[where]
            for (slot, _, w), part in zip(
                reqs, probs.split([len(r[1]) for r in reqs]), strict=True
            ):
                cur = self.out[slot]
                self.out[slot] = w * part if cur is None else cur + w * part
        self.by_model.clear()
        return self.out  # type: ignore[return-value]

    def _logits(self, params, buffers, idx: torch.Tensor) -> torch.Tensor:
        """The model's logits over ``idx``, in slices of :data:`SLICE_BATCHES` inference
        batches (the same batches, so the same numbers) with ``release`` called after each:
        a pass over every client's samples frees and allocates its activations hundreds of
        times, and the heap the C library keeps can grow by gigabytes in one pass."""
        if self.release is None:
            return self.algo.ops.logits(params, buffers, self.inputs, idx, self.eval_batch)
        step = SLICE_BATCHES * self.eval_batch
        parts = []
        for i in range(0, len(idx), step):
            parts.append(
                self.algo.ops.logits(
                    params, buffers, self.inputs, idx[i : i + step], self.eval_batch
                )
            )
            self.release()
        return torch.cat(parts) if len(parts) != 1 else parts[0]


@torch.no_grad()
def evaluate(
    algo: Algorithm,
    server: State,
    client_states: Mapping[int, State],
    data: FederatedData,
    train_metrics: bool = True,
    eval_batch: int = 1024,
    personal: list[int] | None = None,
    local_models: dict[int, tuple[Any, Any]] | None = None,
    test_states: dict[int, State] | None = None,
    tune: Tuner | None = None,
    chunk: int | None = None,
    per_client: bool = False,
    release: Callable[[], None] | None = None,
    keep_logits: bool = False,
) -> dict[str, Any]:
    """All metrics of one evaluation (see :mod:`fedshift.reporting.protocols` for their definitions).

    ``test_states`` holds the test-only clients' states from the last evaluation: each is
    passed to :meth:`~fedshift.algorithms.base.Algorithm.adapt_test_client` and replaced by
    the state it returns (methods that carry state between evaluations, e.g. FedRC's ω).

    ``personal`` lists the clients whose personalised models get FedNH's PM(V)/PM(L) (with
    GM); a method without personal models is scored with ``local_models``, the clients' latest
    local models. ``tune`` trains fine-tuning tasks (default: the sequential executor).
    Clients are scored ``chunk`` at a time (default: all at once), so that with client states
    spilled to disk only a chunk of them is in memory. ``per_client`` adds
    ``local_acc_clients``, every client's accuracy on its own test split (None without one),
    which drift measures score client by client. ``release`` is called between slices of
    the inference passes and after each chunk (the engine returns freed memory to the system
    there when the run holds more than its memory plan). ``keep_logits``: the models' logits
    over every scored sample are kept until the next such evaluation (the round's evaluation:
    :meth:`~fedshift.algorithms.ops.ModelOps.keep`), so the next round's client tasks read
    them instead of computing the same pass again.
    """
    tune = tune or sequential_tuner(algo)
    if keep_logits:
        algo.ops.forget()
    wanted = set(personal or [])
    if wanted and not data.test_clients:
        raise FedshiftError(
            "eval.personal needs test-only clients; set scenario.test_clients.enabled=true"
        )
    with algo.ops.memoised():  # the test-only clients of all concepts share their images
        tests = adapt_test_clients(algo, server, data, eval_batch, test_states)
    size = chunk or max(1, len(data.clients))
    how = Scoring(
        algo, server, client_states, data, train_metrics, eval_batch, wanted, local_models or {},
        tune, release, _dict_ids(server) if keep_logits else frozenset(),
    )  # fmt: skip
    te_c, tr_c, nll, pms, out = [], [], 0.0, [], {}
    for start in range(0, max(1, len(data.clients)), size):
        first = start == 0  # the test-only clients and GM go with the first chunk
        part = data.clients[start : start + size]
        sc = score_chunk(how, part, tests if first else [], first and personal is not None)
        te_c, tr_c, nll = te_c + sc.test_correct, tr_c + sc.train_correct, nll + sc.train_nll
        pms += sc.pm
        out.update(sc.metrics)
        if release is not None:
            release()
    out["local_acc"], out["local_acc_client_mean"] = pooled_and_mean(
        te_c, [c.num_test for c in data.clients]
    )
    if per_client:
        out["local_acc_clients"] = [
            round(100.0 * k / c.num_test, 3) if c.num_test else None
            for k, c in zip(te_c, data.clients, strict=True)
        ]
    if train_metrics:
        tr_n = [c.num_train for c in data.clients]
        out["train_acc"], _ = pooled_and_mean(tr_c, tr_n)
        out["train_loss"] = nll / max(1, sum(tr_n))
    out.update(_clustering(algo, server, client_states, data))
    if personal is not None:
        out["pm_clients"] = len(pms)
        for i, name in enumerate(("pm_v", "pm_l")):
            out[name], out[f"{name}_std"], out[f"{name}_worst10"] = spread([p[i] for p in pms])
    return _ordered(out)


def _dict_ids(tree: Any) -> frozenset[int]:
    """The ids of the dicts in a state (a server's model parameter dicts among them): the
    passes of those models are kept, not those of a client's fine-tuned copies."""
    out, todo = set(), [tree]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            out.add(id(x))
            todo += list(x.values())
        elif isinstance(x, list | tuple):
            todo += list(x)
    return frozenset(out)


@torch.no_grad()
def task_logits(
    algo: Algorithm,
    server: State,
    data: FederatedData,
    sampled: Sequence[int],
    eval_batch: int,
    release: Callable[[], None] | None = None,
) -> int:
    """The logits the round's client tasks read (:meth:`~fedshift.algorithms.base.Algorithm.
    task_logit_models`): one pass per model over the sampled clients' train samples, kept for
    their tasks, unless the last evaluation's pass of the same model holds them; passes of
    older models are dropped. Returns the number of passes run."""
    models = algo.task_logit_models(server)
    parts = [data.clients[c].train_idx for c in sampled if data.clients[c].num_train]
    if not models or not parts:
        return 0
    algo.ops.retain(models)
    idx = torch.unique(torch.cat(parts))
    ran = 0
    for p, b in models:
        if not algo.ops.has_kept(p, b, data.inputs, idx):
            pass_ = _Predictions(algo, eval_batch, release=release)
            pass_.inputs = data.inputs
            algo.ops.keep(p, b, data.inputs, idx, pass_._logits(p, b, idx))
            ran += 1
    return ran


def adapt_test_clients(algo, server, data, eval_batch, test_states):
    """(client, state, view) of each test-only client; its state from ``adapt_test_client``,
    given its state of the last call (``test_states``, updated). A test task belongs to every
    time step: its view carries the current one."""
    test_states = {} if test_states is None else test_states
    tests = []
    for c in data.test_clients:
        view = replace(client_data(data, c, eval_batch), step=data.step)
        state = (
            algo.adapt_test_client(server, view, test_states.get(c.cid, {}))
            if isinstance(algo, AdaptsTestClients)
            else {}
        )
        test_states[c.cid] = state
        tests.append((c, state, view))
    return tests


@dataclass
class Scoring:
    """What an evaluation scores with: the algorithm and its states, the data, which metrics
    (train metrics; the clients ``wanted`` for PM), the batch size, the clients' latest local
    models (PM of methods without personal models) and the fine-tuning trainer."""

    algo: Algorithm
    server: State
    client_states: Mapping[int, State]
    data: FederatedData
    train_metrics: bool
    eval_batch: int
    wanted: set[int]
    local_models: dict[int, tuple[Any, Any]]
    tune: Tuner
    release: Callable[[], None] | None = None
    keep: frozenset[int] = frozenset()  # ids of the server's models: their passes are kept


@dataclass
class ChunkScores:
    """What one chunk of clients contributes to an evaluation: correct counts per client on
    the test and train splits, the summed train NLL, PM(V)/PM(L) of its wanted clients and
    the metrics scored once (``global_acc`` per task, ``gm_acc``: with the first chunk)."""

    test_correct: list[int]
    train_correct: list[int]
    train_nll: float
    pm: list[tuple[float, float]]
    metrics: dict[str, Any]


def score_chunk(how: Scoring, part: list[Client], tests, with_gm: bool) -> ChunkScores:
    """One chunk of clients (with the test-only clients ``tests`` and GM when given), after one
    fine-tuning pass over the chunk."""
    algo, server, data = how.algo, how.server, how.data
    entries = []
    for c in part:
        state = how.client_states.get(c.cid) or algo.init_client_state(c.cid)
        # no test split (e.g. FedNH's protocol scores the official test set instead): skip it,
        # so methods that predict by fine-tuning do not fine-tune for nothing
        used = bool(c.num_test) or how.train_metrics or c.cid in how.wanted
        entries.append((c, state, client_data(data, c, how.eval_batch), used))
    tune_on = [(s, v) for _, s, v, used in entries if used] + [(s, v) for _, s, v in tests]
    tuned = fine_tune(algo, server, tune_on, how.tune)
    preds = _Predictions(algo, how.eval_batch, tuned, how.release, keep=how.keep)
    ppreds = _Predictions(algo, how.eval_batch, tuned, how.release)
    slots, pm_slots = _client_requests(how, entries, preds, ppreds)
    test_slots = [(c, preds.add(server, s, v, c.test_idx)) for c, s, v in tests]
    gm = algo.global_model(server) if with_gm else None
    gm_slots = [] if gm is None else [
        (t, ppreds.add(server, {}, client_data(data, t, how.eval_batch), t.test_idx,
                       mix=[(1.0, *gm)]))
        for t in data.test_clients
    ]  # fmt: skip
    probs, pprobs = preds.run(), ppreds.run()
    te_c = [correct_count(probs[te], c.y_test) if te is not None else 0 for c, te, _ in slots]
    tr_c, nll = [], 0.0
    if how.train_metrics:
        tr_c = [correct_count(probs[tr], c.y_train) for c, _, tr in slots]
        nll = sum(nll_sum(probs[tr], c.y_train) for c, _, tr in slots)
    pms = [_pm(c, test, pprobs[slot], data.num_classes) for c, test, slot in pm_slots]
    out: dict[str, Any] = {}
    if test_slots:
        per = []
        for c, slot in test_slots:
            key = f"global_acc_{c.task}"  # global_acc_c<k>, or per (concept, style) task
            out[key] = 100.0 * correct_count(probs[slot], c.y_test) / max(1, c.num_test)
            per.append(out[key])
        out["global_acc"] = sum(per) / len(per)
    if gm_slots:
        hits = sum(correct_count(pprobs[slot], t.y_test) for t, slot in gm_slots)
        out["gm_acc"] = 100.0 * hits / max(1, sum(t.num_test for t, _ in gm_slots))
    return ChunkScores(te_c, tr_c, nll, pms, out)


def _client_requests(how: Scoring, entries, preds, ppreds):
    """The prediction requests of a chunk's clients: (client, test slot, train slot) each, and
    (client, its concept's test-only client, slot) for the PM of the wanted ones."""
    by_concept = {c.concept: c for c in how.data.test_clients}
    slots, pm_slots = [], []
    for c, state, view, _ in entries:
        te = preds.add(how.server, state, view, c.test_idx) if c.num_test else None
        tr = preds.add(how.server, state, view, c.train_idx) if how.train_metrics else None
        slots.append((c, te, tr))
        test = by_concept.get(c.concept)
        if c.cid not in how.wanted or test is None:
            continue
        if isinstance(how.algo, Personalised):
            pm_slots.append((c, test, ppreds.add(how.server, state, view, test.test_idx)))
        elif c.cid in how.local_models:
            mix = [(1.0, *how.local_models[c.cid])]
            pm_slots.append((c, test, ppreds.add(how.server, {}, view, test.test_idx, mix=mix)))
    return slots, pm_slots


def _pm(c: Client, test: Client, probs: torch.Tensor, num_classes: int) -> tuple[float, float]:
    """FedNH's PM(V) and PM(L) of client ``c`` on its concept's test set."""
    correct, count = per_class_counts(probs.argmax(dim=-1), test.y_test, num_classes)
    w_v, w_l = pm_weights(c.label_hist)
    return (
        class_weighted_accuracy(correct, count, w_v),
        class_weighted_accuracy(correct, count, w_l),
    )


def _clustering(algo, server, client_states, data) -> dict[str, Any]:
    """ARI/NMI of the clients' clusters against concept, style and dominant label, and against
    label noise (noisy or clean) when the scenario has both noisy and clean clients."""
    assigned = [algo.cluster_of(server, client_states.get(c.cid) or {}) for c in data.clients]
    known = [(a, c) for a, c in zip(assigned, data.clients, strict=True) if a is not None]
    if not known:
        return {}
    noisy = [c.noisy for _, c in known]
    out = clustering_diagnostics(
        [a for a, _ in known],
        [c.concept for _, c in known],
        [c.style.label().split("/")[0] for _, c in known],
        [int(c.label_hist.argmax()) for _, c in known],
        noisy=noisy if len(set(noisy)) == 2 else None,
    )
    out["clusters"] = [-1 if a is None else a for a in assigned]
    return out


#: the order of the keys of an evaluation (metrics.jsonl stays comparable across versions)
_KEY_ORDER = ("local_acc", "local_acc_client_mean", "train_acc", "train_loss")


def _ordered(out: dict[str, Any]) -> dict[str, Any]:
    """The metrics in the order: local, train, clustering, global, personal, GM."""
    head = {k: out.pop(k) for k in _KEY_ORDER if k in out}
    cl = {k: out.pop(k) for k in list(out) if k.startswith(("ari_", "nmi_")) or k == "clusters"}
    gl = {k: out.pop(k) for k in list(out) if k.startswith("global_acc")}
    gm = {k: out.pop(k) for k in ("gm_acc",) if k in out}
    return {**head, **cl, **gl, **out, **gm}
