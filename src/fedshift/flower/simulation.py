"""fedshift experiments as a Flower app in Flower's simulation engine, from Python or the CLI
(``fedshift flower``).

The scenario's clients become Flower SuperNodes (one per client by default), the ServerApp of
:mod:`fedshift.flower.server_app` runs fedshift's simulator with the Flower executor, and the
ClientApps run in Ray actors (one CPU each, ``num_cpus`` of them). The run directory is the
one ``fedshift run`` writes, and for the same seed and config the metrics equal those of
fedshift's sequential executor up to float rounding.

Flower's simulation engine starts Ray if it is not running, **and shuts Ray down when it
ends, even a Ray instance it did not start**. :func:`run_flower_simulation` therefore refuses
to run in a process that already uses Ray (e.g. next to ``executor=ray``); run it in a fresh
process, as the ``fedshift flower`` command does.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from fedshift.core.errors import FedshiftError
from fedshift.flower import require_flower
from fedshift.flower.experiment import ServerRun, result_tables
from fedshift.run.experiment import RunResult, resolve_device, run_dir_for

__all__ = ["ServerRun", "backend_config", "result_tables", "run_flower_simulation"]


class _NoRunSimulationNotice(logging.Filter):
    """Drops Flower's notice that its Python simulation API is deprecated in favour of
    ``flwr run``: ``fedshift flower`` is the command here, and it uses that API on purpose
    (it passes live Python objects: the configs, the progress callbacks, the results)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "run_simulation" not in record.getMessage()


@contextmanager
def _quiet_deprecation() -> Iterator[None]:
    flwr_logger = logging.getLogger("flwr")
    notice = _NoRunSimulationNotice()
    flwr_logger.addFilter(notice)
    try:
        yield
    finally:
        flwr_logger.removeFilter(notice)


@contextmanager
def _interrupts() -> Iterator[None]:
    """Ctrl-C and SIGTERM stop the simulation as they stop ``fedshift run`` (the CLI then says
    where the run is saved), quietly. Ray's start would replace the SIGTERM handler with one
    that exits at once, and its C++ core with one that aborts the process; once interrupted,
    the errors Flower logs while its actors go down (tracebacks of dead actors) are noise."""
    from ray._private import ray_constants, utils

    interrupted = threading.Event()

    def on_signal(signum, frame) -> None:  # noqa: ARG001
        interrupted.set()
        raise KeyboardInterrupt

    def quiet(record: logging.LogRecord) -> bool:
        return not (interrupted.is_set() and record.levelno >= logging.ERROR)

    main = threading.current_thread() is threading.main_thread()  # handlers: main thread only
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    for sig in handlers:
        signal.signal(sig, on_signal)
    saved = utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    utils.set_sigterm_handler = lambda handler: None
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # read when the driver connects
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addFilter(quiet)
    try:
        yield
    finally:
        flwr_logger.removeFilter(quiet)
        utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = saved
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def backend_config(runs: list[ServerRun], num_cpus: int) -> dict:
    """Flower's Ray backend settings: ``num_cpus`` CPUs, one per ClientApp actor; where the
    runs train on CUDA, the actors share the visible GPUs."""
    cuda = torch.cuda.is_available() and any(
        resolve_device(r.cfg.device).type == "cuda" for r in runs
    )
    gpus = torch.cuda.device_count() if cuda else 0
    return {
        "client_resources": {"num_cpus": 1, "num_gpus": gpus / num_cpus if gpus else 0.0},
        "init_args": {"num_cpus": num_cpus, "num_gpus": gpus, "include_dashboard": False},
    }


def run_flower_simulation(
    runs: list[ServerRun], supernodes: int | None = None, num_cpus: int = 2
) -> list[RunResult]:
    """Run the experiments, one after the other, in one start of Flower's simulation engine
    with ``supernodes`` nodes (default: the largest number of scenario clients)."""
    require_flower()
    import ray
    from flwr.simulation import run_simulation

    from fedshift.flower.client_app import app as client_app
    from fedshift.flower.server_app import server_app_for

    if ray.is_initialized():
        raise FedshiftError(
            "Flower's simulation engine shuts down the Ray instance of its process when it "
            "ends; run it in a fresh process (e.g. the `fedshift flower` command)"
        )
    if num_cpus < 1:
        raise FedshiftError(f"num_cpus must be at least 1, got {num_cpus}")
    nodes = max(r.cfg.scenario.num_clients for r in runs) if supernodes is None else supernodes
    if nodes < 1:
        raise FedshiftError(f"--supernodes must be at least 1, got {nodes}")
    # Ray's notice about accelerator variables: actors that ask for no GPU train on the CPU
    # here anyway (their device comes from the config), so either behaviour is right
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    results: list[RunResult] = []
    stop = threading.Event()  # Flower runs the ServerApp in a thread of this process
    try:
        with _quiet_deprecation(), _interrupts():
            run_simulation(
                server_app=server_app_for(runs, results, stop),
                client_app=client_app,
                num_supernodes=nodes,
                backend_config=backend_config(runs, num_cpus),  # type: ignore[arg-type]
            )
    except KeyboardInterrupt as err:  # the CLI's hint names the folder of the stopped run
        run = runs[min(len(results), len(runs) - 1)]
        err.run_dir = str(run.run_dir or run_dir_for(run.cfg))  # type: ignore[attr-defined]
        raise
    finally:
        stop.set()  # e.g. Ctrl-C: the ServerApp's thread stops waiting for replies
    if len(results) != len(runs):
        raise FedshiftError("the Flower simulation ended before its runs finished; see its log")
    return results
