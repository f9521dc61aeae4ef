"""Many independent runs as jobs: run, resume or reuse each one in its own run directory, in
this process, in local worker processes or as Ray tasks, with progress through a listener.

``fedshift compare`` (algorithms), ``compare --tune`` (algorithms x grid points x seeds),
``fedshift reproduce`` (rows x learning rates x seeds) and ``fedshift sweep`` (any grid of
overrides x seeds) all plan a list of jobs, each a validated config with its own run directory,
and hand it to :func:`execute`. A job is anything with a ``key`` (its name in progress lines)
and a ``cfg``; its outcome comes back in the jobs' order, a diverged run as an outcome, not an
error. A run is resumed when its directory holds a checkpoint of the same settings
(:func:`same_run_exists`) and reused when that checkpoint is finished, so calling again after an
interruption (or with more seeds) trains only what is missing; ``fresh`` starts every run over.

Where the runs go:

- ``workers`` 1: in this process, each scenario built once and shared (a caller's scenarios
  seed that cache: ``scenarios``), with the caller's simulator callbacks. Runs that differ only
  in learning rate, momentum, weight decay or seed (:func:`lockstep_key`) train as one job
  (``lockstep``, the default: :mod:`fedshift.engine.executors.lockstep`, a greenlet per run,
  their chunks trained side by side), the others one after another;
- ``workers`` N: N spawned processes, each with ``cpu_count // N`` torch threads;
- ``ray=RayPlacement(...)``: one Ray task per run (``num_cpus`` / ``num_gpus`` per run), on a
  local instance or the cluster at ``settings.address``; a task runs the same code in the same
  run directory, so a cluster needs ``output.dir`` (and the data) on a shared file system.
"""

from __future__ import annotations

import functools
import json
import os
import queue as queue_mod
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fedshift.algorithms.registry import experiment, get_algorithm
from fedshift.config import RunConfig, validate_config
from fedshift.core.errors import DivergedError, FedshiftError
from fedshift.core.plugins import install, sources
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.lockstep import Lockstep
from fedshift.engine.ray_session import RaySettings, ray_session
from fedshift.reporting.tables import round_info
from fedshift.run.experiment import resolve_device, run_dir_for, run_experiment
from fedshift.run.folder import CHECKPOINT, CONFIG, SUMMARY, RunDir


class Listener(Protocol):
    """Progress of the jobs (the CLI draws bars; Python callers may pass None)."""

    def started(self, key: str, total: int, done: int) -> None: ...
    # optional: def noted(self, key: str, text: str) -> None (the run's memory plan)
    def advanced(self, key: str, done: int, info: str) -> None: ...
    def finished(self, key: str, status: str) -> None: ...


class RunJob(Protocol):
    """What :func:`execute` needs of a job: a name for progress lines and the run's config
    (whose ``output.dir`` / ``name`` is the run directory)."""

    @property
    def key(self) -> str: ...
    @property
    def cfg(self) -> RunConfig: ...


J = TypeVar("J", bound=RunJob)


@dataclass(frozen=True)
class Job:
    """The plainest job: a name for progress lines (e.g. the algorithm compared) and a config."""

    key: str
    cfg: RunConfig


@dataclass
class Outcome(Generic[J]):
    """What became of a job: its evaluations (metrics.jsonl) and whether it finished."""

    job: J
    status: str  # "finished" | "diverged"
    history: list[dict[str, Any]]
    diverged_round: int | None = None
    concepts: list[int] | None = None  # each client's true concept (for cluster heatmaps)
    truth: dict | None = None  # a drift scenario's truth (fedshift.data.truth.truth_record)
    error: DivergedError | None = None  # why a diverged run stopped (its round, its folder)


@dataclass(frozen=True)
class RayPlacement:
    """Run each job as a Ray task holding ``cpus_per_run`` CPUs and ``gpus_per_run`` GPUs
    (fractions share a GPU, e.g. 0.25: four runs per GPU) on the Ray of ``settings``."""

    settings: RaySettings = field(default_factory=RaySettings)
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0

    def __post_init__(self) -> None:
        if not self.cpus_per_run > 0:
            raise FedshiftError(f"cpus per run must be positive, got {self.cpus_per_run:g}")
        if self.gpus_per_run < 0:
            raise FedshiftError(f"gpus per run must be 0 or more, got {self.gpus_per_run:g}")
        if self.gpus_per_run > 1 and self.gpus_per_run != int(self.gpus_per_run):
            raise FedshiftError(f"gpus per run above 1 must be whole, got {self.gpus_per_run:g}")


# ----------------------------------------------------------------------------- one run


