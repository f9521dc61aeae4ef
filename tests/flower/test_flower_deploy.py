"""A real deployment (issue 28): nodes train and score their own data folders, clients'
private states stay on their nodes, evaluation is federated, a lost reply is sent again.

The server and nodes run in this process (``tests/flower/flower_local.py``: Flower's Grid over
ClientApp calls), so every message a node sends can be inspected; the SuperLink/SuperNode
processes with TLS are ``examples/flower/deploy_localhost.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import require_extra, tiny_config

require_extra("flwr", "flower")

from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedshift.algorithms.base import RoundContext, keep_shared  # noqa: E402
from fedshift.algorithms.registry import algorithm_names  # noqa: E402
from fedshift.config import dump_config, validate_config  # noqa: E402
from fedshift.core.errors import ConfigError, FedshiftError  # noqa: E402
from fedshift.data.client_folders import (  # noqa: E402
    export_clients,
    local_shift,
    node_data,
    read_clients,
)
from fedshift.data.scenario import build_scenario  # noqa: E402
from fedshift.engine.executors.base import RoundWork  # noqa: E402
from fedshift.engine.trees import tensors  # noqa: E402
from fedshift.flower.client_app import app  # noqa: E402
from fedshift.flower.codec import decode_result, encode_result  # noqa: E402
from fedshift.flower.deploy import node as node_mod  # noqa: E402
from fedshift.flower.deploy.node import NodeSettings, NodeStore, check_private  # noqa: E402
from fedshift.flower.deploy.replies import ModelSpec, check_result  # noqa: E402
from fedshift.flower.deploy.server_run import check_deployable, serve_deployed  # noqa: E402
from fedshift.flower.experiment import ServerRun  # noqa: E402
from fedshift.flower.server_app import nodes_hold_own_data  # noqa: E402
from fedshift.run.experiment import load_checkpoint, run_experiment  # noqa: E402
from fedshift.run.folder import RunDir  # noqa: E402
from tests.flower.flower_local import InProcessNodes  # noqa: E402

SKEW = {"scenario__label_shift": {"kind": "dirichlet", "alpha": 0.5}, "scenario__num_clients": 4}


@pytest.fixture
def task_identity():
    """Flower's ServerApp identity (set by Flower's runtime), needed to create messages."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id = TaskIdentity._node_id = TaskIdentity._task_id = None


def _exported(tmp_path: Path, **over):
    cfg = validate_config(tiny_config(tmp_path, **{**SKEW, **over}))
    data = build_scenario(cfg.scenario, cfg.seed, None)
    export_clients(data, tmp_path / "clients")
    return cfg, data


def _keys(tree) -> set[tuple]:
    return {(t.dtype, tuple(t.shape), t.numpy().tobytes()) for t in tensors(tree) if t.numel() > 1}


def test_exported_clients_give_the_simulation_inputs_and_a_node_shift_applies(tmp_path):
    _, data = _exported(tmp_path)
    clients = read_clients(tmp_path / "clients")  # a folder of client folders
    assert [c.cid for c in clients] == [0, 1, 2, 3]
    nd = node_data(clients)
    for a, b in zip(data.clients, nd.clients, strict=True):
        assert torch.equal(data.inputs(a.train_idx), nd.inputs(b.train_idx))
        assert torch.equal(data.inputs(a.test_idx), nd.inputs(b.test_idx))
        assert torch.equal(a.y_train, b.y_train) and b.concept == -1  # no ground truth
    rev = local_shift(clients[0], None, "reverse")
    assert np.array_equal(rev.y_train, data.num_classes - 1 - clients[0].y_train)
    with pytest.raises(FedshiftError, match="images only"):
        local_shift(clients[0], "rotate:90", None)


