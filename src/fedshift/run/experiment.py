"""Builds a run from a validated config: scenario, model, algorithm, simulator, run directory.

This is the library entry point behind the CLI (``run_experiment``); it prints nothing itself
except through the optional progress callback.
"""

from __future__ import annotations

import platform
import shutil
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from fedshift.algorithms import ModelOps, get_algorithm
from fedshift.algorithms.base import TrainDefaults
from fedshift.algorithms.capabilities import FineTunes
from fedshift.algorithms.registry import algorithm_defaults, resolved_train
from fedshift.config import RunConfig, dump_config
from fedshift.core.errors import (
    ConfigError,
    DivergedError,
    FedshiftError,
    UnknownNameError,
    did_you_mean,
)
from fedshift.core.files import ensure_writable_dir
from fedshift.core.plugins import load_plugins
from fedshift.core.version import VERSION as __version__
from fedshift.data.federated import FederatedData
from fedshift.data.scenario import build_scenario, check_styles
from fedshift.data.sources import resolve_name
from fedshift.data.truth import truth_record
from fedshift.engine.executors.base import Executor, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor, vectorizes
from fedshift.engine.executors.ray_executor import RayExecutor, RayExecutorSettings
from fedshift.engine.memory import (
    MemoryPlan,
    PlanInputs,
    activation_bytes,
    available_memory,
    client_footprint,
    disk_free,
    plan_memory,
    resident_memory,
)
from fedshift.engine.ray_session import RaySettings
from fedshift.engine.simulator import STORE_DIR, SimConfig, SimState, Simulator
from fedshift.engine.store import nbytes
from fedshift.models import MODELS, build_model, default_model_for
from fedshift.reporting.plots import plot_cluster_heatmaps, plot_history, plot_tasks
from fedshift.run.folder import CHECKPOINT, CONFIG, SUMMARY, RunDir, RunRecorder
from fedshift.run.lock import RunLock, removed_if_failed
from fedshift.tracking import open_tracker, require_packages


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; an unavailable device is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        hint = did_you_mean(name, ("auto", "cpu", "cuda"))
        raise ConfigError(
            f"device: {name!r} is not a device{hint}; use auto, cpu or cuda[:N]"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available; use cpu")
    return dev


def model_name(cfg: RunConfig) -> str:
    """The configured model; ``auto`` is the dataset's usual one, and a dataset without one
    (e.g. ``hf``, whose images can be anything) asks for a name."""
    if cfg.model.name != "auto":
        return cfg.model.name
    try:
        return default_model_for(cfg.scenario.dataset)
    except UnknownNameError:
        raise ConfigError(
            f"model: name=auto has no usual model for dataset {cfg.scenario.dataset!r}; name "
            "one, e.g. model.name=cifar_cnn (32x32 colour), fmnist_cnn (28x28 greyscale), "
            "resnet18 or mlp (`fedshift list` shows them all)"
        ) from None


def make_algorithm(cfg: RunConfig, data: FederatedData, device: torch.device):
    """The configured algorithm instance (validated hyper-parameters, model template)."""
    load_plugins(cfg.plugins)  # a config that came by pickle (a worker) was not validated here
    cls = get_algorithm(cfg.algorithm.name)
    hp = cls.parse_params(cfg.algorithm.params)
    name = model_name(cfg)
    # the factory keeps only these numbers, not the data: an algorithm ships light (executor=ray)
    num_classes, input_shape = data.num_classes, data.input_shape

    def factory():
        model = build_model(
            name,
            num_classes,
            input_shape,
            pretrained=cfg.model.pretrained,
            norm=cfg.model.norm,
            width=cfg.model.width,
            head_bias=cfg.model.head_bias,
            block_norm=cfg.model.block_norm,
        )
        return cls.adapt_model(model, hp)

    # the algorithm's view of the training settings: its fields, by name, from cfg.train
    train = TrainDefaults(**{f.name: getattr(cfg.train, f.name) for f in fields(TrainDefaults)})
    return cls(hp, ModelOps(factory, device), data.num_classes, seed=cfg.seed, train=train)


def make_executor(cfg: RunConfig, algo, data: FederatedData | None = None) -> Executor:
    """The configured executor; 'auto' is batched wherever the algorithm supports it. The Ray
    executor (it needs ``data``) is a context manager: :func:`executor_context` opens it."""
    if cfg.executor == "ray":
        if data is None:
            raise ValueError("executor=ray needs the run's data")
        return RayExecutor(algo, data, ray_settings(cfg, algo))
    inner = cfg.executor
    if inner == "batched" and not algo.supports_batched:
        raise ConfigError(
            f"executor: {algo.name} cannot run on the batched executor; use executor=auto "
            "or sequential"
        )
    if inner == "sequential" or not algo.supports_batched:
        return SequentialExecutor()
    return BatchedExecutor(chunk_size=cfg.chunk_size, vectorize=cfg.vectorize)


def ray_settings(cfg: RunConfig, algo) -> RayExecutorSettings:
    """The Ray executor's settings from the config's ``ray`` section."""
    r = cfg.ray
    if r.inner == "batched" and not algo.supports_batched:
        raise ConfigError(
            f"ray.inner: {algo.name} cannot run on the batched executor; use ray.inner=auto "
            "or sequential"
        )
    inner = "batched" if r.inner in ("auto", "batched") and algo.supports_batched else "sequential"
    session = RaySettings(
        r.address, r.num_cpus, r.num_gpus, r.host, r.dashboard, r.connect_timeout_s
    )
    return RayExecutorSettings(
        session, r.actors, r.gpus_per_actor, r.cpus_per_actor, inner, cfg.chunk_size
    )


def executor_context(executor: Executor) -> AbstractContextManager:
    """What the run happens inside: the executor itself when it is a context manager (Ray's
    actors live for the run), else nothing."""
    return executor if isinstance(executor, AbstractContextManager) else nullcontext()


def eval_batch_size(cfg: RunConfig) -> int:
    """The inference batch: the config's, or 256 on a CPU and 1024 elsewhere."""
    if cfg.eval.batch_size is not None:
        return cfg.eval.batch_size
    return 256 if resolve_device(cfg.device).type == "cpu" else 1024


def sim_config(cfg: RunConfig) -> SimConfig:
    """The simulator's settings: the training settings as resolved (an unset one from the
    algorithm's reference code), which reach the executors unchanged in each round's
    :class:`~fedshift.engine.executors.base.RoundWork`."""
    return SimConfig(
        train=resolved_train(cfg),
        eval_every=cfg.eval.every,
        train_metrics=cfg.eval.train_metrics,
        eval_batch=eval_batch_size(cfg),
        seed=cfg.seed,
        personal=cfg.eval.personal,
        clients_in_memory=cfg.clients_in_memory,
    )


def memory_plan(
    cfg: RunConfig,
    algo,
    data: FederatedData,
    sim: Simulator,
    state: SimState,
    executor: Executor,
    run_dir: Path,
) -> MemoryPlan:
    """The run's memory plan (:mod:`fedshift.engine.memory`), measured and declared before its
    first round (or the first round it resumes); a run that cannot fit is refused here."""
    t = resolved_train(cfg)
    device = data.device
    vectorized = isinstance(executor, BatchedExecutor) and vectorizes(
        executor.vectorize, algo.ops.module, device
    )
    keep_local = sim.cfg.personal != "none"
    footprint = client_footprint(
        algo, state.server, data, t.keep_momentum, t.momentum, keep_local, sim.cfg.eval_batch
    )
    budget = cfg.memory.budget
    return plan_memory(
        PlanInputs(
            budget=None if budget == "auto" else int(budget),
            available=available_memory(device),
            base=resident_memory(device),
            server=nbytes(state.server),
            client=footprint,
            clients=len(data.clients),
            act=activation_bytes(algo, data),
            batch=t.batch_size,
            eval_batch=sim.cfg.eval_batch,
            pool=len(data.x),
            num_classes=data.num_classes,
            vectorized=vectorized,
            chunk_size=cfg.chunk_size,
            chunk_fixed="chunk_size" in cfg.model_fields_set,
            fine_tunes=isinstance(algo, FineTunes),
            disk_free=disk_free(run_dir),
            device=device.type,
        )
    )


def apply_plan(
    plan: MemoryPlan, cfg: RunConfig, sim: Simulator, state: SimState, executor: Executor
) -> None:
    """Size the run by its plan: the client store's budget, the batched executor's chunk and
    the evaluation's scoring chunk."""
    sim.cfg = replace(sim.cfg, store_budget=plan.store_budget, eval_chunk=plan.eval_chunk)
    sim.memory_plan = plan
    store = getattr(state.clients, "store", None)
    if store is not None:
        store.set_limits(plan.store_budget, cfg.clients_in_memory)
    if isinstance(executor, BatchedExecutor):
        executor.chunk_size = plan.chunk


def run_meta(cfg: RunConfig, data: FederatedData, device: torch.device) -> dict[str, Any]:
    """What produced the numbers: recorded in the checkpoint and summary.json."""
    return {
        "name": cfg.name,
        "algorithm": cfg.algorithm.name,
        "algorithm_params": dict(cfg.algorithm.params),
        # training settings taken from the algorithm's reference code (the config left them unset)
        "algorithm_defaults": algorithm_defaults(cfg),
        "dataset": data.name,
        "data_source": data.source,
        "model": model_name(cfg),
        "pretrained": cfg.model.pretrained,
        "weights": "ImageNet-pretrained" if cfg.model.pretrained else "trained from scratch",
        "num_clients": len(data.clients),
        "test_clients": len(data.test_clients),
        "rounds": cfg.train.rounds,
        "seed": cfg.seed,
        "device": str(device),
        "executor": cfg.executor,
        "chunk_size": cfg.chunk_size,
        "scenario_hash": data.meta.get("scenario_hash"),
        "audit": data.meta.get("audit", []),
        **({"truth": truth_record(data, cfg.train.rounds)} if data.steps else {}),
        **({"label_noise": data.meta["label_noise"]} if "label_noise" in data.meta else {}),
        "fedshift": __version__,
        "torch": str(torch.__version__),  # plain str: checkpoints hold plain data only
        "python": platform.python_version(),
    }


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, Any]]
    summary: dict[str, Any]
    data: FederatedData


