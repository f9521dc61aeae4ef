"""fedshift's Flower ClientApp: a node's side of local training.

Every train message carries one job (see :mod:`fedshift.flower.codec`) and the run's resolved
config. The node builds the same scenario and algorithm as the server from that config and
seed (once per process, cached), attaches its own copy of the client's data to the job's view,
trains it with the reference :class:`~fedshift.engine.executors.base.SequentialExecutor` (one
client per message: nothing to batch) and replies with the encoded result, which the server
aggregates exactly as fedshift's own executors' results.

The config travels with every message rather than once per node, so a node keeps no state
between messages: a restarted SuperNode, or Flower's default of a fresh ClientApp process
per message, still trains correctly (such a process rebuilds the scenario, from fedshift's
on-disk cache where the scenario has expensive parts).

A node whose node config names ``data`` (its own folder: see
:mod:`fedshift.flower.deploy.node`) is a deployment's node instead: it answers the server's
``hello`` with its clients, trains them from the states it keeps (``train``), scores them on
their own splits (``evaluate``) and forgets a run's states on ``reset``.

Node config keys (``flower-supernode --node-config``): ``partition-id`` and
``num-partitions`` say which clients the node serves (those whose id modulo
``num-partitions`` is ``partition-id``); optional ``data-dir`` and ``device`` replace the
config's ``data_dir`` and ``device`` on this node (its own dataset folder and accelerator).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedshift.config import parse_config_text, validate_config
from fedshift.core.errors import FedshiftError
from fedshift.core.version import VERSION as __version__
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors.base import SequentialExecutor
from fedshift.flower.codec import META, decode_request, encode_result, from_bytes, to_bytes
from fedshift.flower.deploy.node import (
    NodeRuntime,
    NodeSettings,
    NodeStore,
    describe,
    evaluate_job,
    runtime,
    train_job,
)
from fedshift.run.experiment import make_algorithm, resolve_device

#: the node config keys a node reports and the message type of the handshake
PARTITION_ID, NUM_PARTITIONS, NODE_RECORD = "partition-id", "num-partitions", "node"


@functools.lru_cache(maxsize=4)
def node_runtime(config: str, data_dir: str | None, device: str | None) -> NodeRuntime:
    """The scenario and algorithm of a run's resolved ``config`` (YAML) on this node, with the
    node's ``data_dir``/``device`` when it sets them; cached per process, so a node that trains
    many messages of a run builds them once."""

    raw = parse_config_text(config, "the run config from the server")
    if data_dir is not None:
        raw["data_dir"] = data_dir
    if device is not None:
        raw["device"] = device
    cfg = validate_config(raw)
    dev = resolve_device(cfg.device)
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    data.to(dev)
    return NodeRuntime(cfg, dev, data, make_algorithm(cfg, data, dev))


def _node_value(context: Context, key: str) -> str | None:
    value = context.node_config.get(key)
    return None if value is None or value == "" else str(value)


def node_info(context: Context) -> dict[str, Any]:
    """The node's partition and fedshift version, from its node config."""
    cfg = context.node_config
    if PARTITION_ID not in cfg or NUM_PARTITIONS not in cfg:
        raise FedshiftError(
            f"node {context.node_id}: its node config must set {PARTITION_ID} and "
            f'{NUM_PARTITIONS}, e.g. flower-supernode --node-config "{PARTITION_ID}=0 '
            f'{NUM_PARTITIONS}=2"'
        )
    part, total = int(cfg[PARTITION_ID]), int(cfg[NUM_PARTITIONS])
    if not 0 <= part < total:
        raise FedshiftError(
            f"node {context.node_id}: {PARTITION_ID}={part} must be in 0..{NUM_PARTITIONS}-1 "
            f"({total})"
        )
    return {PARTITION_ID: part, NUM_PARTITIONS: total, "fedshift": __version__}


def own_data(context: Context) -> NodeSettings | None:
    """The node's own-data settings (node config ``data``, ``shift``, ``labels``,
    ``client-id``, ``store``, ``device``), or None for a node of simulated clients."""
    data = _node_value(context, "data")
    if data is None:
        return None
    cid = _node_value(context, "client-id")
    return NodeSettings(
        data=data,
        shift=_node_value(context, "shift"),
        labels=_node_value(context, "labels"),
        client_id=None if cid is None else int(cid),
        store=_node_value(context, "store"),
        device=_node_value(context, "device"),
    )


def _reply(msg: Message, fields: dict[str, Any]) -> Message:
    return Message(RecordDict({META: ConfigRecord(fields)}), reply_to=msg)


app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """The handshake: which clients this node serves, and its fedshift version; for a node of
    its own data also ``reset`` (forget a run's client states)."""
    settings = own_data(context)
    action = msg.content.config_records[META]["action"] if META in msg.content else None
    if action is None:  # a server of simulated clients
        if settings is not None:
            raise FedshiftError(
                "this node holds its own data (node config data=...); the server expects "
                "simulated clients (partition-id): start it as a deployment's server"
            )
        return Message(RecordDict({NODE_RECORD: ConfigRecord(node_info(context))}), reply_to=msg)
    if settings is None:
        return _reply(msg, {"mode": "simulated", "fedshift": __version__})
    if action == "reset":
        NodeStore(settings.store_root, str(msg.content.config_records[META]["run"])).reset()
        return _reply(msg, {"mode": "own-data", "done": True})
    info = to_bytes(describe(settings), "the node's description")
    return _reply(msg, {"mode": "own-data", "fedshift": __version__, "info": info})


def _own_job(msg: Message, context: Context):
    """(runtime, job) of a deployment's message to a node of its own data."""
    settings = own_data(context)
    if settings is None:
        raise FedshiftError("a deployment's job reached a node without node config data=...")
    rec = msg.content.config_records[META]
    job = from_bytes(rec["job"])
    rt = runtime(str(rec["config"]), settings, str(job["run"]))
    job["server"] = from_bytes(rec["server"], rt.device)
    return rt, job, int(rec["index"])


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Score the node's clients of the message on their own splits; reply with counts."""
    rt, job, _ = _own_job(msg, context)
    rows = to_bytes(evaluate_job(rt, job), "the scores")
    return _reply(msg, {"rows": rows})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the job of a train message and reply with its result."""
    if "job" in msg.content.config_records[META]:  # a deployment: the node's own client
        rt, job, index = _own_job(msg, context)
        return Message(encode_result(train_job(rt, job), index), reply_to=msg)
    config = str(msg.content.config_records[META]["config"])
    rt = node_runtime(config, _node_value(context, "data-dir"), _node_value(context, "device"))
    req = decode_request(msg.content, rt.device)
    view = replace(req.view, inputs=rt.data.inputs)
    with torch.enable_grad():
        result = SequentialExecutor().train_one(rt.algo, req.task, view, req.work)
    return Message(encode_result(result, req.index), reply_to=msg)
