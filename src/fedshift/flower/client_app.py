"""fedshift's Flower ClientApp: a node's side of local training.

Every train message carries one job (see :mod:`fedshift.flower.codec`) and the run's resolved
config. The node builds the same scenario and algorithm as the server from that config and
seed (once per process, cached), attaches its own copy of the client's data to the job's view,
trains it with the reference :class:`~fedshift.engine.executors.SequentialExecutor` (one
client per message: nothing to batch) and replies with the encoded result, which the server
aggregates exactly as fedshift's own executors' results.

The config travels with every message rather than once per node, so a node keeps no state
between messages: a restarted SuperNode, or Flower's default of a fresh ClientApp process
per message, still trains correctly (such a process rebuilds the scenario, from fedshift's
on-disk cache where the scenario has expensive parts).

Node config keys (``flower-supernode --node-config``): ``partition-id`` and
``num-partitions`` say which clients the node serves (those whose id modulo
``num-partitions`` is ``partition-id``); optional ``data-dir`` and ``device`` replace the
config's ``data_dir`` and ``device`` on this node (its own dataset folder and accelerator).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedshift import __version__
from fedshift.algorithms.base import Algorithm
from fedshift.config import RunConfig, parse_config_text, validate_config
from fedshift.data.federated import FederatedData
from fedshift.data.scenario import build_scenario
from fedshift.engine.executors import SequentialExecutor
from fedshift.errors import FedshiftError
from fedshift.flower.codec import META, decode_request, encode_result

#: the node config keys a node reports and the message type of the handshake
PARTITION_ID, NUM_PARTITIONS, NODE_RECORD = "partition-id", "num-partitions", "node"


@dataclass
class NodeRuntime:
    """What a node builds from a run's config: the config, device, data and algorithm."""

    cfg: RunConfig
    device: torch.device
    data: FederatedData
    algo: Algorithm


@functools.lru_cache(maxsize=4)
def node_runtime(config: str, data_dir: str | None, device: str | None) -> NodeRuntime:
    """The scenario and algorithm of a run's resolved ``config`` (YAML) on this node, with the
    node's ``data_dir``/``device`` when it sets them; cached per process, so a node that trains
    many messages of a run builds them once."""
    from fedshift.runner import make_algorithm, resolve_device

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


app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """The handshake: which clients this node serves, and its fedshift version."""
    return Message(RecordDict({NODE_RECORD: ConfigRecord(node_info(context))}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the job of a train message and reply with its result."""
    config = str(msg.content.config_records[META]["config"])
    rt = node_runtime(config, _node_value(context, "data-dir"), _node_value(context, "device"))
    req = decode_request(msg.content, rt.device)
    view = replace(req.view, inputs=rt.data.inputs)
    with torch.enable_grad():
        result = SequentialExecutor().train_one(
            rt.algo, req.task, view, req.sgd, req.sched, req.seed, req.rnd
        )
    return Message(encode_result(result, req.index), reply_to=msg)