def same_run_exists(cfg: RunConfig) -> bool:
    """Whether the run directory of ``cfg`` holds a checkpoint of the same experiment
    (:meth:`RunConfig.experiment`: compared after validation, so settings added to fedshift
    since then take defaults, and a run made with another executor, device or inference
    batch still counts)."""
    import yaml

    d = run_dir_for(cfg)
    if not ((d / CHECKPOINT).is_file() and (d / CONFIG).is_file()):
        return False
    try:
        saved = validate_config(yaml.safe_load((d / CONFIG).read_text()))
    except Exception:  # an unreadable or outdated config: not the same run
        return False
    return experiment(saved) == experiment(cfg)


def read_outcome(job: J) -> Outcome[J]:
    """The outcome of a run from the files in its directory, training nothing: its
    ``metrics.jsonl``, the status in ``summary.json``, checked against ``config.yaml`` (a
    table is regenerated from committed artifacts this way; checkpoints are not needed)."""
    import yaml

    d = run_dir_for(job.cfg)
    if not ((d / CONFIG).is_file() and (d / SUMMARY).is_file()):
        raise FedshiftError(f"{d}: no finished run of {job.key} (config.yaml and summary.json)")
    saved = validate_config(yaml.safe_load((d / CONFIG).read_text()))
    if experiment(saved) != experiment(job.cfg):
        raise FedshiftError(f"{d}: the run there was made with other settings than {job.key}")
    run = RunDir(d)
    summary = run.read_summary()
    status = summary.get("status", "unfinished")
    if status not in ("finished", "diverged"):
        raise FedshiftError(f"{d}: the run of {job.key} is {status}, not finished")
    return Outcome(
        job, status, run.read_metrics(), summary.get("diverged_round"), truth=summary.get("truth")
    )


class _Relay:
    """Simulator callback that forwards a job's progress (to a listener or a queue)."""

    def __init__(self, key: str, send: Callable[[tuple], None]) -> None:
        self.key, self.send = key, send

    def on_start(self, sim, state) -> None:
        plan = getattr(sim, "memory_plan", None)
        if plan is not None:
            self.send(("noted", self.key, plan.line()))
        self.send(("started", self.key, sim.cfg.rounds, state.round))

    def on_round_end(self, sim, state, metrics) -> None:
        self.send(("advanced", self.key, state.round, round_info(metrics)))

    def on_end(self, sim, state) -> None:
        return None


def run_job(
    job: J,
    fresh: bool,
    send: Callable[[tuple], None],
    data_cache: dict | None = None,
    callbacks: Sequence[Any] = (),
    executor: Any = None,
) -> Outcome[J]:
    """Run (or resume, or reuse) one job in its run directory; progress goes to ``send`` as
    ``(kind, key, *args)`` tuples (see :class:`Listener`) and to ``callbacks`` (simulator
    callbacks); a diverged run is returned, not raised. ``data_cache`` (scenario hash -> data)
    shares scenarios between jobs of one process; ``executor``: one made elsewhere (a member
    of a lockstep) instead of the config's."""

    cfg = job.cfg
    data = None
    if data_cache is not None:
        key = cfg.scenario_hash()
        if key not in data_cache:
            data_cache[key] = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
        data = data_cache[key]
    resume = not fresh and same_run_exists(cfg)
    try:
        relay = [_Relay(job.key, send), *callbacks]
        res = run_experiment(
            cfg, data=data, resume=resume, overwrite=True, callbacks=relay, executor=executor
        )
    except DivergedError as err:
        send(("finished", job.key, f"diverged in round {err.round}"))
        history = RunDir(run_dir_for(cfg)).read_metrics()
        return Outcome(job, "diverged", history, err.round, error=err)
    send(("finished", job.key, "done"))
    concepts = [c.concept for c in res.data.clients]
    return Outcome(job, "finished", res.history, concepts=concepts, truth=res.summary.get("truth"))


def _worker(job: J, fresh: bool, messages, threads: int, plugin_sources=()) -> Outcome[J]:
    """Entry point of a worker process (and of a Ray task, given the driver's plugin files as
    text: a node without them imports the same modules)."""
    import torch

    install(plugin_sources)
    torch.set_num_threads(threads)
    return run_job(job, fresh, messages.put)


def _deliver(listener: Listener | None, msg: tuple) -> None:
    if listener is None:
        return
    kind, key, *rest = msg
    handler = getattr(listener, kind, None)
    if handler is not None:  # a listener may skip notes (``noted``)
        handler(key, *rest)


# ----------------------------------------------------------------------------- many runs