def run_dir_for(cfg: RunConfig) -> Path:
    return Path(cfg.output.dir) / cfg.name


def check_names(cfg: RunConfig) -> None:
    """The config's dataset, model, feature styles and algorithm (with its params) exist, and
    the packages of its ``log`` sinks are installed: a mistyped name is an error before
    anything is created or loaded."""

    resolve_name(cfg.scenario.dataset)
    check_styles(cfg.scenario)
    MODELS.canonical(model_name(cfg))
    get_algorithm(cfg.algorithm.name).parse_params(cfg.algorithm.params)
    require_packages(cfg.log)  # the tracking sinks' packages


def run_experiment(
    cfg: RunConfig,
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    data: FederatedData | None = None,
    callbacks: list | None = None,
    overwrite: bool = False,
    executor: Executor | None = None,
    simulator: type[Simulator] = Simulator,
) -> RunResult:
    """Run (or resume) the experiment described by ``cfg``; write the run directory.
    ``executor``: one made elsewhere (e.g. the Flower adapter's) instead of the config's;
    ``simulator``: the simulator class (a deployment's runs the client side on its nodes).

    The run holds its directory for itself while it runs (:class:`~fedshift.run.lock.RunLock`:
    a second writer is refused); a start that fails (an unknown name, a missing dataset, a
    damaged checkpoint) leaves no empty folder behind."""
    load_plugins(cfg.plugins)  # before the scenario: a plugin may register its dataset
    device = resolve_device(cfg.device)
    check_names(cfg)
    target = Path(run_dir or run_dir_for(cfg))
    with removed_if_failed(target):  # only what this call created, and only while empty
        rd = RunDir(ensure_writable_dir(target))
        with RunLock(rd.path):
            return _run_in(rd, cfg, device, resume, data, callbacks, overwrite, executor, simulator)