def test_an_image_folder_is_a_client_and_its_style_applies(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("test", 2)):
        for label in (0, 2):
            folder = tmp_path / "c" / split / str(label)
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(img).save(folder / f"{i}.png")
    (tmp_path / "c" / "client.json").write_text(json.dumps({"cid": 7, "num_classes": 3}))
    (c,) = read_clients(tmp_path / "c")
    assert (c.cid, c.x_train.shape, c.input_shape) == (7, (6, 8, 8, 3), (3, 8, 8))
    assert sorted(c.y_train.tolist()) == [0, 0, 0, 2, 2, 2]
    turned = local_shift(c, "rotate:90", None)
    assert np.array_equal(turned.x_train[0], np.rot90(c.x_train[0], k=1)) or not np.array_equal(
        turned.x_train, c.x_train
    )
    with pytest.raises(FedshiftError, match="no such folder"):
        read_clients(tmp_path / "nowhere")


@pytest.mark.usefixtures("task_identity")
def test_a_deployment_equals_the_simulation_and_no_private_state_leaves_a_node(tmp_path):
    """Ditto on 3 nodes (one holds two clients): the same numbers as the simulation, the
    personal models only in the nodes' stores, never in a message; a node restarts (its
    caches gone) and loses one reply mid-run, and the job sent again changes nothing."""
    cfg, _ = _exported(tmp_path, algorithm={"name": "ditto"}, train__participation=0.75)
    sim = run_experiment(cfg, run_dir=tmp_path / "sim")
    c = tmp_path / "clients"
    (c / "pair").mkdir()
    for k in (0, 1):
        (c / f"client_{k}").rename(c / "pair" / f"client_{k}")
    stores = {n: tmp_path / f"store{n}" for n in (1, 2, 3)}
    folders = {1: c / "pair", 2: c / "client_2", 3: c / "client_3"}
    grid = InProcessNodes(
        app, {n: {"data": str(folders[n]), "store": str(stores[n])} for n in folders}
    )

    class RestartNode3:  # after round 1: node 3's process is new and its next reply is lost
        def on_start(self, sim, state): ...
        def on_end(self, sim, state): ...
        def on_round_end(self, sim, state, metrics):
            if state.round == 1:
                node_mod.runtime.cache_clear()
                node_mod.node_clients.cache_clear()
                grid.lose_next[3] = 1

    run = ServerRun(cfg, run_dir=str(tmp_path / "dep"), callbacks=[RestartNode3()])
    res = serve_deployed(grid, run, wait_s=5, resend_s=0.3)
    keys = ("round", "local_acc", "local_acc_client_mean", "train_acc", "train_loss")
    assert [{k: h[k] for k in keys} for h in res.history] == [
        {k: h[k] for k in keys} for h in sim.history
    ]
    summary = json.loads((tmp_path / "dep" / "summary.json").read_text())
    assert summary["executor"] == "flower-deployment"
    assert "not measured" in summary["evaluation"]["ari_concept, nmi_*, global_acc, pm_*"]
    assert "global_acc" not in res.history[-1] and "ari_concept" not in res.history[-1]
    state, _ = load_checkpoint(RunDir(tmp_path / "dep"), torch.device("cpu"))
    assert len(state.clients) == 0  # the server holds no client state
    # every personal model lives in its node's store and equals the simulation's
    sim_state, _ = load_checkpoint(RunDir(tmp_path / "sim"), torch.device("cpu"))
    node_of = {0: 1, 1: 1, 2: 2, 3: 3}
    trained = [cid for cid in range(4) if "params" in sim_state.clients.get(cid, {})]
    assert trained
    for cid in trained:
        (run_folder,) = list(stores[node_of[cid]].iterdir())
        store = NodeStore(stores[node_of[cid]], run_folder.name)
        mine = store.load(cid, before=99)["state"]
        for name, t in sim_state.clients[cid]["params"].items():
            assert torch.equal(mine["params"][name], t), (cid, name)
    # every reply a node sent: no tensor of its clients' private states (the personal models)
    private = set()
    for cid in trained:
        private |= _keys(sim_state.clients[cid])
    train_replies = [r for m, r in grid.replies if m.metadata.message_type == "train"]
    assert len(grid.lost) == 1 and len(train_replies) == 9  # 3 rounds x 3 sampled clients
    for reply in train_replies:
        _, result = decode_result(reply.content)
        assert result.momentum is None and result.params[1] == {}  # v_k stays home
        assert not _keys([result.params, result.buffers, result.upload]) & private