def execute(
    jobs: Sequence[J],
    *,
    workers: int = 1,
    fresh: bool = False,
    listener: Listener | None = None,
    ray: RayPlacement | None = None,
    scenarios: dict | None = None,
    callbacks: Callable[[str], list] | None = None,
    lockstep: bool | None = None,
) -> list[Outcome[J]]:
    """Run every job: in this process (``workers`` 1; scenarios built once and shared), in
    ``workers`` processes (each with ``cpu_count // workers`` torch threads) or, with ``ray``,
    as Ray tasks (as many at once as the cluster's resources allow). Outcomes come back in the
    jobs' order. Interrupting stops the workers; every run keeps its last completed round and
    resumes on the next call. In this process only: ``scenarios`` (scenario hash -> data, e.g.
    a caller's own) are used instead of building them, ``callbacks`` gives a job's key
    simulator callbacks (elsewhere, follow the runs with ``listener``), and runs that
    differ only in learning rate, momentum, weight decay or seed train as one job where
    ``lockstep`` is True, or (None, the default) where they run on a GPU (each run's numbers
    are those of the run alone; on a CPU the stacked chunk measured no faster)."""
    if workers < 1:
        raise FedshiftError(f"--jobs must be at least 1, got {workers}")
    if callbacks is not None and (workers > 1 or ray is not None):
        raise FedshiftError(
            "simulator callbacks run in this process: follow runs in worker processes or on "
            "Ray with a listener"
        )
    if ray is not None:
        if workers > 1:
            raise FedshiftError(
                "--jobs runs local processes; on Ray, --cpus-per-run / --gpus-per-run set how "
                "many runs share a machine"
            )
        return _execute_ray(list(jobs), fresh, listener, ray)
    if workers == 1 or len(jobs) <= 1:
        cache = dict(scenarios or {})
        extra = callbacks or (lambda key: [])
        return _in_process(list(jobs), fresh, listener, cache, extra, lockstep)
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // workers)
    with ctx.Manager() as manager:
        messages = manager.Queue()
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
        try:
            futures = {
                pool.submit(_worker, j, fresh, messages, threads): i for i, j in enumerate(jobs)
            }
            out: list[Outcome[J] | None] = [None] * len(jobs)
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                _drain(messages.get_nowait, listener)
                for f in done:
                    out[futures[f]] = _worker_result(f, jobs[futures[f]])
                if pending and _a_worker_ended(pool):
                    raise _worker_died(jobs[min(futures[f] for f in pending)])
            _drain(messages.get_nowait, listener)
        except BaseException:
            # stop the running runs now (each keeps its last completed round), instead of
            # waiting for them at exit
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    return out  # type: ignore[return-value]


def lockstep_key(cfg: RunConfig) -> str | None:
    """What the runs trained as one job share: every setting but the run's name, seed, output
    folder, tracking labels, learning rate and the values of momentum and weight decay
    (whether each is on is shared).
    None: the run trains alone (its algorithm or executor is not the batched one, or it logs
    to W&B)."""
    if cfg.executor not in ("auto", "batched"):
        return None
    if "wandb" in cfg.log:  # one W&B run at a time in a process (wandb.init is global)
        return None
    algo = get_algorithm(cfg.algorithm.name)
    if algo is None or not getattr(algo, "supports_batched", False):
        return None
    d = cfg.model_dump(mode="json")
    for key in ("name", "seed", "output", "tracking"):  # where a run goes and its labels
        d.pop(key)
    t = d["train"]
    t.pop("lr")
    t["momentum"], t["weight_decay"] = bool(t["momentum"]), bool(t["weight_decay"])
    return json.dumps(d, sort_keys=True, default=str)


def _in_process(jobs: list[J], fresh, listener, cache, extra, lockstep: bool) -> list[Outcome[J]]:
    """The jobs in this process: each lockstep group as one job, the rest one by one, in the
    order of their first job; outcomes in the jobs' order."""
    send = functools.partial(_deliver, listener)
    groups: dict[Any, list[int]] = {}
    for i, j in enumerate(jobs):
        on = lockstep if lockstep is not None else resolve_device(j.cfg.device).type == "cuda"
        key = lockstep_key(j.cfg) if on else None
        groups.setdefault(i if key is None else key, []).append(i)
    out: list[Outcome[J] | None] = [None] * len(jobs)
    for idx in groups.values():
        if len(idx) == 1:
            out[idx[0]] = run_job(jobs[idx[0]], fresh, send, cache, extra(jobs[idx[0]].key))
            continue
        ran = _lockstep([jobs[i] for i in idx], fresh, listener, cache, extra)
        for i, o in zip(idx, ran, strict=True):
            out[i] = o
    return out  # type: ignore[return-value]


