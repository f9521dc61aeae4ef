"""The Flower adapter: jobs and results survive Flower's records exactly; the Flower executor
and the ClientApp give fedshift's numbers (in-process grid, then Flower's simulation engine in a
subprocess); node errors are one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from tests.conftest import require_extra

require_extra("flwr", "flower")
require_extra("ray", "flower")  # Flower's simulation engine (flwr[simulation] pins its Ray)

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedshift.algorithms.base import RoundContext  # noqa: E402
from fedshift.config import dump_config, validate_config  # noqa: E402
from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.data.scenario import build_scenario  # noqa: E402
from fedshift.engine.evaluation import client_data  # noqa: E402
from fedshift.engine.executors.base import SequentialExecutor  # noqa: E402
from fedshift.engine.simulator import Simulator  # noqa: E402
from fedshift.flower import client_app  # noqa: E402
from fedshift.flower.codec import (  # noqa: E402
    TrainRequest,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
    from_bytes,
    plain,
    to_bytes,
)
from fedshift.flower.executor import FlowerExecutor  # noqa: E402
from fedshift.run.experiment import make_algorithm, run_experiment, sim_config  # noqa: E402
from tests.conftest import ROOT, tiny_config  # noqa: E402

CPU = torch.device("cpu")
THREE_CONCEPTS = {
    "scenario__concepts": ["identity", "reverse", "shift"],
    "scenario__mix": {
        "types": [{"fraction": 1 / 3, "concepts": [k]} for k in range(3)],
    },
}
FEDRC = {"name": "fedrc", "params": {"num_clusters": 3}}


def assert_same(a, b, where="value"):
    """Equal trees: the same containers, keys and scalars; tensors equal in dtype and value."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif hasattr(a, "__dataclass_fields__"):
        assert type(a) is type(b), where
        for f in fields(a):
            if f.name != "inputs":
                assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"  # NaN == NaN


def is_timing(key: str) -> bool:
    """Wall-clock measurements (elapsed_s, train_s, eval_s): the only metrics that differ."""
    return key.endswith("_s")


def untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not is_timing(k)}


# ---------------------------------------------------------------------- codec


def first_job(cfg):
    """A real job: client 0's task in round 1, with momentum buffers to carry."""
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, CPU)
    init = Simulator(algo, data, sim_config(cfg)).initial_state()
    view = client_data(data, data.clients[0])
    task = algo.client_task(init.server, algo.init_client_state(0), view, RoundContext(1, (0, 1)))
    task = replace(task, momentum=[{} for _ in task.params])
    return algo, data, sim_config(cfg), task, view


CODEC_CASES = {
    "fedavg": {},
    "fedrc-k3": {"algorithm": FEDRC, **THREE_CONCEPTS},
    "fednh": {
        "algorithm": {"name": "fednh"},
        "model": {"name": "mlp", "width": 32, "head_bias": False},
    },
    "dfl": {
        "algorithm": {"name": "dfl"},
        "scenario": {"dataset": "digits", "num_clients": 4, "label_shift": {"kind": "iid"}},
        "model": {"name": "convbn_cnn"},
        "train__batch_size": 16,
    },
}


@pytest.mark.parametrize("case", list(CODEC_CASES))
def test_jobs_and_results_round_trip_exactly(tmp_path, case):
    cfg = validate_config(tiny_config(tmp_path, train__local_steps=2, **CODEC_CASES[case]))
    algo, data, sc, task, view = first_job(cfg)
    work = sc.work(2)
    req = TrainRequest(task, replace(view, inputs=None), work, 5, "x: 1")
    back = decode_request(encode_request(req))
    assert_same(back.task, task, "task")
    assert_same(back.view, view, "view")
    assert back.view.inputs is None
    assert (back.work, back.index, back.config) == (work, 5, "x: 1")
    assert (back.work.seed, back.work.round, back.work.sgd) == (work.seed, 2, work.sgd)
    ex = SequentialExecutor()
    res = ex.train_one(algo, task, view, work)
    redone = ex.train_one(algo, back.task, replace(back.view, inputs=data.inputs), back.work)
    assert_same(redone, res, "result of the decoded job")
    assert res.momentum is not None and any(res.momentum)
    index, got = decode_result(encode_result(res, 7))
    assert index == 7
    assert_same(got, res, "result")


