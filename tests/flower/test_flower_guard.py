"""The SuperLink's guard (issue 40, case 1): Flower serves its Fleet, Control and runtime APIs on
one port and does not authenticate the Control API, so ``fedshift deploy superlink`` puts a
layer in front that serves the Control and runtime APIs only to the operator's addresses.

The ASGI layer is tested on its own (any address, any path); then a real SuperLink with TLS and
node authentication, reached through this machine's non-loopback address (another address than
the operator's loopback): a node registration and a run submission are refused there and
accepted through the loopback, and a SuperNode still comes online through it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.conftest import require_extra

require_extra("flwr", "flower")

from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.flower.deploy import guard  # noqa: E402
from fedshift.flower.deploy.launch import CONNECTION, flower_command, flower_env  # noqa: E402
from fedshift.flower.security import flower_connection_toml, make_certificates  # noqa: E402

OUTSIDE = "192.0.2.77"  # a documentation address: never this machine's


def _call(networks, path: str, address: str | None, kind: str = "http") -> tuple[list, list]:
    """Send one request through ``app``; (what it sent back, the paths the inner app saw)."""
    seen, sent = [], []

    async def inner(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request"}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "client": (address, 5000) if address else None}
    asyncio.run(guard.OperatorOnly(inner, networks)(scope, receive, send))
    return sent, seen


@pytest.mark.parametrize(
    "path, address, served",
    [
        ("/v1/fleet/activate-node", OUTSIDE, True),  # what a node calls: everyone (after TLS)
        ("/v1/fleet/pull-messages", "2001:db8::5", True),
        ("/health", OUTSIDE, True),
        ("/v1/control/register-node", OUTSIDE, False),  # admitting a key: the operator only
        ("/v1/control/start-run", OUTSIDE, False),  # a run every node executes
        ("/v1/control/unregister-node", OUTSIDE, False),
        ("/v1/runtime/pull-task-input", OUTSIDE, False),
        ("/docs", OUTSIDE, False),
        ("/v1/fleetx/register-node", OUTSIDE, False),  # a prefix, not a look-alike
        ("/v1/control/start-run", None, False),  # no peer address: refused
        ("/v1/control/start-run", "not-an-ip", False),
        ("/v1/control/start-run", "127.0.0.1", True),
        ("/v1/control/start-run", "127.8.9.1", True),
        ("/v1/control/start-run", "::1", True),
        ("/v1/control/start-run", "::ffff:127.0.0.1", True),
        ("/v1/runtime/pull-task-input", "10.1.2.3", True),  # the SuperLink's own --host
        ("/v1/control/list-runs", "10.9.0.4", True),  # an --operator network
        ("/v1/control/list-runs", "10.9.1.4", False),
    ],
)
def test_only_the_fleet_api_answers_every_address(path, address, served):
    networks = guard.operator_networks("10.1.2.3", ["10.9.0.0/24"])
    sent, seen = _call(networks, path, address)
    assert (seen == [path]) is served
    if not served:
        assert sent[0]["status"] == 403
        detail = json.loads(sent[1]["body"])["detail"]
        assert path in detail and "--operator" in detail


def test_a_wildcard_host_adds_no_operator_and_websockets_are_guarded_too():
    assert guard.operator_networks("0.0.0.0") == guard.LOOPBACK
    assert guard.operator_networks("::") == guard.LOOPBACK
    assert guard.operator_networks("superlink.example.org") == guard.LOOPBACK
    sent, seen = _call(guard.LOOPBACK, "/v1/control/stream-logs", OUTSIDE, kind="websocket")
    assert not seen and sent[0]["type"] == "websocket.close" and sent[0]["code"] == 1008


def test_the_guard_command_line_and_its_errors():
    ops, rest = guard.split_argv(["--operator", "10.0.0.5", "--host", "0.0.0.0", "--operator=::1"])
    assert ops == ["10.0.0.5", "::1"] and rest == ["--host", "0.0.0.0"]
    assert guard.flower_host(rest) == "0.0.0.0" and guard.flower_host([]) == "127.0.0.1"
    argv = guard.guarded_argv(["flower-superlink", "--insecure"], ["10.0.0.0/8"])
    assert argv[1:] == ["-m", "fedshift.flower.deploy.guard", "--operator", "10.0.0.0/8",
                        "--insecure"]  # fmt: skip
    for bad in (["admin.example.org"], ["10.0.0.0/99"]):
        with pytest.raises(FedshiftError, match="not an IP address or network"):
            guard.guarded_argv(["flower-superlink"], bad)
    with pytest.raises(FedshiftError, match="needs an address"):
        guard.split_argv(["--operator"])


def test_the_guard_refuses_a_flower_that_starts_its_superlink_differently():
    with pytest.raises(FedshiftError, match="does not know"):
        guard.install(types.ModuleType("flower_superlink"), guard.LOOPBACK)
    served = []
    cli = types.ModuleType("flower_superlink")
    cli.flower_superlink = lambda: None
    cli.uvicorn = types.SimpleNamespace(run=lambda app, **kw: served.append((app, kw)))
    guard.install(cli, guard.LOOPBACK)
    cli.uvicorn.run("flower-app", host="0.0.0.0", proxy_headers=True)
    (app, kw), = served  # fmt: skip
    assert isinstance(app, guard.OperatorOnly) and app.app == "flower-app"
    assert kw == {"host": "0.0.0.0", "proxy_headers": False}  # no X-Forwarded-For spoofing


# ---------------------------------------------------------------- a real SuperLink


def _outside_address() -> str | None:
    """This machine's address on its default route (not the loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flwr(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**flower_env(), "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.run([flower_command("flwr"), *args], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def _wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {seconds:g} s")
        time.sleep(0.3)


