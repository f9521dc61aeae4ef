"""fedshift's Flower ServerApp: the server side of any fedshift algorithm on Flower.

The ServerApp runs fedshift's own :class:`~fedshift.engine.simulator.Simulator` with a
:class:`~fedshift.flower.executor.FlowerExecutor`: client sampling, client tasks, aggregation,
clustering state, evaluation, checkpoints and the run directory are fedshift's, and the sampled
clients' local training runs on the Flower nodes (the ClientApp of
:mod:`fedshift.flower.client_app`).

With nodes of simulated clients (node config ``partition-id``), evaluation stays on the
server, over the scenario's data, because fedshift's metrics need all clients at once
(clustering scores, per-concept and test-only accuracies): a *simulation of a deployment*.
When the nodes name their own data (node config ``data``) the run is a deployment
(:mod:`fedshift.flower.deploy.server`): the client side of every round and the evaluation run on
the nodes, which keep the clients' data and private states. The first node to answer says
which.

``app`` is the component for ``flwr run`` (see ``examples/flower/``). It reads the run config:

- ``fedshift-config``: a fedshift YAML config: a path (absolute, relative to the working
  directory or to the Flower app's folder, or one of fedshift's ``configs/``), or YAML text;
- ``fedshift-overrides``: ``key=value`` overrides, space-separated (as on fedshift's CLI);
- ``run-dir`` (default: the config's ``output.dir``/``name``), ``overwrite`` and ``resume``;
- ``wait-s``: how long to wait for the SuperNodes of every partition (default 300);
- ``resend-s``: a deployment: how long without a reply before a job is sent again (600).
"""

from __future__ import annotations

import io
import logging
import shlex
import threading
import time
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedshift.config import (
    RunConfig,
    apply_overrides,
    dump_config,
    load_config,
    parse_config_text,
    validate_config,
)
from fedshift.core.errors import FedshiftError
from fedshift.flower.codec import META
from fedshift.flower.deploy.server_run import serve_deployed
from fedshift.flower.executor import FlowerExecutor
from fedshift.flower.experiment import ServerRun, result_tables
from fedshift.run.experiment import RunResult, resolve_device, run_dir_for, run_experiment

logger = logging.getLogger("flwr")


def serve(
    grid: Grid, runs: list[ServerRun], wait_s: float = 300.0, stop: threading.Event | None = None
) -> list[RunResult]:
    """Run the experiments one after the other on the nodes of ``grid`` (``stop``: see
    :class:`FlowerExecutor`)."""
    out = []
    for run in runs:
        device = resolve_device(run.cfg.device)
        executor = FlowerExecutor(grid, dump_config(run.cfg), device, wait_s=wait_s, stop=stop)
        out.append(
            run_experiment(
                run.cfg,
                executor=executor,
                run_dir=run.run_dir,
                resume=run.resume,
                overwrite=run.overwrite,
                callbacks=run.callbacks,
            )
        )
    return out


