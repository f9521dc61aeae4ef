"""The SuperLink that ``fedshift deploy superlink`` starts: Flower's own, with its operator's
APIs answering only the operator.

Flower 1.41 serves three APIs on the SuperLink's one HTTP port: the Fleet API (what SuperNodes
call: ``/v1/fleet/...``), the Control API (``flwr run``, ``flwr supernode register``, ``flwr
ls``, ...: ``/v1/control/...``) and the runtime API of its ServerApp processes
(``/v1/runtime/...``). An open-source SuperLink does not authenticate the Control API, so
anyone who reaches the port (every node must) could register a node key of their own,
unregister the operator's nodes, or submit a run whose code every node then executes.

fedshift therefore starts Flower's SuperLink in a process of its own (``python -m
fedshift.flower.deploy.guard``) with one ASGI layer in front of Flower's application
(:class:`OperatorOnly`): requests to the Fleet API and the health check are served to anyone
who completes TLS (node authentication is Flower's, by registered keys); every other path only
to the operator's addresses: this machine's loopback, the SuperLink's own ``--host`` when it
names one address (its ServerApp processes connect there), and the networks given with
``--operator``. A refused request gets HTTP 403 with a line saying why, and the SuperLink's
console one warning line naming the address and the path. The client address is the TCP peer
(proxy headers are not honoured).

The layer is installed where Flower's command hands its application to uvicorn; if a Flower
release starts its SuperLink differently, the guard refuses to start rather than run without
it (fedshift pins the Flower it was tested with).
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import sys
import types
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from fedshift.core.errors import FedshiftError

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Any]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: paths served to every address: the Fleet API (SuperNodes) and the health check
OPEN_PREFIXES = ("/v1/fleet/", "/health")
#: this machine only
LOOPBACK: tuple[Network, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)
OPERATOR_FLAG = "--operator"
#: the module of Flower's ``flower-superlink`` command
FLOWER_MODULE = "flwr.superlink.cli.flower_superlink"

logger = logging.getLogger("flwr")


def parse_network(text: str) -> Network:
    """An ``--operator`` value: an address (``10.0.0.5``) or a network (``10.0.0.0/24``)."""
    try:
        return ipaddress.ip_network(text.strip().strip("[]"), strict=False)
    except ValueError:
        raise FedshiftError(
            f"--operator {text!r} is not an IP address or network: give e.g. 10.0.0.5 or "
            "10.0.0.0/24 (host names are not resolved)"
        ) from None


def operator_networks(host: str, extra: Iterable[str] = ()) -> tuple[Network, ...]:
    """The addresses the operator's APIs answer: the loopback, the SuperLink's ``host`` when it
    is one address (not a wildcard such as 0.0.0.0 or ::) and the ``extra`` networks."""
    nets = list(LOOPBACK)
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None  # a host name: its ServerApp processes connect through the loopback
    if ip is not None and not ip.is_unspecified:
        nets.append(ipaddress.ip_network(ip))
    return tuple(nets) + tuple(parse_network(x) for x in extra)


def is_open(path: str) -> bool:
    """Whether every address may call ``path`` (the Fleet API and the health check)."""
    return any(path == p.rstrip("/") or path.startswith(p) for p in OPEN_PREFIXES)


def is_operator(address: str | None, networks: Sequence[Network]) -> bool:
    """Whether a request from ``address`` (the TCP peer; None when unknown) is the operator's."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return any(ip.version == n.version and ip in n for n in networks)


def refusal(path: str, address: str | None) -> str:
    """The line a refused request gets (and the SuperLink's console shows)."""
    return (
        f"fedshift guard: refused {path} from {address or 'an unknown address'}: this SuperLink "
        "answers its Control and runtime APIs only on its own machine (connect through "
        "127.0.0.1 there), or to addresses given with `fedshift deploy superlink --operator`"
    )


class OperatorOnly:
    """ASGI middleware: the Fleet API and health check for everyone, every other HTTP or
    WebSocket path only for the operator's ``networks``."""

    def __init__(self, app: ASGIApp, networks: Sequence[Network]) -> None:
        self.app, self.networks = app, tuple(networks)

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket") and not is_open(scope.get("path", "")):
            client = scope.get("client")
            address = client[0] if client else None
            if not is_operator(address, self.networks):
                line = refusal(scope.get("path", ""), address)
                logger.warning(line)
                await _refuse(scope, receive, send, line)
                return
        await self.app(scope, receive, send)


async def _refuse(scope: Scope, receive, send, line: str) -> None:
    """Answer 403 with ``{"detail": line}`` (a WebSocket is closed with policy violation)."""
    if scope["type"] == "websocket":
        await receive()  # the connect event
        await send({"type": "websocket.close", "code": 1008, "reason": line[:120]})
        return
    body = ('{"detail": ' + _json_string(line) + "}").encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _json_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the ``--operator`` values, Flower's own arguments) of the guard's command line."""
    operators, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == OPERATOR_FLAG:
            if i + 1 >= len(argv):
                raise FedshiftError("--operator needs an address or network")
            operators.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(OPERATOR_FLAG + "="):
            operators.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return operators, rest


def flower_host(flower_args: Sequence[str]) -> str:
    """The ``--host`` among Flower's SuperLink arguments (Flower's default 127.0.0.1)."""
    for i, arg in enumerate(flower_args):
        if arg == "--host" and i + 1 < len(flower_args):
            return flower_args[i + 1]
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
    return "127.0.0.1"


def guarded_argv(flower_argv: Sequence[str], operators: Iterable[str] = ()) -> list[str]:
    """The command line that runs Flower's SuperLink (``flower_argv`` without its program)
    behind the guard, with this Python."""
    for op in operators:
        parse_network(op)  # a bad value is reported before anything starts
    extra = [a for op in operators for a in (OPERATOR_FLAG, op)]
    return [sys.executable, "-m", "fedshift.flower.deploy.guard", *extra, *flower_argv[1:]]


def install(cli: types.ModuleType, networks: Sequence[Network]) -> None:
    """Put :class:`OperatorOnly` in front of the application Flower's SuperLink command hands
    to uvicorn (``cli`` is ``flwr.superlink.cli.flower_superlink``); refuse a Flower that
    starts its SuperLink differently."""
    server = getattr(cli, "uvicorn", None)
    if not hasattr(cli, "flower_superlink") or not callable(getattr(server, "run", None)):
        raise FedshiftError(
            "this Flower starts its SuperLink in a way fedshift's guard does not know: install "
            "the Flower version fedshift pins (pip install 'fedshift[flower]')"
        )
    run = server.run

    def guarded_run(app: ASGIApp, **kwargs: Any) -> Any:
        kwargs["proxy_headers"] = False  # the TCP peer is the client address
        return run(OperatorOnly(app, networks), **kwargs)

    cli.uvicorn = types.SimpleNamespace(run=guarded_run)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m fedshift.flower.deploy.guard [--operator NET ...] FLOWER_SUPERLINK_ARGS``."""
    # the module, not the function of the same name its package exports; an optional extra
    cli = importlib.import_module(FLOWER_MODULE)
    operators, flower_args = split_argv(sys.argv[1:] if argv is None else argv)
    try:
        networks = operator_networks(flower_host(flower_args), operators)
        install(cli, networks)
    except FedshiftError as err:
        print(f"Error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    shown = ", ".join(str(n) for n in networks)
    print(f"fedshift guard: Control and runtime APIs answer only {shown}", flush=True)
    sys.argv = ["flower-superlink", *flower_args]
    cli.flower_superlink()


if __name__ == "__main__":
    main()
