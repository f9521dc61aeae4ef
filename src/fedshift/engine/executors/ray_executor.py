"""The Ray executor: a round's clients split into shards, one per Ray actor, each actor running
the batched (or sequential) executor on its shard.

What crosses the network, and when:

- *once per run*: the scenario's data (through Ray's object store, ``ray.put``: every actor on a
  node reads the same copy) and the algorithm (its hyper-parameters and model factory; each actor
  rebuilds it on its own device);
- *per round*: each shard's tasks (start models, extras; a model shared by the shard's clients is
  serialised once per shard, since pickling keeps object identity) and the client results, which
  stream back one by one.

A task carries its client's data as a view without the input function (index arrays and labels
only); the actor attaches its own copy of the data. Results are yielded shard by shard in the
shards' order while later shards are still training, so the server aggregates as results arrive
and the order, hence every number, is the same from run to run. Shards are contiguous slices of
the round's jobs of near-equal size, so with one actor the executor computes exactly what its
inner executor computes alone.

Actors hold no state between rounds besides the data and the algorithm, so checkpoints and
resuming are the simulator's as with any executor. Devices: an actor with a GPU share trains on
``cuda`` and one without on the CPU (with ``cpus_per_actor`` threads); tensors move to the
actor's device on arrival and results come back on the CPU, then to the driver's device.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fedshift.algorithms.base import Algorithm, ClientResult
from fedshift.algorithms.ops import ModelOps
from fedshift.core.errors import FedshiftError
from fedshift.core.plugins import install, sources
from fedshift.data.federated import FederatedData
from fedshift.engine.executors.base import ClientJob, Executor, RoundWork, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.engine.ray_session import RaySettings, ray_session
from fedshift.engine.trees import move, tensors


@dataclass(frozen=True)
class RayExecutorSettings:
    """How the executor uses Ray: ``actors`` shards per round (None: one per GPU of the cluster
    for a CUDA run, else one per ``cpus_per_actor`` CPUs), ``gpus_per_actor`` (None: the
    cluster's GPUs shared equally for a CUDA run, 0 otherwise; 0.5 puts two actors on a GPU),
    the ``inner`` executor each actor runs and its ``chunk_size``."""

    session: RaySettings = field(default_factory=RaySettings)
    actors: int | None = None
    gpus_per_actor: float | None = None
    cpus_per_actor: float = 1.0
    inner: str = "batched"  # "batched" | "sequential"
    chunk_size: int = 64


def portable(jobs: Sequence[ClientJob]) -> list[ClientJob]:
    """The jobs without their data's input function (it references the whole dataset)."""
    return [(task, replace(view, inputs=None)) for task, view in jobs]


def shards(n: int, parts: int) -> list[range]:
    """``n`` jobs as at most ``parts`` contiguous, near-equal, non-empty slices."""
    return [range(int(a[0]), int(a[-1]) + 1) for a in np.array_split(np.arange(n), parts) if len(a)]


def rebuild(algo: Algorithm, device: torch.device) -> Algorithm:
    """The same algorithm (hyper-parameters, model factory, seed, train defaults) with its model
    template on ``device``; nothing cached on the original instance comes along."""
    ops = ModelOps(algo.ops.factory, device)
    return type(algo)(algo.hp, ops, algo.num_classes, seed=algo.seed, train=algo.train_defaults)


class ShardWorker:
    """One Ray actor: a run's data and algorithm (loaded once per run), a shard per call."""

    def __init__(self, threads: int) -> None:
        import ray  # inside an actor, Ray is there

        self.device = torch.device("cuda" if ray.get_gpu_ids() else "cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, threads))
        self.unload()

    def load(
        self,
        data: FederatedData,
        plugin_sources: list,
        algo: bytes,
        inner: str,
        chunk: int,
        dtype: str = "float32",
    ) -> str:
        install(plugin_sources)  # before the algorithm: its class may live in a plugin file
        # new tensors in the driver's default dtype (float32 unless it set float64, as the
        # tests that compare executors do), so that the actor's models match the server's
        torch.set_default_dtype(getattr(torch, dtype))
        self.data = data.to(self.device)
        self.algo = rebuild(pickle.loads(algo), self.device)
        self.inner = (
            BatchedExecutor(chunk_size=chunk) if inner == "batched" else SequentialExecutor()
        )
        return str(self.device)

    def unload(self) -> None:
        self.data: FederatedData | None = None
        self.algo: Algorithm | None = None
        self.inner: Executor | None = None

    def train(self, jobs: list[ClientJob], work: RoundWork) -> Iterator[ClientResult]:
        jobs = move(jobs, self.device)
        attached = [(task, replace(view, inputs=self.data.inputs)) for task, view in jobs]
        cpu = torch.device("cpu")
        for result in self.inner.train(self.algo, attached, work):
            yield move(result, cpu)


#: idle actors of this process, by (Ray job, CPUs, GPUs): a later run in the same Ray
#: connection (a test module, a notebook, a sweep) reuses them instead of starting processes;
#: a run that needs actors of another shape removes them first (they hold their resources)
_IDLE: dict[tuple[str, float, float], list[Any]] = {}


class RayExecutor:
    """Trains a round's jobs on Ray actors, a contiguous shard each (see the module doc).

    Use it as a context manager around the run: entering connects to (or starts) Ray, puts the
    data in the object store and loads it into the actors; leaving unloads them (they wait for
    the next run of this Ray connection) and stops a Ray instance the executor started."""

    name = "ray"

    def __init__(self, algo: Algorithm, data: FederatedData, settings: RayExecutorSettings) -> None:
        self.algo, self.data, self.settings = algo, data, settings
        self.actors: list[Any] = []
        self._session = None
        self._ray: Any = None
        self._key: tuple[str, float, float] | None = None
        #: per round: seconds to serialise and submit the shards, and the whole round
        self.timings: list[dict[str, float]] = []

    def __enter__(self) -> RayExecutor:
        s = self.settings
        self._session = ray_session(s.session)
        ray = self._ray = self._session.__enter__()
        try:
            resources = ray.cluster_resources()
            gpus, cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 1))
            cuda = self.data.device.type == "cuda"
            n = s.actors or (
                int(gpus) if cuda and gpus >= 1 else max(1, int(cpus // s.cpus_per_actor))
            )
            per_gpu = s.gpus_per_actor
            if per_gpu is None:
                per_gpu = gpus / n if cuda and gpus else 0.0
            if n * s.cpus_per_actor > cpus + 1e-9 or n * per_gpu > gpus + 1e-9:
                raise FedshiftError(
                    f"executor=ray: {n} actors x ({s.cpus_per_actor:g} CPUs, {per_gpu:g} GPUs) "
                    f"do not fit the Ray cluster's {cpus:g} CPUs and {gpus:g} GPUs; lower "
                    "ray.actors, ray.cpus_per_actor or ray.gpus_per_actor"
                )
            self._key = (ray.get_runtime_context().get_job_id(), s.cpus_per_actor, per_gpu)
            for key in [k for k in _IDLE if k != self._key]:  # idle actors of another shape
                for actor in _IDLE.pop(key):  # hold resources this run may need
                    ray.kill(actor)
            idle = _IDLE.setdefault(self._key, [])
            worker = ray.remote(ShardWorker).options(num_cpus=s.cpus_per_actor, num_gpus=per_gpu)
            threads = int(max(1, s.cpus_per_actor))
            while len(idle) < n:
                idle.append(worker.remote(threads))
            self.actors, idle[:] = idle[:n], idle[n:]
            cpu = torch.device("cpu")
            data_ref = ray.put(self.data if self.data.device == cpu else move(self.data, cpu))
            algo = ray.cloudpickle.dumps(rebuild(self.algo, cpu))  # plugin classes by name
            shipped = sources()
            dtype = str(torch.get_default_dtype()).removeprefix("torch.")
            ray.get(
                [
                    a.load.remote(data_ref, shipped, algo, s.inner, s.chunk_size, dtype)
                    for a in self.actors
                ]
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ray is not None and self.actors and self._ray.is_initialized():
            try:
                self._ray.get([a.unload.remote() for a in self.actors])
                _IDLE.setdefault(self._key, []).extend(self.actors)
            except Exception:  # a dead actor: let Ray clean it up
                for a in self.actors:
                    self._ray.kill(a)
        self.actors = []
        if self._session is not None:
            self._session.__exit__(None, None, None)
            if not self._ray.is_initialized():  # the instance this run started is gone
                _IDLE.pop(self._key, None)
            self._session, self._ray = None, None

    def train(
        self, algo: Algorithm, jobs: Sequence[ClientJob], work: RoundWork
    ) -> Iterator[ClientResult]:
        """Submit every shard, then yield its results shard by shard as they arrive."""
        if not self.actors:
            raise RuntimeError("RayExecutor is used outside its `with` block")
        if not jobs:
            return
        t0 = time.perf_counter()
        cpu = torch.device("cpu")
        sendable = portable(jobs)
        if any(t.device != cpu for t in tensors(sendable)):
            sendable = move(sendable, cpu)
        streams = [
            actor.train.options(num_returns="streaming").remote([sendable[i] for i in part], work)
            for actor, part in zip(self.actors, shards(len(jobs), len(self.actors)), strict=False)
        ]
        submitted = time.perf_counter()
        device = self.data.device
        for stream in streams:
            for ref in stream:
                result = self._ray.get(ref)
                yield result if device == cpu else move(result, device)
        self.timings.append({"submit_s": submitted - t0, "round_s": time.perf_counter() - t0})