def _lockstep(jobs: list[J], fresh, listener, cache, extra) -> list[Outcome[J]]:
    """Runs of one lockstep group, each in a greenlet of its own in this thread (one runs at a
    time, :meth:`Lockstep.run`). Ctrl-C stops every run (each keeps its last completed round);
    a run's error is raised once every run has ended."""
    hub = Lockstep()
    send = functools.partial(_deliver, listener)
    out: list[Any] = [None] * len(jobs)

    def body(i: int, job: J) -> Callable[[], None]:
        def one() -> None:
            try:
                member = hub.member(job.cfg.chunk_size, job.cfg.vectorize)
                out[i] = run_job(job, fresh, send, cache, extra(job.key), member)
            except Exception as err:  # raised below, once the others have ended
                out[i] = err

        return one

    hub.run([body(i, j) for i, j in enumerate(jobs)])
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out


def _worker_result(future, job: RunJob) -> Outcome:
    """A worker's outcome; its exception surfaces here, and a worker that died (killed, out
    of memory) is a one-line error saying how to go on."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise _worker_died(job) from None


def _worker_died(job: RunJob) -> FedshiftError:
    return FedshiftError(
        f"a worker process ended abruptly (killed? out of memory?) while running {job.key}; "
        "the other runs were stopped and every run keeps its last completed round: the same "
        "command resumes them (fewer --jobs need less memory)"
    )


def _a_worker_ended(pool: ProcessPoolExecutor) -> bool:
    """Whether a process of ``pool`` has ended (while runs are pending, none ends on its own).
    The pool notices that too, but not always: its manager thread watches the processes that
    existed when it began to wait, and a worker started after that (the second ``submit``
    wakes the thread before it starts its process) can die unnoticed until something else
    wakes the thread."""
    from multiprocessing.connection import wait as ready

    procs = list((getattr(pool, "_processes", None) or {}).values())
    try:
        return bool(ready([p.sentinel for p in procs], timeout=0))
    except (OSError, ValueError):  # a process the pool has already closed
        return False


def _drain(get_nowait: Callable[[], tuple], listener: Listener | None) -> None:
    while True:
        try:
            _deliver(listener, get_nowait())
        except queue_mod.Empty:
            return


def _execute_ray(
    jobs: list[J], fresh: bool, listener: Listener | None, placement: RayPlacement
) -> list[Outcome[J]]:
    """The jobs as Ray tasks; their progress comes back through a Ray queue (an actor that
    holds no CPU), a task's user error (a missing dataset) is raised here as itself."""
    from dataclasses import replace

    settings = placement.settings  # the runs' ray.connect_timeout_s bounds the connection
    if jobs and placement.settings.address:
        settings = replace(settings, connect_timeout_s=jobs[0].cfg.ray.connect_timeout_s)
    with ray_session(settings, what="--ray") as ray:
        from ray.util.queue import Empty, Queue

        _check_resources(ray, placement)
        messages = Queue(actor_options={"num_cpus": 0})

        def get_nowait() -> tuple:
            try:
                return messages.get_nowait()
            except Empty:
                raise queue_mod.Empty from None

        task = ray.remote(_worker).options(
            num_cpus=placement.cpus_per_run, num_gpus=placement.gpus_per_run, max_retries=0
        )
        threads = max(1, int(placement.cpus_per_run))
        shipped = sources()
        refs = {task.remote(j, fresh, messages, threads, shipped): i for i, j in enumerate(jobs)}
        out: list[Outcome[J] | None] = [None] * len(jobs)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
                _drain(get_nowait, listener)
                for ref in done:
                    out[refs[ref]] = _result(ray, ref)
            _drain(get_nowait, listener)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            ray.kill(messages.actor)
    return out  # type: ignore[return-value]


def _check_resources(ray: Any, placement: RayPlacement) -> None:
    """A run that asks for more than the whole cluster has would wait forever: say so."""
    have = ray.cluster_resources()
    for name, want, flag in (
        ("CPU", placement.cpus_per_run, "--cpus-per-run"),
        ("GPU", placement.gpus_per_run, "--gpus-per-run"),
    ):
        if want > have.get(name, 0):
            raise FedshiftError(
                f"{flag} {want:g}: the Ray cluster has {have.get(name, 0):g} {name}s in all"
            )


def _result(ray: Any, ref: Any) -> Any:
    """A task's return value; a fedshift error inside the task is re-raised as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, FedshiftError):
            raise err.cause from None
        raise
