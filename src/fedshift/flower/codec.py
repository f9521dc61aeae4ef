"""Flower records for fedshift's training requests and client results.

A request is one job (a :class:`LocalTask` and the client's :class:`ClientData` *without* its
``inputs`` function: a node attaches its own copy of the data) plus the round's settings; a
result is a :class:`ClientResult`. Both become a Flower :class:`RecordDict`:

- every model's parameters, buffers and momentum buffers as one :class:`ArrayRecord` each
  (``params.0``, ``buffers.0``, ``momentum.0``, ...). This is the bulk of the traffic, and
  Flower stores arrays content-addressed and in chunks, so a server model sent to many clients
  of a round (FedAvg's global model, FedRC's K cluster models) travels to the SuperLink once;
- everything else (extras, info, phases, the client's indices, uploads: nested dicts, lists
  and tuples of tensors, numbers and strings) as one ``torch.save`` blob in the
  ``fedshift`` :class:`ConfigRecord`, read back with ``torch.load(..., weights_only=True)``,
  so a node or the server never unpickles arbitrary objects received from the network. Frozen
  dataclasses (phases, the round's :class:`RoundWork`) travel as dicts and are rebuilt here;
- the executor's telemetry as a :class:`MetricRecord` (what Flower's own tools read).

Values that are none of these (a module, a function, a custom object) are rejected when
encoding, with the path of the offending value, instead of failing on the other side.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedshift.algorithms.task import (
    Adversary,
    ClientData,
    ClientResult,
    LocalTask,
    Phase,
    TensorDict,
)
from fedshift.engine.executors.base import RoundWork

#: the ConfigRecord holding a message's blob and small fields
META = "fedshift"
_SCALARS = (bool, int, float, str, bytes, type(None))


@dataclass
class TrainRequest:
    """What a node needs to train one job: the job, the round's work, the job's position
    in the round (to put the replies back in order) and the run's resolved config (YAML), from
    which the node builds the same scenario and algorithm as the server."""

    task: LocalTask
    view: ClientData
    work: RoundWork
    index: int
    config: str


# ---------------------------------------------------------------------- plain structures


def plain(tree: Any, where: str = "value") -> Any:
    """A copy of ``tree`` made only of dicts, lists, tuples, scalars and CPU tensors (what
    ``torch.load(weights_only=True)`` reads back); anything else is a TypeError naming where
    it was found."""
    if isinstance(tree, torch.Tensor):
        t = tree.detach().cpu()
        # a view would carry its whole storage: send only its elements
        return t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t
    if isinstance(tree, _SCALARS):
        return tree
    if isinstance(tree, np.generic):
        return tree.item()
    if isinstance(tree, dict):
        return {k: plain(v, f"{where}[{k!r}]") for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        out = [plain(v, f"{where}[{i}]") for i, v in enumerate(tree)]
        return out if isinstance(tree, list) else tuple(out)
    raise TypeError(
        f"{where}: a {type(tree).__name__} cannot be sent to a Flower node; tasks, results "
        "and uploads must hold only dicts, lists, tuples, tensors, numbers and strings"
    )


def to_bytes(tree: Any, where: str = "value") -> bytes:
    """``tree`` (see :func:`plain`) as bytes."""
    buf = io.BytesIO()
    torch.save(plain(tree, where), buf)
    return buf.getvalue()


def from_bytes(blob: bytes, device: torch.device | str = "cpu") -> Any:
    """The structure of :func:`to_bytes`, its tensors on ``device``; only plain containers,
    scalars and tensors are accepted (``weights_only``)."""
    return torch.load(io.BytesIO(blob), map_location=device, weights_only=True)


def _models_out(out: RecordDict, name: str, models: list[TensorDict] | None) -> int | None:
    """Store models as ArrayRecords ``name.0``, ``name.1``, ...; return their number."""
    if models is None:
        return None
    for k, m in enumerate(models):
        state = {n: t.detach() for n, t in m.items()}
        out[f"{name}.{k}"] = ArrayRecord.from_torch_state_dict(state)
    return len(models)


def _models_in(
    content: RecordDict, name: str, count: int | None, device: torch.device | str
) -> list[TensorDict] | None:
    if count is None:
        return None
    recs = [content.array_records[f"{name}.{k}"] for k in range(count)]
    return [{n: t.to(device) for n, t in r.to_torch_state_dict().items()} for r in recs]


def _phase(fields_: dict[str, Any]) -> Phase:
    """A phase from its ``asdict`` form (its adversary, a nested dataclass, rebuilt too)."""
    adv = fields_.get("adversary")
    return Phase(**{**fields_, "adversary": None if adv is None else Adversary(**adv)})


def _fields_of(obj: Any, skip: tuple[str, ...]) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.name not in skip}


# ---------------------------------------------------------------------- requests


def encode_request(req: TrainRequest) -> RecordDict:
    """A training request as Flower records (the view's ``inputs`` is not sent)."""
    out = RecordDict()
    task = _fields_of(req.task, ("params", "buffers", "momentum"))
    task["phases"] = tuple(asdict(p) for p in req.task.phases)
    task["models"] = _models_out(out, "params", req.task.params)
    _models_out(out, "buffers", req.task.buffers)
    task["momentum"] = _models_out(out, "momentum", req.task.momentum)
    blob = {
        "task": task,
        "view": _fields_of(req.view, ("inputs",)),
        "work": req.work.to_dict(),
    }
    where = f"the task of client {req.view.cid}"
    out[META] = ConfigRecord(
        {"blob": to_bytes(blob, where), "index": req.index, "config": req.config}
    )
    return out


def decode_request(content: RecordDict, device: torch.device | str = "cpu") -> TrainRequest:
    """The request of :func:`encode_request`, its tensors on ``device``; the view's
    ``inputs`` is None until the node attaches its data."""
    meta = content.config_records[META]
    blob = from_bytes(meta["blob"], device)
    task = dict(blob["task"])
    count, momentum = task.pop("models"), task.pop("momentum")
    task["phases"] = tuple(_phase(p) for p in task["phases"])
    return TrainRequest(
        task=LocalTask(
            params=_models_in(content, "params", count, device),
            buffers=_models_in(content, "buffers", count, device),
            momentum=_models_in(content, "momentum", momentum, device),
            **task,
        ),
        view=ClientData(inputs=None, **blob["view"]),  # type: ignore[arg-type]
        work=RoundWork.from_dict(blob["work"]),
        index=int(meta["index"]),
        config=str(meta["config"]),
    )


# ---------------------------------------------------------------------- results


def encode_result(result: ClientResult, index: int) -> RecordDict:
    """A client's result (of the request at position ``index``) as Flower records."""
    out = RecordDict()
    blob = {
        "cid": result.cid,
        "num_samples": result.num_samples,
        "upload": result.upload,
        "models": _models_out(out, "params", result.params),
        "momentum": _models_out(out, "momentum", result.momentum),
        "steps": result.steps,
    }
    _models_out(out, "buffers", result.buffers)
    where = f"the result of client {result.cid}"
    out[META] = ConfigRecord({"blob": to_bytes(blob, where), "index": index})
    out["telemetry"] = MetricRecord(
        {k: v if isinstance(v, int) else float(v) for k, v in result.telemetry.items()}
    )
    return out


def decode_result(
    content: RecordDict, device: torch.device | str = "cpu"
) -> tuple[int, ClientResult]:
    """(request position, result) of :func:`encode_result`, tensors on ``device``."""
    meta = content.config_records[META]
    blob = from_bytes(meta["blob"], device)
    count = blob["models"]
    result = ClientResult(
        cid=blob["cid"],
        num_samples=blob["num_samples"],
        params=_models_in(content, "params", count, device),  # type: ignore[arg-type]
        buffers=_models_in(content, "buffers", count, device),  # type: ignore[arg-type]
        upload=blob["upload"],
        telemetry=dict(content.metric_records["telemetry"]),
        momentum=_models_in(content, "momentum", blob["momentum"], device),
        steps=int(blob.get("steps", 0)),
    )
    return int(meta["index"]), result