def load_checkpoint(rd: RunDir, device: torch.device) -> tuple[SimState, dict[str, Any]]:
    """:meth:`RunDir.load_checkpoint`, torch's notes kept off the terminal, and a file that is
    no whole ``torch.save`` archive (cut short by a full disk or a copy, or some other file)
    named for what it is: torch's own words for those are an errno or advice about
    ``weights_only``."""
    path = rd.path / CHECKPOINT
    why = _not_an_archive(path)
    if why:
        raise FedshiftError(
            f"checkpoint {path} cannot be read ({why}); delete it to start this run over from "
            f"round 1 (`fedshift run {rd.path / CONFIG}` without --resume, or the same "
            "sweep/reproduce command)"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. torch on the pickle protocol of a foreign file
        return rd.load_checkpoint(device)


def _not_an_archive(path: Path) -> str | None:
    """Why ``path`` is not a whole zip archive, as ``torch.save`` writes (None: it is one, or
    it is missing or empty, which :meth:`RunDir.load_checkpoint` explains)."""
    import zipfile

    if not path.is_file() or path.stat().st_size == 0 or zipfile.is_zipfile(path):
        return None
    with path.open("rb") as fh:
        zipped = fh.read(4) == b"PK\x03\x04"
    if zipped:
        return f"truncated: the end of the archive is missing after {path.stat().st_size} bytes"
    return "not a checkpoint fedshift wrote: no torch.save archive"


def _run_in(
    rd: RunDir,
    cfg: RunConfig,
    device: torch.device,
    resume: bool,
    data: FederatedData | None,
    callbacks: list | None,
    overwrite: bool,
    executor: Executor | None,
    simulator: type[Simulator] = Simulator,
) -> RunResult:
    """:func:`run_experiment` in its claimed run directory."""
    if not resume and (rd.path / "checkpoint.pt").exists() and not overwrite:
        raise FedshiftError(
            f"{rd.path} already holds a run; continue it with `fedshift run --resume "
            f"{rd.path}`, replace it with --overwrite, or choose another name=..."
        )
    state: SimState | None = None
    saved: dict[str, Any] = {}
    if resume:  # before the scenario is built: a damaged checkpoint is reported at once
        state, saved = load_checkpoint(rd, device)
    data = data or build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    if cfg.train.augment != "none" and not data.is_image:
        raise ConfigError(
            f"train.augment={cfg.train.augment} needs images; {data.name} is not an image "
            "dataset (use train.augment=none)"
        )
    data.to(device)
    algo = make_algorithm(cfg, data, device)
    executor = executor or make_executor(cfg, algo, data)
    # an executor may say more of how the run was measured (a deployment's evaluation)
    meta = {**run_meta(cfg, data, device), "executor": executor.name}
    meta.update(getattr(executor, "run_meta", {}))
    if resume and saved.get("scenario_hash") != meta["scenario_hash"]:
        raise FedshiftError(f"{rd.path}: the config's scenario differs from the checkpoint's")
    sim_cfg = replace(sim_config(cfg), store_dir=str(rd.path))
    sim = simulator(algo, data, sim_cfg, executor, list(callbacks or []))
    fresh = state is None
    state = sim.initial_state() if state is None else state
    # before anything is written: a run that cannot fit leaves the folder as it was
    plan = memory_plan(cfg, algo, data, sim, state, executor, rd.path)
    meta["memory"] = plan.record()  # summary.json: the plan beside the measured peak
    if fresh:
        shutil.rmtree(rd.path / STORE_DIR, ignore_errors=True)  # an overwritten run's states
        rd.write_config(dump_config(cfg))
    apply_plan(plan, cfg, sim, state, executor)
    recorder = RunRecorder(rd, meta, cfg.output.checkpoint_every)
    # after the recorder, which writes the summary the tracker sends when the run ends
    tracker = open_tracker(cfg, rd.path, resume=resume, summary=rd.path / SUMMARY)
    sim.callbacks = [recorder, *tracker.callbacks, *sim.callbacks]
    with tracker:  # ends the tracked runs however the run ends
        try:
            with executor_context(executor):
                state = sim.run(state)
        except DivergedError as err:
            err.run_dir = str(rd.path)
            raise
        except KeyboardInterrupt as err:  # the CLI's hint names the folder to resume
            err.run_dir = str(rd.path)  # type: ignore[attr-defined]
            raise
        if cfg.output.plots:
            tracker.images(write_plots(cfg, rd.path, state.history, data))
    return RunResult(rd.path, state.history, rd.read_summary(), data)


def write_plots(
    cfg: RunConfig, folder: Path, history: list[dict[str, Any]], data: FederatedData
) -> list[Path]:
    """A finished run's figures: its curves, each test task's accuracy (drift scenarios) and,
    for a clustered method, the share of each concept's clients in each cluster."""

    runs = {cfg.algorithm.name: history}
    title = f"{cfg.name}: {data.name}"
    files = [plot_history(runs, folder / "curves.png", title=title)]
    if data.steps and data.test_clients:
        files.append(plot_tasks(runs, folder / "tasks.png", title=title))
    if history and "clusters" in history[-1] and all(c.concept >= 0 for c in data.clients):
        concepts = [c.concept for c in data.clients]
        heat = {cfg.algorithm.name: (history[-1]["clusters"], concepts)}
        title = f"{cfg.name}: clients of each concept per cluster (last round)"
        files.append(plot_cluster_heatmaps(heat, folder / "clusters.png", title=title))
    return files
