"""``fedshift deploy``: a real Flower deployment from the command line, secure by default.

- ``certs``: a private CA, the SuperLink's TLS certificate and SuperNode keys, and a Flower
  configuration (``<certs>/flwr/config.toml``) naming the SuperLink;
- ``superlink``: Flower's SuperLink with TLS and SuperNode authentication;
- ``register``: admit SuperNode public keys to the federation (authentication);
- ``node``: a SuperNode that trains and scores the clients of its own data folder (made by
  ``fedshift export``); its clients' states stay in its store;
- ``run``: a fedshift config as a Flower run on that SuperLink.

A connection without TLS is allowed only to a loopback address (``--insecure``); across a
network it needs ``--allow-insecure-remote`` as well. Each command starts Flower's own
process (``flower-superlink``, ``flower-supernode``, ``flwr``) from this Python environment.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from fedshift.console import console, user_errors
from fedshift.errors import FedshiftError

deploy_app = typer.Typer(help="A real Flower deployment: TLS, node authentication, own data.")
Opt = typer.Option
Certs = Annotated[str | None, Opt(help="folder of `fedshift deploy certs` (TLS and keys)")]
Insecure = Annotated[bool, Opt(help="no TLS (loopback addresses only, unless allowed below)")]
Remote = Annotated[bool, Opt(help="allow --insecure to a non-loopback address")]
Superlink = Annotated[str, Opt(help="the SuperLink's address, host:port")]
CONNECTION = "fedshift"

APP_TOML = """[project]
name = "fedshift-deployment"
version = "0.1.0"
dependencies = []

[tool.flwr.app]
publisher = "fedshift"

[tool.flwr.app.components]
serverapp = "fedshift.flower.server_app:app"
clientapp = "fedshift.flower.client_app:app"

[tool.flwr.app.config]
fedshift-config = ""
fedshift-overrides = ""
run-dir = ""
overwrite = false
resume = false
wait-s = 300.0
resend-s = 600.0
"""


def _exe(name: str) -> str:
    """Flower's command ``name`` from this environment (else from PATH)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else name