class Opaque:
    """Not a plain value: must never travel, nor be loaded from the network."""


def test_only_plain_values_travel():
    with pytest.raises(TypeError, match=r"extras\['f'\]: a function cannot be sent"):
        plain({"f": lambda: 0}, "extras")
    tree = {"a": (1, 2.5, "s", None), 3: [torch.arange(4)[1:3]]}
    assert_same(from_bytes(to_bytes(tree)), tree)
    import io

    buf = io.BytesIO()
    torch.save({"x": Opaque()}, buf)
    with pytest.raises(Exception, match="Unsupported global|weights_only"):
        from_bytes(buf.getvalue())


# ---------------------------------------------------------------------- an in-process grid


class LocalGrid:
    """A Flower grid that runs fedshift's ClientApp in this process: ``nodes`` nodes (node
    config partition-id / num-partitions), replies pulled in reverse order, and with ``lag``
    the nodes connect late and a pull returns nothing ``lag`` times out of ``lag + 1``;
    ``fail`` makes the ClientApp of that partition fail (as Flower reports it: an error
    reply)."""

    def __init__(self, nodes: int, fail: int | None = None, config=None, lag: int = 0) -> None:
        self.contexts = {
            100 + p: Context(
                run_id=1,
                node_id=100 + p,
                node_config=config or {"partition-id": p, "num-partitions": nodes},
                state=RecordDict(),
                run_config={},
            )
            for p in range(nodes)
        }
        self.fail, self.replies, self.lag, self.polls = fail, {}, lag, 0

    def get_node_ids(self):
        self.polls += 1  # with a lag, nodes connect late and replies come late
        return list(self.contexts) if self.polls > self.lag else []

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = mid = str(uuid.uuid4())
            ctx = self.contexts[msg.metadata.dst_node_id]
            try:
                train = msg.metadata.message_type == "train"
                if train and ctx.node_config.get("partition-id") == self.fail:
                    raise RuntimeError("out of memory")
                self.replies[mid] = client_app.app(msg, ctx)
            except Exception as ex:
                self.replies[mid] = Message(Error(code=0, reason=repr(ex)), reply_to=msg)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        self.polls += 1
        if self.polls % (self.lag + 1):
            return []
        return [self.replies.pop(m) for m in reversed(list(message_ids)) if m in self.replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(list(messages)))


