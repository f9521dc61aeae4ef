"""Flower's processes of a deployment, started and stopped for ``fedshift deploy``: each
Flower command from this environment, a SuperNode the SuperLink refused started again after a
pause, and a process group stopped however the command ends (SIGTERM first where SIGINT is
ignored, as in a background job; SIGKILL if it does not stop)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fedshift.core.errors import FedshiftError

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


def flower_command(name: str) -> str:
    """Flower's command ``name`` from this environment (else from PATH)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else name


def flower_env() -> dict[str, str]:
    """This environment's scripts first on PATH: Flower starts ``flwr-clientapp`` and
    ``flwr-serverapp`` processes by name."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


#: what Flower's SuperNode prints when the SuperLink will not activate it (its exit code 305,
#: exit status 1): its key is not registered, or (after a restart) the SuperLink still holds
#: the node's previous instance, online until two heartbeat intervals after its last
#: heartbeat (Flower's HEARTBEAT_PATIENCE x HEARTBEAT_DEFAULT_INTERVAL = 2 x 30 s). The
#: SuperNode is told only "Failed to activate SuperNode" in both cases.
NOT_ACTIVATED = "Failed to activate SuperNode"

#: seconds after which a refusal cannot be a previous instance any more (its hold of at most
#: 60 s after the node stopped, and a margin)
HOLD_S = 75.0
RETRY_PAUSE_S = 10.0


def not_activated(key: str | None, waited: float, retry_s: float) -> str:
    """Why the SuperLink keeps refusing a node whose refusals have lasted ``waited`` seconds
    (``key``: the node's private key file), and what to do."""
    pub = f"{key}.pub" if key else "the node's public key"
    register = f"register {pub} on the SuperLink's machine (`fedshift deploy register {pub} " \
        "--certs CERTS`)"  # fmt: skip
    if key is None:
        return (f"the SuperLink refused this node for {waited:.0f} s: it authenticates nodes, "
                "so start the node with --key (its private key) and " + register)  # fmt: skip
    if waited >= HOLD_S:
        return (f"the SuperLink refused this node's key {key} for {waited:.0f} s, longer than it "
                f"holds a stopped node (60 s): the key is not registered; {register}, then start "
                "the node again")  # fmt: skip
    return (f"the SuperLink refused this node for {waited:.0f} s: its key {key} is not "
            "registered, or the node's previous instance is still held (up to 60 s after it "
            f"stopped); {register}, or keep trying longer (--retry-s {HOLD_S:g}; now "
            f"{retry_s:g})")  # fmt: skip


def first_refusal(key: str | None, retry_s: float) -> str:
    """The line shown when the SuperLink first refuses a node that will be started again."""
    why = (f"its key {key} is not registered, or its previous instance is still held (up to "
           "60 s after it stopped)" if key else "it was started without --key")  # fmt: skip
    return (f"the SuperLink did not activate this node: {why}; trying again every "
            f"{RETRY_PAUSE_S:g} s for up to {min(retry_s, HOLD_S):g} s")  # fmt: skip


def call_once(argv: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """Run ``argv`` in a process group of its own, its output passed through; (exit status,
    whether the SuperLink would not activate it). When it ends, what it started ends too
    (Flower's SuperExec would otherwise outlive a SuperNode that was not let in, holding its
    output open and trying its port for ever); Ctrl-C is passed on to it."""
    refused = threading.Event()
    proc: subprocess.Popen | None = None

    def pump() -> None:
        for line in proc.stdout or ():
            sys.stdout.write(line)
            sys.stdout.flush()
            if NOT_ACTIVATED in line:
                refused.set()

    def stop(signum, frame) -> None:  # noqa: ARG001 - SIGTERM ends the command's process too
        raise KeyboardInterrupt

    # the handler before the process: a SIGTERM that comes as soon as the command has started
    # (a supervisor that sees its first output) must stop both, not kill this process alone
    before = signal.signal(signal.SIGTERM, stop)
    try:
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        code = proc.wait()
    except KeyboardInterrupt:
        if proc is not None:
            stop_group(proc)
        raise
    finally:
        signal.signal(signal.SIGTERM, before)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    reader.join(timeout=2.0)
    return code, refused.is_set()


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
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


def start(
    argv: list[str],
    env: dict[str, str] | None = None,
    retry_s: float = 0.0,
    say: Callable[[str], object] = print,
    key: str | None = None,
) -> int:
    """Run Flower's command; while the SuperLink will not activate it (an unregistered key, or a
    restarted node's previous instance still held), start it again for up to ``retry_s``
    seconds. Its exit code (130: interrupted by Ctrl-C or SIGTERM); a node the SuperLink still
    refuses raises :class:`FedshiftError` saying why (an unregistered key once the refusals
    outlast a previous instance's hold). ``say`` prints what happens; ``key`` is the node's
    private key file, named in the messages."""
    say("$ " + shlex.join(argv))
    try:
        code, refused = call_once(argv, env or flower_env())
        first, tries = time.monotonic(), 0
        while code and refused:
            waited = time.monotonic() - first
            if waited >= HOLD_S or waited + RETRY_PAUSE_S > retry_s:
                raise FedshiftError(not_activated(key, waited, retry_s))
            tries += 1
            say(first_refusal(key, retry_s) if tries == 1 else
                f"still refused after {waited:.0f} s: trying again in {RETRY_PAUSE_S:g} s")  # fmt: skip
            time.sleep(RETRY_PAUSE_S)
            code, refused = call_once(argv, env or flower_env())
    except KeyboardInterrupt:
        code = 130
    except FileNotFoundError:
        raise FedshiftError(f"{argv[0]} not found: pip install 'fedshift[flower]'") from None
    return code


def toml_value(value: object) -> str:
    """A run-config value as TOML (strings as basic strings, newlines escaped)."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else json.dumps(str(value))