@pytest.fixture
def superlink(tmp_path):
    """A guarded SuperLink (TLS, node authentication) on every interface; (certs, port,
    this machine's outside address, its log)."""
    outside = _outside_address()
    if outside is None:  # CI machines have one (they reach the package registries)
        pytest.fail("this machine has no address but the loopback to reach the SuperLink from")
    certs, port = tmp_path / "certs", _free_port()
    make_certificates(certs, ["127.0.0.1", outside], nodes=2)
    log = tmp_path / "superlink.log"
    env = {**flower_env(), "FLWR_TELEMETRY_ENABLED": "0"}
    argv = [sys.executable, "-m", "fedshift.cli", "deploy", "superlink", "--certs", str(certs),
            "--host", "0.0.0.0", "--port", str(port)]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        _wait_for(lambda: "Uvicorn running" in log.read_text(), 60, "the SuperLink did not start")
        yield certs, port, outside, log
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def _home(root: Path, name: str, address: str, ca: Path) -> Path:
    home = root / name
    home.mkdir()
    (home / "config.toml").write_text(flower_connection_toml(CONNECTION, address, str(ca), False))
    return home


def test_node_registration_and_runs_from_another_address_are_refused(superlink, tmp_path):
    certs, port, outside, log = superlink
    ca = certs / "ca.crt"
    remote = _home(tmp_path, "remote", f"{outside}:{port}", ca)
    local = _home(tmp_path, "local", f"127.0.0.1:{port}", ca)

    res = _flwr(remote, "supernode", "register", str(certs / "node1.pub"), CONNECTION)
    assert res.returncode != 0 and f"refused /v1/control/register-node from {outside}" in (
        res.stdout + res.stderr
    ).replace("\n", " ").replace("│", " ").replace("  ", " ")
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(
        '[project]\nname = "evil"\nversion = "1.0.0"\n[tool.flwr.app]\npublisher = "x"\n'
        '[tool.flwr.app.components]\nserverapp = "x:a"\nclientapp = "x:b"\n'
    )
    (app / "x.py").write_text("a = b = None\n")
    res = _flwr(remote, "run", str(app), CONNECTION)
    assert res.returncode != 0
    assert "refused /v1/control/start-run" in log.read_text()

    res = _flwr(local, "supernode", "register", str(certs / "node0.pub"), CONNECTION)
    assert res.returncode == 0, res.stdout + res.stderr
    text = log.read_text()
    assert "127.0.0.1" in text and "refused /v1/control/register-node from 127" not in text

    # the Fleet API still answers the outside address: node0's registered key comes online
    (tmp_path / "client").mkdir()
    node = subprocess.Popen(
        [flower_command("flower-supernode"), "--superlink", f"{outside}:{port}",
         "--root-certificates", str(ca), "--auth-supernode-private-key", str(certs / "node0"),
         "--port", str(_free_port())],
        env={**flower_env(), "FLWR_TELEMETRY_ENABLED": "0"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(
            lambda: f'{outside}:' in log.read_text() and "/v1/fleet/activate-node HTTP/1.1\" 200"
            in log.read_text(), 60, "node0 did not come online through the outside address",
        )  # fmt: skip
        listed = _flwr(local, "supernode", "list", CONNECTION, "--format", "json")
        assert listed.returncode == 0 and '"online"' in listed.stdout.lower()
    finally:
        os.killpg(node.pid, 15)
        node.wait(timeout=30)
