"""A run's memory plan: how much it may hold, what it will hold, and whether that fits.

Before the first round the runner measures what a run holds whatever it does (the process with
its data and model, the server state) and what each client adds, declared by the algorithm's
own hooks on one client (:func:`client_footprint`: its state after an update, its kept
momentum, its latest local model), then chooses (:func:`plan_memory`):

- the **budget**: ``memory.budget``, or *auto* = 15% of the memory available when the run
  starts (host memory; a CUDA run's free GPU memory), raised to the least the run needs;
- the **training chunk**: how many clients the batched executor stacks at once (each costs its
  models, gradients, momentum and activations), at most ``chunk_size`` and at most half of what
  the budget leaves after the fixed part;
- the **store budget**: the bytes of client state kept in memory (the rest of the budget);
  client states beyond it are spilled to the run directory (:class:`~fedshift.engine.store.
  ClientStore`), so memory stays flat in the number of clients once the budget is reached;
- the **scoring chunk**: how many clients an evaluation scores at once when their states (or
  their fine-tuned models) do not all fit.

A run that cannot fit (its fixed part and one chunk of one client exceed the budget, or its
spilled states exceed the free disk) is refused with one line naming the estimate, the budget
and the fix. The plan is printed before training and recorded in ``summary.json`` beside the
measured peak.

Every number here is an estimate from tensor sizes, not a measurement of the allocator: the
process's resident memory also holds freed memory the C library has not returned, which the
engine bounds by returning it after every round (:func:`release_freed_memory`).
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedshift.algorithms.base import Algorithm, ClientResult, RoundContext, State
from fedshift.algorithms.capabilities import Personalised
from fedshift.core.errors import FedshiftError
from fedshift.data.federated import FederatedData
from fedshift.engine.evaluation import client_data
from fedshift.engine.store import compact, nbytes

GiB = 2**30
#: auto budget: this share of the memory available when the run starts
AUTO_SHARE = 0.15
#: the most of the available memory a run may plan to use at all
MAX_SHARE = 0.9
#: training activations saved for the backward pass and their gradients, per forward value
ACT_FACTOR = 3
#: what the estimate adds for the allocator and the runtime (autograd's and vmap's own buffers,
#: freed memory the C library holds until it is returned): this much, plus RUNTIME_SHARE of the
#: memory that changes during a round (the training chunk and the resident client states)
RUNTIME_BYTES, RUNTIME_SHARE = 128 * 2**20, 0.1
#: how far above its estimate a process may go before freed memory is returned to the system
OVER_BYTES = 64 * 2**20
#: the plans of the runs alive in this process (one, or a grid's trained as one job)
LIVE_PLANS: weakref.WeakValueDictionary[int, MemoryPlan] = weakref.WeakValueDictionary()


def gib(n: float) -> str:
    """``n`` bytes for a person: GiB with two decimals from a tenth of a GiB, else MiB, KiB
    or bytes."""
    if n >= 0.1 * GiB:
        return f"{n / GiB:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{int(n)} B"


# ----------------------------------------------------------------------------- the machine


def available_memory(device: torch.device) -> int:
    """Bytes a run can still take: ``MemAvailable`` of the host (Linux), the free memory of a
    CUDA device, else the physical memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resident_memory(device: torch.device) -> int:
    """Bytes this process holds now: its resident set (Linux; else its peak so far), or the
    tensors allocated on a CUDA device."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def disk_free(path: str | Path) -> int:
    """Free bytes on the file system of ``path`` (its nearest existing parent)."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


_LIBC: Any = None


def release_freed_memory() -> None:
    """Return the heap memory freed so far to the system (glibc's ``malloc_trim``): tensors of
    a few MiB are allocated from the C heap, whose free space glibc otherwise keeps, so a
    process that freed a chunk's working set would look as large as the largest moment of its
    round. Memory returned is memory the next allocation faults in again, so the engine calls
    this after every round, and after a client only when the process is above its plan's
    estimate (:meth:`MemoryPlan.over`; trimming after every client slowed the demo's sequential
    MLP rounds by 65%). A no-op where there is no glibc."""
    global _LIBC
    if _LIBC is None:
        try:  # the process's own symbols (not ctypes.util.find_library, which forks a
            _LIBC = ctypes.CDLL(None)  # subprocess: a fork of a large process counts as large)
        except OSError:
            _LIBC = False
        if _LIBC and not hasattr(_LIBC, "malloc_trim"):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


# ----------------------------------------------------------------------------- what a run holds


