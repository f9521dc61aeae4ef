"""The suite itself (issue 40, case 10): started as a background job (``nohup ... &``, where
SIGINT starts ignored and a shell would also ignore SIGHUP), its tests of signals still pass.

A process inherits an ignored SIGINT across ``exec``; fedshift then has to stop what it started
with SIGTERM. The tests marked ``signals`` (they send signals, or stop processes fedshift
started) run in that condition in every run of the suite: an autouse fixture of
``tests/conftest.py`` ignores SIGINT and SIGHUP while they run, so the processes they start
inherit it, as under ``nohup``. Those marked ``foreground`` too keep the terminal's default."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_DISPOSITIONS = (
    "import signal; print(*(signal.getsignal(s) == signal.SIG_IGN "
    "for s in (signal.SIGINT, signal.SIGHUP)))"
)


def _started_ignoring() -> list[str]:
    """Whether a process started now inherits SIGINT and SIGHUP ignored."""
    return subprocess.run(
        [sys.executable, "-c", _DISPOSITIONS], capture_output=True, text=True, check=True
    ).stdout.split()


@pytest.mark.signals
def test_a_signals_test_starts_its_processes_as_a_background_job_would():
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert _started_ignoring() == ["True", "True"]


@pytest.mark.signals
@pytest.mark.foreground
def test_a_foreground_signals_test_keeps_the_suites_own_handling():
    """Left as the suite started: the terminal's default, or ignored under ``nohup``."""
    own = [str(signal.getsignal(s) == signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGHUP)]
    assert _started_ignoring() == own


def test_the_marked_tests_are_the_ones_that_send_signals():
    """Every test file that sends a catchable signal (SIGINT, SIGTERM, SIGHUP: the ones a
    process can ignore or handle; not SIGKILL) marks its tests, so none of them runs only in
    the foreground condition."""
    marked, unmarked = [], []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name == "test_suite.py" or not any(
            f"signal.{name}" in text for name in ("SIGINT", "SIGTERM", "SIGHUP")
        ):
            continue
        (marked if "@pytest.mark.signals" in text else unmarked).append(path.name)
    assert len(marked) >= 4, marked
    assert unmarked == [], f"files that send signals without marking a test: {unmarked}"
