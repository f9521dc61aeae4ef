"""Ray, the optional distributed engine: importing it with a one-line error when it is missing,
and a session that connects to a cluster or starts (and later stops) a local instance.

Ray is an extra (``pip install 'fedshift[ray]'``). A local instance binds to 127.0.0.1 and
starts no dashboard unless asked; ``address`` connects to an existing cluster (``ray start
--head`` on one machine, ``ray start --address=HEAD:6379`` on the others; see the README). When
the process already has a Ray connection (a test fixture, a notebook, a Ray task), the session
uses it and leaves it running.
"""

from __future__ import annotations

import signal
import socket
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fedshift.core.errors import FedshiftError

#: the pip extra that installs Ray
EXTRA_HINT = "pip install 'fedshift[ray]'"


def require_ray(what: str = "executor=ray") -> Any:
    """The ``ray`` module, or a one-line error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise FedshiftError(f"{what} needs Ray, which is not installed: {EXTRA_HINT}") from None
    return ray


@dataclass(frozen=True)
class RaySettings:
    """Where Ray runs: ``address`` of a cluster (None: a local instance of ``num_cpus`` /
    ``num_gpus``, all of the machine's when None) bound to ``host``; ``dashboard`` on or off;
    ``connect_timeout_s``: how long a cluster may take to answer before that is an error."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    host: str = "127.0.0.1"
    dashboard: bool = False
    connect_timeout_s: float = 30.0


def check_reachable(address: str, timeout: float = 30.0, label: str = "ray.address=") -> None:
    """A one-line error, within about ``timeout`` seconds, when no Ray cluster answers at a
    ``host:port`` address: nothing listens there, or something that is not a Ray head's GCS
    does (Ray itself would retry for minutes). Other forms (``auto``, ``ray://...``) are left
    to Ray. ``label`` names the setting in the message (``ray.address=`` or ``--ray-address``)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    head = f"{label}{address}" if label.endswith("=") else f"{label} {address}"
    unset = "leave ray.address unset" if label.endswith("=") else "leave out --ray-address"
    try:
        socket.create_connection((host, int(port)), timeout=min(timeout, 5.0)).close()
    except OSError as err:
        raise FedshiftError(
            f"{head}: no Ray cluster answers there (nothing listens: {err.strerror or err}); "
            f"start one with `ray start --head` on that machine, or {unset} for a local instance"
        ) from None
    why = _gcs_silence(address, timeout)
    if why:
        raise FedshiftError(
            f"{head}: no Ray cluster answers there (something listens, but {why}); check the "
            "host and port (a Ray head's GCS port, 6379 unless `ray start --head --port` chose "
            f"another), raise ray.connect_timeout_s for a slow network, or {unset} for a local "
            "instance"
        )


def _gcs_silence(address: str, timeout: float) -> str | None:
    """Why the server at ``address`` is not a Ray GCS (None: it answered as one). One gRPC call
    of the GCS (the cluster id every Ray client asks for first) under a deadline."""
    try:
        import grpc  # Ray's own dependency
    except ImportError:
        return None
    start = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")
        try:
            call(b"", timeout=timeout)
        except grpc.RpcError as err:
            code, waited = err.code(), time.monotonic() - start  # type: ignore[attr-defined]
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return None  # a Ray GCS that wants a token: Ray's own error says which
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return "it is a gRPC server without Ray's GCS service"
            if code == grpc.StatusCode.DEADLINE_EXCEEDED or waited > 1:
                return f"it did not answer as a Ray GCS within {min(waited, timeout):.0f} s"
            return "it does not speak gRPC, as a Ray GCS does"
    return None


@contextmanager
def ray_session(settings: RaySettings, what: str = "executor=ray") -> Iterator[Any]:
    """Yield the ``ray`` module with a live connection; a local instance this started is shut
    down on exit, an existing connection is left as it was."""
    ray = require_ray(what)
    if ray.is_initialized():
        yield ray
        return
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _init(ray, settings, "--ray-address" if what == "--ray" else "ray.address=")
    except ConnectionError as err:
        raise FedshiftError(f"ray.address={settings.address}: {err}") from None
    finally:
        # Ray's core installs handlers that abort the process on SIGTERM; the caller's own
        # (fedshift's CLI: save, say how to resume, exit 130) come back
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
    try:
        yield ray
    finally:
        ray.shutdown()


def _init(ray: Any, settings: RaySettings, label: str) -> None:
    """Connect to the cluster at ``settings.address`` (checked first: see
    :func:`check_reachable`) or start a local instance."""
    with warnings.catch_warnings():
        # Ray's notice that a future version will stop hiding GPUs from tasks that asked for
        # none: today's behaviour is the one fedshift relies on, so the notice is noise
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
        if settings.address:
            check_reachable(settings.address, settings.connect_timeout_s, label)
            ray.init(address=settings.address, log_to_driver=False)
            return
        ray.init(
            num_cpus=settings.num_cpus,
            num_gpus=settings.num_gpus,
            include_dashboard=settings.dashboard,
            dashboard_host=settings.host,
            _node_ip_address=settings.host,
            log_to_driver=False,
        )
