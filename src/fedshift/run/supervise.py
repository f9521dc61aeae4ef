"""The commands that train (``run``, ``compare``, ``reproduce``, ``sweep``) run in a child
process that the ``fedshift`` process watches, so that a run killed by the system says so.

A process killed with SIGKILL (the kernel's out-of-memory killer, or ``kill -9``) cannot print
anything itself: without a watcher the user sees the command vanish. The watching parent forks
before anything heavy is imported, forwards SIGTERM and SIGHUP (and SIGINT that does not come
from the terminal, which delivers it to both processes itself) to the child, exits with the
child's exit code, and when the child died of a signal prints one line: which signal, what
most likely sent it, and the run folder to resume (each run notes its folder when it claims
it: :func:`fedshift.run.lock.announce_run_dir`).

Only the standard library is imported here. ``FEDSHIFT_SUPERVISE=0`` turns the watcher off;
it is off where there is no ``fork`` and inside a child it started. On Linux the watcher is
also a subreaper: what the child leaves running when it ends (a local Ray instance's agents,
after a SIGKILL) is stopped before the command returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path

from fedshift.run.lock import RUN_NOTE_ENV, SUPERVISOR_PID_ENV

#: the commands whose runs the watcher covers
TRAINING_COMMANDS = ("run", "compare", "reproduce", "sweep")
_CHILD_ENV = "FEDSHIFT_SUPERVISED"


def wanted(argv: list[str]) -> bool:
    """Whether the command line ``argv`` (without the program) trains, and may be watched."""
    if os.environ.get("FEDSHIFT_SUPERVISE", "1") == "0" or os.environ.get(_CHILD_ENV):
        return False
    if not hasattr(os, "fork") or any(a in ("--help", "-h") for a in argv):
        return False
    command = next((a for a in argv if not a.startswith("-")), None)
    return command in TRAINING_COMMANDS


def supervise(argv: list[str]) -> int | None:
    """Fork: in the child return None (it goes on to run the command); in the parent wait for
    the child and return the exit code to leave with."""
    fd, note = tempfile.mkstemp(prefix="fedshift-run-", suffix=".note")
    os.close(fd)
    os.environ[RUN_NOTE_ENV] = note
    os.environ[_CHILD_ENV] = "1"
    os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # a dead child's helpers come to this process
    pid = os.fork()
    if pid == 0:
        _prctl(_PR_SET_CHILD_SUBREAPER, 0)
        _die_with_parent()
        return None
    try:
        return _watch(pid, argv, Path(note))
    finally:
        end_leftovers()
        Path(note).unlink(missing_ok=True)
        Path(f"{note}.tmp").unlink(missing_ok=True)


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl(option, value); False where there is none."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """This process's live children (Linux's /proc; none elsewhere)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                kids += [int(x) for x in (task / "children").read_text().split()]
    return kids


def end_leftovers(grace_s: float = 3.0) -> list[int]:
    """Stop the processes the training child left behind: as a subreaper this process adopts
    the orphans of its descendants (a Ray instance's agents outlive a driver killed with
    SIGKILL), and the orphans of those as they end in turn. Each gets SIGTERM, ``grace_s`` to
    end, then SIGKILL, and is reaped; after ``5 * grace_s`` anything still adopted gets
    SIGKILL at once. Returns their pids."""
    import time

    start = time.monotonic()
    sent: dict[int, float] = {}  # pid -> when it got SIGTERM
    while True:
        now = time.monotonic()
        for pid in _children():
            if pid not in sent:
                sent[pid] = now
                _signal(pid, signal.SIGKILL if now - start > 5 * grace_s else signal.SIGTERM)
            elif now - sent[pid] > grace_s:
                _signal(pid, signal.SIGKILL)
        living = [pid for pid in sent if not _reaped(pid)]
        if not living and not _children():
            return list(sent)
        time.sleep(0.05)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reaped(pid: int) -> bool:
    """Reap ``pid`` if it ended; True once it is gone (or was never this process's child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL when the watching parent ends (a ``kill -9`` of the
    ``fedshift`` process stops the run, as it did without a watcher); elsewhere nothing."""
    if not _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL):
        return
    if str(os.getppid()) != os.environ.get(SUPERVISOR_PID_ENV):  # it ended before the request
        os.kill(os.getpid(), signal.SIGKILL)


def _watch(pid: int, argv: list[str], note: Path) -> int:
    def forward(sig: int, _frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job ignores it
        signal.signal(signal.SIGINT, _forward_unless_terminal(forward))
    while True:  # any child: orphans adopted while the run goes on are reaped as they end
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if done == pid:
            break
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    sig = os.WTERMSIG(status)
    print(killed_message(sig, argv, _read(note)), file=sys.stderr, flush=True)
    return 128 + sig


def _forward_unless_terminal(forward):
    """SIGINT from the terminal reaches every process of its foreground group, the child
    included: forward only a SIGINT that was sent to this process alone."""

    def handler(sig: int, frame) -> None:
        try:
            from_terminal = os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            from_terminal = False
        if not from_terminal:
            forward(sig, frame)

    return handler


def _read(note: Path) -> str | None:
    try:
        text = note.read_text().strip()
    except OSError:
        return None
    return text or None


def killed_message(sig: int, argv: list[str], run_dir: str | None) -> str:
    """One line on a child that died of signal ``sig`` while running ``argv`` in ``run_dir``."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if sig == signal.SIGKILL:
        why = (
            "killed by the system (SIGKILL), most likely by the kernel's out-of-memory killer "
            "(`dmesg` or `journalctl -k` says); give the run less memory (memory.budget=..., "
            "chunk_size=..., executor=sequential) or stop what else uses memory"
        )
    else:
        why = f"ended by {name}"
    command = next((a for a in argv if not a.startswith("-")), "run")
    if command == "run":
        if run_dir and (Path(run_dir) / "checkpoint.pt").is_file():
            resume = f"its completed rounds are saved: `fedshift run --resume {run_dir}`"
        elif run_dir:
            resume = f"no round of {run_dir} was saved yet: start the run again"
        else:
            resume = "it ended before its run folder was made: start it again"
    else:
        where = f" (it was running {run_dir})" if run_dir else ""
        resume = (
            f"every run keeps its last completed round{where}: the same command reuses "
            "finished runs and resumes the others"
        )
    return f"error: fedshift was {why}; {resume}"