@pytest.fixture(scope="module")
def one_client(tmp_path_factory):
    """A client folder of 50 training samples (two mini-batches of 25)."""
    tmp = tmp_path_factory.mktemp("one")
    small = {"n_train": 100, "n_test": 20, "dim": 16, "num_classes": 4}
    over = {**SKEW, "scenario__num_clients": 2, "scenario__dataset_options": small}
    cfg = validate_config(tiny_config(tmp, **over))
    export_clients(build_scenario(cfg.scenario, cfg.seed, None), tmp / "clients")
    return tmp


@pytest.mark.parametrize("name", algorithm_names())
def test_no_reply_of_any_algorithm_holds_private_client_state(one_client, tmp_path, name):
    """Each algorithm on a node, two rounds of one client (momentum kept): the encoded reply
    (what the ClientApp sends) holds no tensor of the client's private state."""
    over = {**SKEW, "scenario__num_clients": 2, "algorithm": {"name": name}}
    cfg = validate_config(tiny_config(tmp_path, **over, train__batch_size=25))
    settings = NodeSettings(str(one_client / "clients" / "client_0"), store=str(tmp_path / "s"))
    rt = node_mod.runtime(dump_config(cfg), settings, "ab" * 8)
    algo = rt.algo
    inits = [algo.ops.init(k) for k in range(algo.num_initial_models())]
    server = algo.init_server_state(inits)
    for rnd in (1, 2):
        ctx = RoundContext(round=rnd, sampled=(0,), lr=0.05, num_clients=2)
        work = RoundWork.of(
            round=rnd, lr=0.05, momentum=0.9, weight_decay=0.0, batch_size=25, drop_last=False
        )
        job = {
            "cid": 0, "rnd": rnd, "run": "ab" * 8, "server": server,
            "ctx": {"round": rnd, "sampled": (0,), "step": 0, "lr": 0.05, "num_clients": 2},
            "work": work.to_dict(), "eval_batch": 256, "keep_momentum": True, "epochs": None,
        }  # fmt: skip
        shared = node_mod.train_job(rt, job)
        _, sent = decode_result(encode_result(shared, 0))  # what the ClientApp sends
        state = rt.store.load(0, before=rnd + 1)["state"]
        leaked = _keys([sent.params, sent.buffers, sent.upload]) & _keys(algo.private_state(state))
        assert not leaked, f"{name}: round {rnd} reply holds {len(leaked)} private tensors"
        assert sent.momentum is None
        # the server's checks take every algorithm's honest reply
        why = check_result(sent, 0, {"num_train": 50}, ModelSpec(server), 100.0)
        assert why is None, f"{name}: round {rnd}: the server would drop it: {why}"
        server = algo.aggregate(server, iter([shared]), ctx)
    node_mod.runtime.cache_clear()