@dataclass(frozen=True)
class ClientFootprint:
    """What one client adds to a run, in bytes: its state after an update (personal models,
    control variates, cluster weights, ...), its kept momentum buffers, its latest local model
    (FedNH's personal-model protocol), and the models of its training task (K start models)."""

    state: int
    momentum: int
    local_model: int
    task_models: int
    num_models: int
    probed: bool = True  # False: the algorithm's hooks could not be run before round 1

    @property
    def kept(self) -> int:
        """Bytes of everything the client keeps between rounds."""
        return self.state + self.momentum + self.local_model

    def parts(self) -> str:
        named = [
            ("state", self.state),
            ("momentum", self.momentum),
            ("local model", self.local_model),
        ]
        shown = [f"{n} {gib(b)}" for n, b in named if b]
        return ", ".join(shown) or "nothing"


def client_footprint(
    algo: Algorithm, server: State, data: FederatedData, keep_momentum: bool, momentum: float,
    keep_local: bool, eval_batch: int,
) -> ClientFootprint:  # fmt: skip
    """Declared by the algorithm's own hooks on one client with training data: the task it
    gets in round 1, and its state after ``client_update`` with a result whose models are the
    task's (the shapes a trained result has); no training step is taken and nothing is kept.
    A method whose round-1 task needs more than the server's initial state (one set up by a
    drift check first) is counted as one model copy per initial model in each part."""
    keep_local = keep_local and not isinstance(algo, Personalised)  # its own model is its state
    try:
        return _probe(algo, server, data, keep_momentum, momentum, keep_local, eval_batch)
    except Exception:  # noqa: BLE001 - any failure of the probe falls back to model copies
        params, buffers = algo.ops.init(0)
        k = algo.num_initial_models()
        model = nbytes([params, buffers]) * k
        return ClientFootprint(
            state=model,
            momentum=nbytes(params) * k if keep_momentum else 0,
            local_model=model // k if keep_local else 0,
            task_models=model,
            num_models=k,
            probed=False,
        )


def _probe(algo, server, data, keep_momentum, momentum, keep_local, eval_batch):
    client = next((c for c in data.clients if c.num_train), data.clients[0])
    view = client_data(data, client, eval_batch)
    ctx = RoundContext(round=1, sampled=(client.cid,), step=data.step, lr=0.0,
                       num_clients=len(data.clients))  # fmt: skip
    start = algo.init_client_state(client.cid)
    with torch.random.fork_rng(devices=[]):  # a hook drawing from torch's RNG leaves it as it was
        task = algo.client_task(server, start, view, ctx)
        models = nbytes([task.params, task.buffers])
        trained = 0
        for m, p in enumerate(task.params):
            names: set[str] = set()
            for phase in task.phases:
                mom = momentum if phase.momentum is None else phase.momentum
                if mom:
                    names |= set(phase.trained_names(m, p))
            trained += nbytes([p[k] for k in names])
        result = ClientResult(
            cid=client.cid,
            num_samples=view.num_train,
            params=task.params,
            buffers=task.buffers,
            upload=algo.upload(task, task.params, task.buffers, view),
            telemetry={"train_loss": 0.0, "steps": 1},
            steps=1,
        )
        with torch.no_grad():
            after = algo.client_update(server, start, task, result)
    local = nbytes(algo.local_model(result)) if keep_local else 0
    return ClientFootprint(
        state=nbytes(compact(after)),
        momentum=trained if keep_momentum else 0,
        local_model=local,
        task_models=models,
        num_models=len(task.params),
    )


@torch.no_grad()
def activation_bytes(algo: Algorithm, data: FederatedData) -> int:
    """Bytes of the values one sample's forward pass produces (every leaf module's output),
    measured on two samples of the data in training mode."""
    module = algo.ops.module
    sizes: list[int] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sizes.append(_size(out)))
        for m in module.modules()
        if not list(m.children())
    ]
    client = next((c for c in data.clients if c.num_train >= 2), None)
    try:
        if client is None:
            return 0
        params, buffers = algo.ops.init(0)
        was = module.training
        module.train()
        try:
            algo.ops.forward(params, buffers, data.inputs(client.train_idx[:2]))
        finally:
            module.train(was)
    except Exception:  # a model that does not take the pool's inputs alone (two branches)
        return 0
    finally:
        for h in hooks:
            h.remove()
    return sum(sizes) // 2


