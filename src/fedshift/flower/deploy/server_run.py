"""A deployment's run: fedshift's simulator with the client side of every round on the nodes
(:class:`DeployedSimulator`), the clients as the server knows them (:func:`remote_data`), the
federated scores (:func:`federated_scores`) and :func:`serve_deployed`, which the ServerApp
calls when its nodes name their own data (see :mod:`fedshift.flower.deploy.server`)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from fedshift.algorithms.base import RoundContext
from fedshift.algorithms.clipping import clip_results, nearest_origins
from fedshift.config import RunConfig, dump_config
from fedshift.core.errors import ConfigError
from fedshift.data.concepts import identity_map
from fedshift.data.federated import CLEAN, Client, FederatedData
from fedshift.engine.executors.base import RoundWork
from fedshift.engine.metrics import pooled_and_mean
from fedshift.engine.simulator import SimState, Simulator
from fedshift.flower.deploy.server import DeployedClients
from fedshift.flower.experiment import ServerRun
from fedshift.run.experiment import RunResult, resolve_device, run_experiment


def remote_data(clients: DeployedClients) -> FederatedData:
    """The clients of a deployment as the server knows them: ids and the input format, no
    samples (an empty pool) and no ground truth (concept -1)."""
    fmt, none = clients.format, torch.zeros(0, dtype=torch.long)
    c = int(fmt["num_classes"])
    shape = tuple(int(v) for v in fmt["input_shape"])
    records = [
        Client(cid, -1, identity_map(c), CLEAN, none, none, none, none, np.zeros(c, np.int64))
        for cid in sorted(clients.info)
    ]
    digests = "".join(f"{cid}:{clients.info[cid]['digest']};" for cid in sorted(clients.info))
    x = torch.zeros((0, *shape), dtype=torch.uint8 if fmt["image"] else torch.float32)
    return FederatedData(
        name="deployment",
        x=x,
        num_classes=c,
        input_shape=shape,
        mean=torch.zeros(1),
        std=torch.ones(1),
        clients=records,
        test_clients=[],
        concepts=[identity_map(c)],
        source=f"{len(set(clients.node.values()))} Flower nodes' own data",
        meta={"scenario_hash": hashlib.sha256(digests.encode()).hexdigest()[:16]},
    )


def federated_scores(rows: list[dict[str, Any]], num_clients: int) -> dict[str, Any]:
    """The metrics of an evaluation from the nodes' counts (one row per client)."""
    by = {r["cid"]: r for r in rows}
    order = [by[c] for c in range(num_clients) if c in by]
    out: dict[str, Any] = {}
    out["local_acc"], out["local_acc_client_mean"] = pooled_and_mean(
        [r["test_correct"] for r in order], [r["num_test"] for r in order]
    )
    if order and "train_correct" in order[0]:
        n = [r["num_train"] for r in order]
        out["train_acc"], _ = pooled_and_mean([r["train_correct"] for r in order], n)
        out["train_loss"] = sum(r.get("train_nll", 0.0) for r in order) / max(1, sum(n))
    clusters = [r["cluster"] for r in order]
    if any(k is not None for k in clusters):
        out["clusters"] = [-1 if k is None else int(k) for k in clusters]
        for k in sorted({k for k in clusters if k is not None}):
            members = [r for r in order if r["cluster"] == k]
            out[f"cluster_acc_{k}"], _ = pooled_and_mean(
                [r["test_correct"] for r in members], [r["num_test"] for r in members]
            )
    return out


class DeployedSimulator(Simulator):
    """The simulator of a deployment: sampling, aggregation, server optimiser, checkpoints
    and callbacks as fedshift's; each round's client side and every evaluation on the nodes
    (``executor`` is the :class:`DeployedClients`)."""

    executor: DeployedClients

    @property
    def run_key(self) -> str:
        """The name of this run's client states on the nodes: its config and directory."""
        text = f"{self.executor.config}\n{self.cfg.store_dir}"
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def run(self, state: SimState | None = None) -> SimState:
        if state is None or state.round == 0:  # a run (re)starting at round 1
            self.executor.reset(self.run_key)
        return super().run(state)

    def _job(self, work: RoundWork) -> dict[str, Any]:
        return {
            "rnd": work.round,
            "run": self.run_key,
            "work": work.to_dict(),
            "eval_batch": self.cfg.eval_batch,
        }

    def client_round(self, state, data, ctx: RoundContext, work: RoundWork, losses):
        base = {**self._job(work), "ctx": asdict(ctx)}
        base["keep_momentum"] = self.cfg.train.keep_momentum
        unequal = self.cfg.train.local_epochs_max is not None
        jobs = []
        for cid in ctx.sampled:
            epochs = self._local_epochs(ctx.round, cid) if unequal else None
            jobs.append((cid, {**base, "cid": cid, "epochs": epochs}))

        server, rule = state.server, self.cfg.train.clip_updates  # what the nodes started from

        def stream():
            for r in self.executor.train_round(server, jobs, ctx.round):
                if r.telemetry.get("steps"):
                    losses.append(r.telemetry["train_loss"])
                # the server does not see the tasks: a model's start is the nearest it sent
                yield r, (nearest_origins(r, server) if rule is not None else ((), ()))

        return clip_results(stream(), rule)

    def evaluation(self, state, data, sampled, work: RoundWork) -> dict[str, Any]:
        job = {**self._job(work), "train_metrics": self.cfg.train_metrics}
        cids = [c.cid for c in data.clients]
        rows = self.executor.evaluate_round(state.server, job, cids, work.round)
        return federated_scores(rows, len(data.clients))


def check_deployable(cfg: RunConfig) -> None:
    """Refuse what a deployment cannot do: scores that need test-only clients, time."""
    if cfg.eval.personal != "none":
        raise ConfigError(
            "eval.personal scores personal models on test-only clients, which a deployment "
            "does not have; set eval.personal=none"
        )
    if cfg.scenario.drift is not None or cfg.scenario.timeline is not None:
        raise ConfigError(
            "a deployment's data is each node's folder, which does not change during the run; "
            "remove scenario.drift / scenario.timeline from the config"
        )
    if cfg.scenario.validation_fraction:
        raise ConfigError(
            "scenario.validation_fraction: the nodes hold no validation split; set it to 0"
        )


def serve_deployed(
    grid, run: ServerRun, wait_s: float = 300.0, resend_s: float = 600.0, stop=None
) -> RunResult:
    """Run one experiment on the nodes of ``grid`` that hold their own data."""
    cfg = run.cfg
    check_deployable(cfg)
    clients = DeployedClients(
        grid,
        dump_config(cfg),
        resolve_device(cfg.device),
        wait_s,
        resend_s,
        stop=stop,
        max_dropped=cfg.flower.max_dropped_replies,
        norm_ratio=cfg.flower.max_norm_ratio,
    )
    clients.connect(cfg.scenario.num_clients)
    extra = sorted(set(clients.info) - set(range(cfg.scenario.num_clients)))
    if extra:
        raise ConfigError(
            f"nodes hold clients {extra}, beyond scenario.num_clients="
            f"{cfg.scenario.num_clients}: set it to the federation's number of clients"
        )
    return run_experiment(
        cfg,
        data=remote_data(clients),
        executor=clients,  # type: ignore[arg-type]
        simulator=DeployedSimulator,
        run_dir=run.run_dir,
        resume=run.resume,
        overwrite=run.overwrite,
        callbacks=run.callbacks,
    )