def test_the_node_refuses_to_send_private_state(tmp_path, monkeypatch):
    """The guard is live: Ditto made to share its personal model is stopped at the node."""
    from fedshift.algorithms.ditto import Ditto

    cfg, _ = _exported(tmp_path, algorithm={"name": "ditto"}, scenario__num_clients=2)
    monkeypatch.setattr(Ditto, "shared_result", lambda self, task, r: keep_shared(r))
    settings = NodeSettings(str(tmp_path / "clients" / "client_0"), store=str(tmp_path / "s"))
    rt = node_mod.runtime(dump_config(cfg), settings, "cd" * 8)
    server = rt.algo.init_server_state([rt.algo.ops.init(k) for k in range(2)])
    work = RoundWork.of(lr=0.05, momentum=0.0, weight_decay=0.0, batch_size=32, drop_last=False)
    job = {
        "cid": 0, "rnd": 1, "run": "cd" * 8, "server": server,
        "ctx": {"round": 1, "sampled": (0,), "step": 0, "lr": 0.05, "num_clients": 2},
        "work": work.to_dict(), "eval_batch": 256, "keep_momentum": False, "epochs": None,
    }  # fmt: skip
    with pytest.raises(FedshiftError, match="private state"):
        node_mod.train_job(rt, job)
    node_mod.runtime.cache_clear()
    with pytest.raises(FedshiftError, match="private state"):
        check_private(replace_result(), {"v": torch.ones(3)}, 0, "x")


def replace_result():
    from fedshift.algorithms.base import ClientResult

    return ClientResult(0, 1, [{"w": torch.ones(3)}], [{}])


def test_the_store_resumes_from_the_state_before_a_round_and_drops_later_ones(tmp_path):
    store = NodeStore(tmp_path, "0123456789abcdef")
    for r in (1, 2, 3):
        store.save(5, r, {"state": {"r": torch.tensor(r)}})
    assert store.rounds(5) == [2, 3]  # the latest and the one before
    assert int(store.load(5, before=3)["state"]["r"]) == 2  # round 3 sent again: from 2
    store.save(5, 2, {"state": {"r": torch.tensor(20)}})  # a run resumed from round 1
    assert store.rounds(5) == [2] and store.load(5, before=9)["state"]["r"] == 20
    with pytest.raises(FedshiftError, match="run key"):
        NodeStore(tmp_path, "../x")


def test_the_store_keeps_client_states_private_to_the_node_user(tmp_path):
    """A client's stored states are 0600 and their folders 0700, whatever the umask."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        store = NodeStore(tmp_path / "store", "0123456789abcdef")
        store.save(5, 1, {"state": {"r": torch.tensor(1)}})
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(store.folder(5) / "round_1.pt") == 0o600
    for d in (tmp_path / "store", store.root / store.run, store.folder(5)):
        assert mode(d) == 0o700, d


def test_shared_results_reach_aggregate_in_simulation_too(tmp_path):
    """The contract: ``aggregate`` sees only ``shared_result`` (Ditto: no personal model)."""
    from fedshift.algorithms.ditto import Ditto

    seen = []
    orig = Ditto.aggregate

    def spy(self, server, results, ctx):
        def watch():
            for r in results:
                seen.append(r)
                yield r

        return orig(self, server, watch(), ctx)

    cfg = validate_config(tiny_config(tmp_path, algorithm={"name": "ditto"}, train__rounds=1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Ditto, "aggregate", spy)
        run_experiment(cfg, run_dir=tmp_path / "r")
    assert seen and all(r.params[1] == {} and r.momentum is None for r in seen)
    assert keep_shared(seen[0], names={0: ()}).params[0] == {}


def test_a_deployment_refuses_what_it_cannot_measure(tmp_path):
    with pytest.raises(ConfigError, match="eval.personal"):
        check_deployable(validate_config(tiny_config(tmp_path, eval__personal="active")))
    with pytest.raises(ConfigError, match="validation"):
        check_deployable(validate_config(tiny_config(tmp_path, scenario__validation_fraction=0.1)))
    check_deployable(validate_config(tiny_config(tmp_path, train__clip_updates="median")))


@pytest.mark.usefixtures("task_identity")
def test_simulated_and_own_data_nodes_do_not_mix(tmp_path):
    _exported(tmp_path)
    cfg = validate_config(tiny_config(tmp_path, **SKEW))
    grid = InProcessNodes(
        app, {1: {"data": str(tmp_path / "clients")}, 2: {"partition-id": 0, "num-partitions": 1}}
    )
    with pytest.raises(FedshiftError, match="simulated clients"):
        serve_deployed(grid, ServerRun(cfg, run_dir=str(tmp_path / "d")), wait_s=2)
    # the ServerApp asks the first node to answer which kind of run this is
    own = InProcessNodes(app, {1: {"data": str(tmp_path / "clients")}})
    simulated = InProcessNodes(app, {2: {"partition-id": 0, "num-partitions": 1}})
    assert nodes_hold_own_data(own, wait_s=2) and not nodes_hold_own_data(simulated, wait_s=2)
    small = validate_config(tiny_config(tmp_path, **{**SKEW, "scenario__num_clients": 2}))
    grid = InProcessNodes(app, {1: {"data": str(tmp_path / "clients")}})
    with pytest.raises(ConfigError, match="beyond scenario.num_clients"):
        serve_deployed(grid, ServerRun(small, run_dir=str(tmp_path / "e")), wait_s=2)


@pytest.mark.usefixtures("task_identity")
def test_a_node_whose_folder_breaks_is_one_line_at_the_server(tmp_path):
    """A folder that passed ``fedshift deploy node`` but is broken when the ClientApp reads it:
    the server stops with the node's one line, naming the file and the fix."""
    cfg, _ = _exported(tmp_path)
    broken = tmp_path / "clients" / "client_1" / "train.npz"
    broken.write_bytes(b"")
    node_mod.node_clients.cache_clear()
    grid = InProcessNodes(app, {n: {"data": str(tmp_path / "clients" / f"client_{n - 1}")}
                                for n in (1, 2, 3, 4)})  # fmt: skip
    with pytest.raises(FedshiftError) as err:
        serve_deployed(grid, ServerRun(cfg, run_dir=str(tmp_path / "d")), wait_s=2)
    line = str(err.value)
    assert "\n" not in line and f"Flower node 2: FedshiftError: {broken}: is empty" in line
    assert "fedshift export" in line