def _size(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    if isinstance(out, list | tuple):
        return sum(_size(o) for o in out)
    return 0


def runtime_bytes(work: int, states: int) -> int:
    """The allocator's and the runtime's share of a plan (see :data:`RUNTIME_BYTES`)."""
    return RUNTIME_BYTES + int(RUNTIME_SHARE * (work + states))


def training_bytes(fp: ClientFootprint, act: int, batch: int, vectorized: bool = False) -> int:
    """The working set of one client in training: its K start models, their gradients and a
    copy the optimiser updates (client by client: 3 model copies; in a vmapped chunk 6, for
    the stacked copies, the transposed weights of the batched matrix products and the
    gradient transform's own buffers: measured on the demo's MLP, FedAvg and FedRC), its
    momentum buffers, and the activations of a batch through each of its models."""
    copies = 6 if vectorized else 3
    return copies * fp.task_models + fp.momentum + ACT_FACTOR * act * batch * fp.num_models


# ----------------------------------------------------------------------------- the plan


@dataclass
class MemoryPlan:
    """A run's memory plan (see the module doc); sizes in bytes."""

    budget: int
    budget_source: str  # how the budget was chosen
    available: int
    base: int  # the process with its data and model, before the first round
    server: int  # the server state (it exists up to three times while a round aggregates)
    client: ClientFootprint
    clients: int
    chunk: int  # clients a batched chunk trains at once (1: client by client)
    work: int  # the training working set of a chunk
    evaluation: int  # the working set of an evaluation
    eval_chunk: int | None  # clients scored at a time (None: all at once)
    store_budget: int  # client state kept in memory; the rest is spilled
    spill: int  # client state on disk at most
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    @property
    def fixed(self) -> int:
        return self.base + 3 * self.server + self.evaluation

    def over(self) -> bool:
        """Whether the process holds more than the estimate now, by more than
        :data:`OVER_BYTES` (a CPU run's resident set), with what the other runs alive in
        this process planned above their start (the runs of a grid trained as one job)."""
        if self.device != "cpu":
            return False
        others = sum(p.estimate - p.base for p in list(LIVE_PLANS.values()) if p is not self)
        return resident_memory(torch.device("cpu")) > self.estimate + others + OVER_BYTES

    @property
    def client_states(self) -> int:
        return self.clients * self.client.kept

    @property
    def resident_states(self) -> int:
        return min(self.client_states, self.store_budget)

    @property
    def runtime(self) -> int:
        """The allocator's and the runtime's share (see :data:`RUNTIME_BYTES`)."""
        return runtime_bytes(self.work, self.resident_states)

    @property
    def estimate(self) -> int:
        """The peak estimate: the fixed part, a chunk in training, the resident states and
        the runtime's share."""
        return self.fixed + self.work + self.resident_states + self.runtime

    def line(self) -> str:
        """One line for the terminal."""
        states = (
            f"{self.clients} clients x {gib(self.client.kept)} ({self.client.parts()})"
            if self.client.kept
            else f"{self.clients} clients keep nothing between rounds"
        )
        where = ""
        if self.spill:
            where = f": {gib(self.store_budget)} in memory, the rest on disk"
        return (
            f"memory: peak about {gib(self.estimate)} of a {gib(self.budget)} budget "
            f"({self.budget_source}): process and data {gib(self.base)}, server "
            f"{gib(self.server)}, {states}{where}, training {gib(self.work)} "
            f"(chunk {self.chunk})"
        )

    def record(self) -> dict[str, Any]:
        """The plan for ``summary.json`` (MiB)."""
        mib = lambda n: round(n / 2**20, 1)  # noqa: E731
        return {
            "budget_mb": mib(self.budget),
            "budget_source": self.budget_source,
            "estimate_mb": mib(self.estimate),
            "base_mb": mib(self.base),
            "server_mb": mib(self.server),
            "per_client_mb": {
                k: mib(v)
                for k, v in asdict(self.client).items()
                if k not in ("num_models", "probed")
            },
            "per_client_declared": self.client.probed,
            "clients": self.clients,
            "chunk": self.chunk,
            "training_mb": mib(self.work),
            "evaluation_mb": mib(self.evaluation),
            "eval_chunk": self.eval_chunk,
            "store_budget_mb": mib(self.store_budget),
            "spilled_mb": mib(self.spill),
        }


@dataclass(frozen=True)
class PlanInputs:
    """What :func:`plan_memory` decides from (all measured or declared before round 1)."""

    budget: int | None  # memory.budget (None: auto)
    available: int
    base: int
    server: int
    client: ClientFootprint
    clients: int
    act: int  # activation bytes per sample
    batch: int  # the training batch
    eval_batch: int
    pool: int  # samples in the data pool (evaluation's probabilities)
    num_classes: int
    vectorized: bool  # the batched executor stacks its chunks
    chunk_size: int  # the most clients per chunk
    chunk_fixed: bool  # chunk_size was set by the user: use it as it is
    fine_tunes: bool  # evaluation trains a task per client (FedRC-FT, FedBABU)
    disk_free: int
    device: str = "cpu"


def plan_memory(x: PlanInputs) -> MemoryPlan:
    """The plan for ``x``, or a :class:`FedshiftError` (one line: the estimate, the budget
    and the fix) when the run cannot fit its budget or its disk."""
    per_client = training_bytes(x.client, x.act, x.batch, x.vectorized)
    evaluation = x.eval_batch * x.act + 2 * x.pool * x.num_classes * 4 * x.client.num_models
    fixed = x.base + 3 * x.server + evaluation
    one = x.client.kept  # the client being trained must be in memory
    chunk = x.chunk_size if x.chunk_fixed or not x.vectorized else 1
    if not x.vectorized:
        chunk = 1  # client by client: one client's working set
    need = fixed + per_client * chunk + one + runtime_bytes(per_client * chunk, one)
    if x.budget is None:
        auto = int(AUTO_SHARE * x.available)
        budget = max(auto, need)
        source = f"auto: 15% of {gib(x.available)} available"
        if budget > auto:
            source = f"auto: the least this run needs; 15% of {gib(x.available)} is {gib(auto)}"
        if budget > MAX_SHARE * x.available:
            raise FedshiftError(
                f"this run needs about {gib(need)} at its peak ({_need(fixed, per_client, chunk, x)}) "
                f"but the {x.device} has {gib(x.available)} available: {_fix(x)}"
            )
    else:
        budget, source = x.budget, f"memory.budget={gib(x.budget)}"
        if need > budget:
            raise FedshiftError(
                f"this run needs about {gib(need)} at its peak ({_need(fixed, per_client, chunk, x)}) "
                f"but its memory budget is {gib(budget)} (memory.budget): raise memory.budget "
                f"(the {x.device} has {gib(x.available)} available), or {_fix(x)}"
            )
    if x.vectorized and not x.chunk_fixed:  # the chunk takes at most half of what is left
        room = max(0, (budget - fixed - one) // 2)
        chunk = int(max(1, min(x.chunk_size, x.clients, room // max(1, per_client))))
    work = per_client * chunk
    # the resident states and their runtime share fill what is left: s + 0.1 s = room
    room = budget - fixed - work - runtime_bytes(work, 0)
    store_budget = max(one, int(room / (1 + RUNTIME_SHARE)))
    states = x.clients * x.client.kept
    spill = max(0, states - store_budget)
    if 2 * spill > 0.9 * x.disk_free:  # a checkpoint's files and the current ones
        raise FedshiftError(
            f"the client states of this run take {gib(states)} ({x.clients} clients x "
            f"{gib(x.client.kept)}); {gib(store_budget)} stay in memory and the rest needs up "
            f"to {gib(2 * spill)} on disk (the last checkpoint's files and the current ones), "
            f"but the run directory's disk has {gib(x.disk_free)} free: raise memory.budget "
            "or free disk space (output.dir=... on another disk)"
        )
    eval_chunk = None
    eval_per_client = x.client.state + (2 * x.client.task_models if x.fine_tunes else 0)
    if spill or x.fine_tunes:
        eval_chunk = int(max(1, min(x.clients, store_budget // 4 // max(1, eval_per_client))))
        if eval_chunk >= x.clients:
            eval_chunk = None
    plan = MemoryPlan(
        budget=budget,
        budget_source=source,
        available=x.available,
        base=x.base,
        server=x.server,
        client=x.client,
        clients=x.clients,
        chunk=chunk,
        work=work,
        evaluation=evaluation,
        eval_chunk=eval_chunk,
        store_budget=store_budget,
        spill=spill,
        device=x.device,
    )
    LIVE_PLANS[id(plan)] = plan  # until its run is dropped
    return plan


def _need(fixed: int, per_client: int, chunk: int, x: PlanInputs) -> str:
    return (
        f"process, data and server {gib(fixed)}, training a chunk of {chunk} "
        f"{gib(per_client * chunk)}, one client's state {gib(x.client.kept)}"
    )


def _fix(x: PlanInputs) -> str:
    if x.vectorized:
        return (
            "train fewer clients at once (chunk_size=1), train client by client "
            "(executor=sequential), or use a smaller model or batch"
        )
    return "use a smaller model or batch (train.batch_size), or a machine with more memory"