@pytest.fixture
def task_identity():
    """Flower's ServerApp identity (set by Flower's runtime), needed to create messages."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id = TaskIdentity._node_id = TaskIdentity._task_id = None


def test_flower_executor_gives_the_sequential_numbers(tmp_path, task_identity):
    over = {"algorithm": FEDRC, "train__participation": 0.5, "train__rounds": 2, **THREE_CONCEPTS}
    cfg = validate_config(tiny_config(tmp_path, executor="sequential", **over))
    ref = run_experiment(cfg, run_dir=tmp_path / "seq").history
    ex = FlowerExecutor(LocalGrid(2, lag=2), dump_config(cfg), poll_s=0.001, push_chunk=2)
    got = run_experiment(cfg, executor=ex, run_dir=tmp_path / "flower").history
    assert ex.partitions == {0: 100, 1: 101} and ex.node_of(5) == 101
    assert len(got) == len(ref) == cfg.train.rounds
    for g, r in zip(got, ref, strict=True):
        assert untimed(g) == untimed(r)
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert summary["executor"] == "flower"


def test_node_errors_are_one_clear_error(tmp_path, task_identity):
    cfg = validate_config(tiny_config(tmp_path, train__rounds=1))
    ex = FlowerExecutor(LocalGrid(2, fail=1), dump_config(cfg))
    with pytest.raises(FedshiftError, match=r"round 1, client [135] \(node 101\): .*out of memory"):
        run_experiment(cfg, executor=ex, run_dir=tmp_path / "a")
    ex = FlowerExecutor(LocalGrid(2), "not: [a config")
    with pytest.raises(
        FedshiftError, match=r"round 1, client \d \(node 10[01]\): .*not valid YAML"
    ):
        run_experiment(cfg, executor=ex, run_dir=tmp_path / "b")
    with pytest.raises(FedshiftError, match="must set partition-id and num-partitions"):
        FlowerExecutor(LocalGrid(1, config={"x": 1}), "c").connect()


def test_the_cli_command_prints_the_run_tables(tmp_path, monkeypatch, task_identity):
    """``fedshift flower`` (here on the in-process grid instead of Flower's simulation engine,
    which the next test starts) writes the run directory and prints ``fedshift run``'s
    tables."""
    import yaml
    from typer.testing import CliRunner

    from fedshift.cli import app
    from fedshift.flower import simulation
    from fedshift.flower.server_app import serve

    calls = []

    def on_local_grid(runs, supernodes, cpus):
        calls.append((supernodes, cpus))
        return serve(LocalGrid(supernodes), runs)

    monkeypatch.setattr(simulation, "run_flower_simulation", on_local_grid)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, train__rounds=2)))
    out = CliRunner().invoke(app, ["flower", str(path), "train.lr=0.1", "--supernodes", "4"])
    assert out.exit_code == 0, out.output
    assert calls == [(4, 2)]
    assert "metrics at the last evaluated round" in out.output
    assert "run directory:" in out.output
    config = yaml.safe_load((tmp_path / "runs" / "tiny" / "config.yaml").read_text())
    assert config["train"]["lr"] == 0.1


def test_the_server_app_finds_its_config(tmp_path):
    """``fedshift-config`` of the run config: a path relative to the Flower app, one of
    fedshift's configs, or YAML text; with ``fedshift-overrides``."""
    import yaml

    from fedshift.flower.server_app import config_from_run_config

    (tmp_path / "app.yaml").write_text(yaml.safe_dump(tiny_config(tmp_path)))
    rc = {"fedshift-config": "app.yaml", "fedshift-overrides": "train.lr=0.2 name='a b'"}
    cfg = config_from_run_config(rc, tmp_path)
    assert (cfg.train.lr, cfg.name, cfg.scenario.dataset) == (0.2, "a b", "synthetic")
    cfg = config_from_run_config({"fedshift-config": "configs/quickstart.yaml"}, None)
    assert cfg.name == "quickstart"
    text = yaml.safe_dump(tiny_config(tmp_path, name="inline"))
    assert config_from_run_config({"fedshift-config": text}, None).name == "inline"
    with pytest.raises(FedshiftError, match="'nope.yaml' not found"):
        config_from_run_config({"fedshift-config": "nope.yaml"}, tmp_path)


# ---------------------------------------------------------------------- Flower's simulation


SIMULATE = """
import json, sys
from fedshift.config import validate_config
from fedshift.flower.simulation import ServerRun, run_flower_simulation
cfgs = [validate_config(c) for c in json.loads(sys.argv[1])]
res = run_flower_simulation([ServerRun(c, run_dir=d) for c, d in zip(cfgs, sys.argv[2:])], 6, 2)
print("RUNS", json.dumps([str(r.run_dir) for r in res]))
"""


@pytest.mark.slow
def test_flower_simulation_matches_the_sequential_executor(tmp_path):
    """FedAvg and FedRC (K=3, three concepts, half the clients per round) through Flower's
    simulation engine (Ray, one SuperNode per client) end with the sequential executor's
    metrics, in one start of the engine."""
    raws = [
        tiny_config(tmp_path, name="fedavg", train__participation=0.5),
        tiny_config(tmp_path, name="fedrc", algorithm=FEDRC, train__participation=0.5),
    ]
    for key, value in THREE_CONCEPTS.items():
        raws[1]["scenario"][key.split("__")[1]] = value
    dirs = [str(tmp_path / "flower" / r["name"]) for r in raws]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SIMULATE), json.dumps(raws), *dirs],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0 and "RUNS" in out.stdout, out.stdout[-3000:] + out.stderr[-5000:]
    for raw, d in zip(raws, dirs, strict=True):
        cfg = validate_config({**raw, "executor": "sequential"})
        seq = run_experiment(cfg, run_dir=tmp_path / "seq" / raw["name"]).run_dir
        ref = [json.loads(line) for line in (seq / "metrics.jsonl").read_text().splitlines()]
        got = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines()]
        assert len(got) == len(ref) == cfg.train.rounds
        for g, r in zip(got, ref, strict=True):
            assert g.keys() == r.keys()
            for k, v in r.items():
                if not is_timing(k):
                    assert g[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (raw["name"], k)
        summary = json.loads((Path(d) / "summary.json").read_text())
        assert summary["executor"] == "flower"
