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
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fedshift.errors import FedshiftError

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
    ``num_gpus``, all of the machine's when None) bound to ``host``; ``dashboard`` on or off."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    host: str = "127.0.0.1"
    dashboard: bool = False


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """A one-line error when nothing listens at a ``host:port`` cluster address (Ray itself
    retries for minutes); other forms (``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise FedshiftError(
            f"ray.address={address}: no Ray cluster answers there ({err.strerror or err}); start "
            "one with `ray start --head` on that machine, or leave ray.address unset for a local "
            "instance"
        ) from None


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
        _init(ray, settings)
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


def _init(ray: Any, settings: RaySettings) -> None:
    """Connect to the cluster at ``settings.address`` or start a local instance."""
    with warnings.catch_warnings():
        # Ray's notice that a future version will stop hiding GPUs from tasks that asked for
        # none: today's behaviour is the one fedshift relies on, so the notice is noise
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
        if settings.address:
            check_reachable(settings.address)
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