def test_cli_exports_clients_and_refuses_insecure_remote_connections(tmp_path, monkeypatch):
    """``fedshift export`` writes one folder per client; ``fedshift deploy`` refuses an
    unencrypted connection off the loopback (one line, exit code 2) before Flower starts."""
    import yaml
    from typer.testing import CliRunner

    from fedshift.cli import app as cli_app

    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(tmp_path, **SKEW)))

    def call(*args):
        return CliRunner().invoke(cli_app, [str(a) for a in args])

    res = call("export", cfg, tmp_path / "out")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"client_{i}" for i in range(4)]
    data = tmp_path / "out" / "client_0"
    res = call("deploy", "node", "--data", data, "--superlink", "10.1.2.3:8000", "--insecure")
    assert res.exit_code == 2 and "clear text" in res.output
    res = call("deploy", "node", "--data", data, "--superlink", "10.1.2.3:8000")
    assert res.exit_code == 2 and "needs TLS" in res.output
    res = call("deploy", "superlink", "--host", "0.0.0.0", "--insecure")
    assert res.exit_code == 2 and "clear text" in res.output
    res = call("deploy", "node", "--data", tmp_path / "none", "--insecure")
    assert res.exit_code == 2 and "no such folder" in res.output


@pytest.mark.signals
def test_a_restarted_node_keeps_trying_until_the_superlink_lets_it_in(tmp_path, monkeypatch):
    """Flower's SuperNode exits (status 1) while the SuperLink holds its previous instance;
    ``fedshift deploy node`` starts it again (here: refused twice, then it runs). Refused until
    its time is up, it names both causes; refused longer than a previous instance is held
    (issue 40, case 12), it says the key is not registered."""
    import sys

    import typer

    from fedshift.cli import deploy as deploy_cli
    from fedshift.flower.deploy import launch

    monkeypatch.setattr(launch, "RETRY_PAUSE_S", 0.0)
    count = tmp_path / "count"
    # refused twice, each time leaving a child that holds its output open (Flower's
    # SuperExec outlives a SuperNode that was not let in)
    script = (
        "import pathlib, subprocess, sys; p = pathlib.Path(sys.argv[1]); "
        "n = int(p.read_text() or 0) + 1 if p.exists() else 1; p.write_text(str(n)); "
        "n < 3 and subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"print({launch.NOT_ACTIVATED!r} if n < 3 else 'running'); sys.exit(1 if n < 3 else 0)"
    )
    deploy_cli.start([sys.executable, "-c", script, str(count)], retry_s=60, key="k/node1")
    assert count.read_text() == "3"
    count.unlink()
    with pytest.raises(FedshiftError) as err:  # no retries left: both causes and both fixes
        deploy_cli.start([sys.executable, "-c", script, str(count)], retry_s=0, key="k/node1")
    assert "its key k/node1 is not registered, or the node's previous instance" in str(err.value)
    assert "fedshift deploy register k/node1.pub" in str(err.value)
    assert "--retry-s" in str(err.value)
    count.unlink()
    # refused for longer than the SuperLink holds a stopped node: the key is not registered
    monkeypatch.setattr(launch, "HOLD_S", 0.3)
    monkeypatch.setattr(launch, "RETRY_PAUSE_S", 0.2)
    never = f"print({launch.NOT_ACTIVATED!r}); raise SystemExit(1)"
    with pytest.raises(FedshiftError) as err:
        deploy_cli.start([sys.executable, "-c", never], retry_s=90, key="k/node1")
    assert "longer than it holds a stopped node (60 s): the key is not registered" in str(err.value)
    with pytest.raises(typer.Exit):  # another failure is the node's exit code, as before
        deploy_cli.start([sys.executable, "-c", "raise SystemExit(3)"], retry_s=90, key="k/node1")