def server_app_for(
    runs: list[ServerRun], results: list[RunResult], stop: threading.Event | None = None
) -> ServerApp:
    """A ServerApp that runs ``runs`` and appends their results to ``results`` (for Flower's
    simulation engine in this process; ``flwr run`` uses :data:`app`)."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:  # noqa: ARG001
        results.extend(serve(grid, runs, stop=stop))

    return server


# ---------------------------------------------------------------------- flwr run


def config_from_run_config(run_config: dict[str, Any], app_dir: Path | None) -> RunConfig:
    """The fedshift config named by a Flower run config (see the module's doc)."""
    value = str(run_config.get("fedshift-config", "")).strip()
    if not value:
        raise FedshiftError("Flower run config: set fedshift-config to a fedshift YAML config")
    overrides = shlex.split(str(run_config.get("fedshift-overrides", "")))
    if "\n" in value:  # YAML text
        raw = parse_config_text(value, "Flower run config: fedshift-config")
        return validate_config(apply_overrides(raw, overrides))
    here = Path(value).expanduser()
    tried = [here]
    if not here.is_absolute():  # the Flower app's folder, then the configs fedshift ships
        tried += [app_dir / here] if app_dir is not None else []
        tried += [Path(__file__).resolve().parents[1] / here]  # the package folder
    for p in tried:
        if p.is_file():
            return load_config(p, overrides)
    raise FedshiftError(
        f"Flower run config: fedshift-config {value!r} not found (looked for "
        f"{', '.join(str(p) for p in tried)})"
    )


def _app_dir(grid: Grid) -> Path | None:
    """The folder of the installed Flower app (FAB) this run comes from, if any."""
    from flwr.common.config import get_project_dir

    run = grid.run
    try:
        return get_project_dir(run.fab_id, run.fab_version, run.fab_hash)
    except ValueError:  # no FAB (e.g. Flower's Python simulation API)
        return None


class LogRounds:
    """A simulator callback that logs every evaluation to Flower's log (``flwr log``)."""

    KEYS = ("local_acc", "global_acc", "train_acc", "train_loss", "ari_concept")

    def on_start(self, sim, state) -> None:
        logger.info("fedshift: %s from round %d of %d", sim.algo.name, state.round, sim.cfg.rounds)

    def on_round_end(self, sim, state, metrics) -> None:
        if metrics:
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in self.KEYS if k in metrics)
            logger.info("fedshift round %d/%d: %s", state.round, sim.cfg.rounds, shown)

    def on_end(self, sim, state) -> None:
        pass


def results_text(name: str, res: RunResult) -> str:
    """The results tables of ``fedshift run``, as text."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=160).print(*result_tables(name, res), f"run directory: {res.run_dir}")
    return buf.getvalue()


def nodes_hold_own_data(grid: Grid, wait_s: float = 300.0, poll_s: float = 0.1) -> bool:
    """Whether the nodes of ``grid`` hold their own data (node config ``data``: a deployment)
    or serve the scenario's simulated clients: the first node to answer says."""
    deadline, asked, pending = time.monotonic() + wait_s, set(), set()
    while time.monotonic() < deadline:
        new = [n for n in grid.get_node_ids() if n not in asked]
        asked.update(new)
        hello = ConfigRecord({"action": "hello"})
        msgs = [Message(RecordDict({META: hello}), n, "query", group_id="mode") for n in new]
        pending.update(grid.push_messages(msgs) if msgs else [])
        for reply in grid.pull_messages(list(pending)) if pending else []:
            pending.discard(reply.metadata.reply_to_message_id)
            if not reply.has_error():
                return reply.content.config_records[META]["mode"] == "own-data"
        time.sleep(poll_s)
    raise FedshiftError(f"Flower: no SuperNode answered within {wait_s:g} s")


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """``flwr run``: one fedshift experiment named by the run config, on the run's nodes."""
    rc = dict(context.run_config)
    cfg = config_from_run_config(rc, _app_dir(grid))
    run = ServerRun(
        cfg,
        run_dir=str(rc.get("run-dir") or "") or None,
        resume=bool(rc.get("resume", False)),
        overwrite=bool(rc.get("overwrite", False)),
        callbacks=[LogRounds()],
    )
    if run.resume and not run.run_dir:
        raise FedshiftError("Flower run config: resume=true needs run-dir")
    logger.info("fedshift: run directory %s", Path(run.run_dir or run_dir_for(cfg)).resolve())
    wait_s = float(rc.get("wait-s", 300.0))
    if nodes_hold_own_data(grid, wait_s):
        logger.info("fedshift: a deployment: the nodes train and score their own data")
        res = serve_deployed(grid, run, wait_s, float(rc.get("resend-s", 600.0)))
    else:
        logger.info(
            "fedshift: the nodes serve the scenario's simulated clients (each builds the "
            "scenario; the server keeps client states and evaluates)"
        )
        (res,) = serve(grid, [run], wait_s=wait_s)
    logger.info("fedshift results:\n%s", results_text(cfg.algorithm.name, res))