def _env() -> dict[str, str]:
    """This environment's scripts first on PATH: Flower starts ``flwr-clientapp`` and
    ``flwr-serverapp`` processes by name."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


#: what Flower's SuperNode prints when the SuperLink will not activate it (its exit code 305,
#: exit status 1): after a restart, the SuperLink holds the node's previous instance until its
#: heartbeat expires (about a minute)
NOT_ACTIVATED = "Failed to activate SuperNode"
RETRY_PAUSE_S = 10.0


def _call(argv: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """Run ``argv`` in a process group of its own, its output passed through; (exit status,
    whether the SuperLink would not activate it). When it ends, what it started ends too
    (Flower's SuperExec would otherwise outlive a SuperNode that was not let in, holding its
    output open and trying its port for ever); Ctrl-C is passed on to it."""
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    refused = threading.Event()

    def pump() -> None:
        for line in proc.stdout or ():
            sys.stdout.write(line)
            sys.stdout.flush()
            if NOT_ACTIVATED in line:
                refused.set()

    def stop(signum, frame) -> None:  # noqa: ARG001 - SIGTERM ends the command's process too
        raise KeyboardInterrupt

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    before = signal.signal(signal.SIGTERM, stop)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        _end(proc)
        raise
    finally:
        signal.signal(signal.SIGTERM, before)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    reader.join(timeout=2.0)
    return code, refused.is_set()


def _end(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop ``proc``'s process group: Ctrl-C first (Flower's commands shut down cleanly on it),
    SIGTERM after ``grace_s``, SIGKILL after as long again. A command started from a background
    job inherits an ignored SIGINT, so there SIGTERM comes first."""
    first = signal.SIGTERM if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else signal.SIGINT
    for sig in dict.fromkeys((first, signal.SIGTERM, signal.SIGKILL)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _start(argv: list[str], env: dict[str, str] | None = None, retry_s: float = 0.0) -> None:
    """Run Flower's command; while the SuperLink will not activate it (a restarted node),
    start it again for up to ``retry_s`` seconds."""
    console.print("$ " + shlex.join(argv), highlight=False, soft_wrap=True)
    deadline = time.monotonic() + retry_s
    try:
        code, refused = _call(argv, env or _env())
        while code and refused and time.monotonic() < deadline:
            console.print("the SuperLink still holds this node's previous instance (until its "
                          f"heartbeat expires): trying again in {RETRY_PAUSE_S:g} s")  # fmt: skip
            time.sleep(RETRY_PAUSE_S)
            code, refused = _call(argv, env or _env())
    except KeyboardInterrupt:
        code = 130
    except FileNotFoundError:
        raise FedshiftError(f"{argv[0]} not found: pip install 'fedshift[flower]'") from None
    if code != 0:
        raise typer.Exit(code)  # 130: interrupted (Ctrl-C, SIGTERM)


def _root(certs: str | None, root_certificates: str | None) -> str | None:
    if root_certificates:
        return root_certificates
    return None if certs is None else str(Path(certs).expanduser() / "ca.crt")


@deploy_app.command("certs")
@user_errors
def certs(
    out: Annotated[str, typer.Argument(help="folder for the certificates and keys")],
    nodes: int = Opt(3, help="SuperNode key pairs to make (node0, node1, ...)"),
    host: Annotated[list[str] | None, Opt(help="the SuperLink's host names/IPs")] = None,
    superlink: Superlink = "127.0.0.1:8000",
    overwrite: bool = Opt(False, help="replace an existing CA"),
) -> None:
    """Make a CA, the SuperLink's certificate, SuperNode keys and a Flower configuration."""
    from fedshift.flower.security import flower_connection_toml, make_certificates

    files = make_certificates(
        Path(out), host or ["127.0.0.1", "localhost"], nodes, overwrite=overwrite
    )
    home = Path(out) / "flwr"
    home.mkdir(exist_ok=True)
    toml = flower_connection_toml(CONNECTION, superlink, str(files["ca"]), insecure=False)
    (home / "config.toml").write_text(toml)
    for name, path in files.items():
        console.print(f"{name}: {path}", highlight=False)
    console.print(f"Flower configuration: {home / 'config.toml'} (connection '{CONNECTION}')")


@deploy_app.command("superlink")
@user_errors
def superlink(
    certs: Certs = None,
    insecure: Insecure = False,
    allow_insecure_remote: Remote = False,
    host: str = Opt("127.0.0.1", help="address the SuperLink listens on"),
    port: int = Opt(8000, help="its port (Fleet, Control and ServerAppIo APIs)"),
    database: str | None = Opt(None, help="a file for the SuperLink's state (default: memory)"),
) -> None:
    """Start Flower's SuperLink: TLS and SuperNode authentication (or --insecure)."""
    from fedshift.flower.security import superlink_argv

    path = None if certs is None else Path(certs)
    exe = _exe("flower-superlink")
    _start(superlink_argv(path, insecure, host, port, None, database, exe, allow_insecure_remote))


@deploy_app.command("register")
@user_errors
def register(
    keys: Annotated[list[str], typer.Argument(help="SuperNode public keys (nodeN.pub)")],
    certs: Annotated[str, Opt(help="folder of `fedshift deploy certs`")],
) -> None:
    """Admit SuperNodes to the federation by their public keys (a running SuperLink)."""
    env = {**_env(), "FLWR_HOME": str(Path(certs).expanduser().resolve() / "flwr")}
    for key in keys:
        _start([_exe("flwr"), "supernode", "register", key, CONNECTION], env)


@deploy_app.command("node")
@user_errors
def node(
    data: Annotated[str, Opt(help="this node's data: a client folder or a folder of them")],
    superlink: Superlink = "127.0.0.1:8000",
    certs: Certs = None,
    key: str | None = Opt(None, help="this node's private key (e.g. CERTS/node0)"),
    root_certificates: str | None = Opt(None, help="the CA certificate (default: CERTS/ca.crt)"),
    insecure: Insecure = False,
    allow_insecure_remote: Remote = False,
    port: int = Opt(9094, help="this node's own API port (one per node on a machine)"),
    store: str | None = Opt(
        None, help="where client states are kept (default: DATA/.fedshift-node)"
    ),
    shift: str | None = Opt(None, help="a feature style to apply here, e.g. rotate:90"),
    labels: str | None = Opt(None, help="a label map to apply here, e.g. reverse"),
    client_id: int | None = Opt(None, help="the client id of a folder that does not say it"),
    device: str | None = Opt(None, help="e.g. cpu, cuda:1"),
    retry_s: float = Opt(
        180.0, help="seconds to keep trying while the SuperLink will not activate a restarted node"
    ),  # fmt: skip
) -> None:
    """Start a Flower SuperNode that trains on its own data folder."""
    from fedshift.flower.node import NodeSettings, describe
    from fedshift.flower.security import supernode_argv

    settings = NodeSettings(
        str(Path(data).expanduser().resolve()), shift, labels, client_id, store, device
    )
    info = describe(settings)  # a bad folder is reported before Flower starts
    cids = ", ".join(str(c["cid"]) for c in info["clients"])
    console.print(f"node data {settings.data}: clients {cids}")
    config = {k: v for k, v in {
        "data": settings.data, "shift": shift, "labels": labels, "client-id": client_id,
        "store": str(Path(store).expanduser().resolve()) if store else None, "device": device,
    }.items() if v is not None}  # fmt: skip
    root = None if insecure else _root(certs, root_certificates)
    argv = supernode_argv(superlink, config, root, key, insecure, port, allow_insecure_remote,
                          _exe("flower-supernode"))  # fmt: skip
    _start(argv, retry_s=retry_s)


@deploy_app.command("run")
@user_errors
def run(
    config: Annotated[str, typer.Argument(help="YAML config")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key=value overrides")] = None,
    run_dir: str = Opt(..., help="the run directory (on the SuperLink's machine)"),
    superlink: Superlink = "127.0.0.1:8000",
    certs: Certs = None,
    root_certificates: str | None = Opt(None, help="the CA certificate (default: CERTS/ca.crt)"),
    insecure: Insecure = False,
    allow_insecure_remote: Remote = False,
    overwrite: bool = Opt(False, help="replace an existing run directory"),
    resume: bool = Opt(False, help="continue the run in --run-dir"),
    wait_s: float = Opt(300.0, help="seconds to wait for the nodes"),
    resend_s: float = Opt(600.0, help="seconds without a reply before a job is sent again"),
) -> None:
    """Run a fedshift config on a SuperLink's nodes (a deployment when they hold own data)."""
    from fedshift.config import dump_config
    from fedshift.console import load
    from fedshift.flower.security import check_transport, flower_connection_toml

    cfg = load(config, overrides, None)
    root = None if insecure else _root(certs, root_certificates)
    check_transport(superlink, root, insecure, allow_insecure_remote)
    with tempfile.TemporaryDirectory(prefix="fedshift-app-") as tmp:
        app, home = Path(tmp) / "app", Path(tmp) / "flwr"
        app.mkdir()
        home.mkdir()
        (app / "pyproject.toml").write_text(APP_TOML)
        (app / "fedshift.yaml").write_text(dump_config(cfg))  # travels in the app's bundle
        (home / "config.toml").write_text(
            flower_connection_toml(CONNECTION, superlink, root, insecure)
        )
        values = {
            "fedshift-config": "fedshift.yaml", "run-dir": str(Path(run_dir).resolve()),
            "overwrite": overwrite, "resume": resume, "wait-s": wait_s, "resend-s": resend_s,
        }  # fmt: skip
        run_config = " ".join(f"{k}={_toml(v)}" for k, v in values.items())
        argv = [_exe("flwr"), "run", str(app), CONNECTION, "--stream", "-c", run_config]
        _start(argv, {**_env(), "FLWR_HOME": str(home)})


def _toml(value: object) -> str:
    """A run-config value as TOML (strings as basic strings, newlines escaped)."""
    import json

    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else json.dumps(str(value))