def test_a_saved_hugging_face_dataset_is_a_client(tmp_path):
    """A node's data may be a ``DatasetDict.save_to_disk`` folder (train and test splits)."""
    datasets = require_extra("datasets", "hub")
    rng = np.random.default_rng(0)
    feats = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=3)}
    )

    def split(n):
        imgs = [rng.integers(0, 255, (8, 8, 3), dtype=np.uint8) for _ in range(n)]
        return datasets.Dataset.from_dict(
            {"image": imgs, "label": [i % 3 for i in range(n)]}, features=feats
        )

    folder = tmp_path / "hf"
    datasets.DatasetDict({"train": split(6), "test": split(2)}).save_to_disk(str(folder))
    (folder / "client.json").write_text(json.dumps({"cid": 4}))
    (c,) = read_clients(folder)
    assert (c.cid, c.num_classes, c.input_shape, c.x_train.shape) == (4, 3, (3, 8, 8), (6, 8, 8, 3))
    assert c.y_train.tolist() == [0, 1, 2, 0, 1, 2] and len(c.y_test) == 2


@pytest.mark.signals
@pytest.mark.parametrize("background", [pytest.param(False, marks=pytest.mark.foreground), True])
def test_stopping_fedshift_deploy_stops_the_flower_process_it_started(tmp_path, background):
    """SIGTERM to ``fedshift deploy node`` ends its SuperNode's process group too (it runs in
    a session of its own, so no signal would reach it otherwise) and exits with 130; also when
    started as a background job, where SIGINT is ignored by fedshift and the process alike."""
    import os
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "child.pid"
    child = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    code = (  # as the CLI runs it: typer turns Exit into the exit code
        ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n" if background else "")
        + "import sys, typer; from fedshift.cli import deploy as deploy_cli\n"
        f"try: deploy_cli.start([sys.executable, '-c', {child!r}])\n"
        "except typer.Exit as e: sys.exit(e.exit_code)"
    )
    wrapper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (marker.is_file() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(marker.read_text())
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=20) == 130
    for _ in range(100):  # the child's group got SIGTERM
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the started process outlived `fedshift deploy`")
