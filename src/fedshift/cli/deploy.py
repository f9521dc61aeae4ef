"""``fedshift deploy``: a real Flower deployment from the command line, secure by default.

- ``certs``: a private CA, the SuperLink's TLS certificate and SuperNode keys, and a Flower
  configuration (``<certs>/flwr/config.toml``) naming the SuperLink;
- ``superlink``: Flower's SuperLink with TLS and SuperNode authentication, its Control API
  (runs, node registration) answering only its own machine
  (:mod:`fedshift.flower.deploy.guard`);
- ``register``: admit SuperNode public keys to the federation (authentication);
- ``node``: a SuperNode that trains and scores the clients of its own data folder (made by
  ``fedshift export``); its clients' states stay in its store;
- ``run``: a fedshift config as a Flower run on that SuperLink.

A connection without TLS is allowed only to a loopback address (``--insecure``); across a
network it needs ``--allow-insecure-remote`` as well. Each command starts Flower's own
process (``flower-superlink``, ``flower-supernode``, ``flwr``) from this Python environment.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from fedshift.cli.console import console, user_errors
from fedshift.core.files import ensure_writable_dir
from fedshift.flower.deploy.launch import (
    APP_TOML,
    CONNECTION,
    flower_command,
    flower_env,
    toml_value,
)
from fedshift.flower.deploy.launch import (
    start as flower_start,
)

deploy_app = typer.Typer(help="A real Flower deployment: TLS, node authentication, own data.")
Opt = typer.Option
Certs = Annotated[str | None, Opt(help="folder of `fedshift deploy certs` (TLS and keys)")]
Insecure = Annotated[bool, Opt(help="no TLS (loopback addresses only, unless allowed below)")]
Remote = Annotated[bool, Opt(help="allow --insecure to a non-loopback address")]
Superlink = Annotated[str, Opt(help="the SuperLink's address, host:port")]


def _root(certs: str | None, root_certificates: str | None) -> str | None:
    if root_certificates:
        return root_certificates
    return None if certs is None else str(Path(certs).expanduser() / "ca.crt")


def start(
    argv: list[str],
    env: dict[str, str] | None = None,
    retry_s: float = 0.0,
    key: str | None = None,
) -> None:
    """Flower's command, its lines on the console; its failure is this command's exit code."""
    say = lambda line: console.print(line, highlight=False, soft_wrap=True)  # noqa: E731
    code = flower_start(argv, env, retry_s, say=say, key=key)
    if code != 0:
        raise typer.Exit(code)  # 130: interrupted (Ctrl-C, SIGTERM)


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
    home = ensure_writable_dir(
        Path(out) / "flwr", "Flower configuration folder", "move that file away"
    )
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
    operator: Annotated[
        list[str] | None,
        Opt(help="an address or network also allowed the Control API (default: this machine)"),
    ] = None,
) -> None:
    """Start Flower's SuperLink: TLS, SuperNode authentication (or --insecure), and its Control
    API (runs, node registration) answering only this machine (and --operator addresses)."""
    from fedshift.flower.deploy.guard import guarded_argv
    from fedshift.flower.security import superlink_argv

    path = None if certs is None else Path(certs)
    exe = flower_command("flower-superlink")
    flower = superlink_argv(path, insecure, host, port, None, database, exe, allow_insecure_remote)
    start(guarded_argv(flower, operator or ()))


@deploy_app.command("register")
@user_errors
def register(
    keys: Annotated[list[str], typer.Argument(help="SuperNode public keys (nodeN.pub)")],
    certs: Annotated[str, Opt(help="folder of `fedshift deploy certs`")],
) -> None:
    """Admit SuperNodes to the federation by their public keys (a running SuperLink)."""
    env = {**flower_env(), "FLWR_HOME": str(Path(certs).expanduser().resolve() / "flwr")}
    for key in keys:
        start([flower_command("flwr"), "supernode", "register", key, CONNECTION], env)


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
        90.0,
        help="seconds to keep trying while the SuperLink will not activate the node (a "
        "restarted node's previous instance is held up to 60 s)",
    ),  # fmt: skip
) -> None:
    """Start a Flower SuperNode that trains on its own data folder."""
    from fedshift.flower.deploy.node import NodeSettings, describe
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
                          flower_command("flower-supernode"))  # fmt: skip
    start(argv, retry_s=retry_s, key=key)


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
    from fedshift.cli.console import load
    from fedshift.config import dump_config
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
        run_config = " ".join(f"{k}={toml_value(v)}" for k, v in values.items())
        argv = [flower_command("flwr"), "run", str(app), CONNECTION, "--stream", "-c", run_config]
        start(argv, {**flower_env(), "FLWR_HOME": str(home)})
