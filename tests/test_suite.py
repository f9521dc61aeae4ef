"""The suite itself (issue 40, case 10): started as a background job (``nohup ... &``, where
SIGINT starts ignored and a shell would also ignore SIGHUP), its tests of signals still pass.

A process inherits an ignored SIGINT across ``exec``; fedshift then has to stop what it started
with SIGTERM. The tests marked ``signals`` (they send signals, or stop processes fedshift
started) run here again in a child pytest that starts the way a background job does."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _as_a_background_job() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.slow
def test_the_signal_tests_pass_when_the_suite_runs_as_a_background_job():
    env = {**os.environ, "PYTEST_ADDOPTS": ""}
    # only the files that hold marked tests: collecting the whole suite again costs ~10 s
    files = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "@pytest.mark.signals" in p.read_text(encoding="utf-8")
    )
    assert len(files) >= 4, files
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
         "-m", "signals and not slow", *files],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
        preexec_fn=_as_a_background_job,
    )  # fmt: skip
    tail = "\n".join((child.stdout + child.stderr).splitlines()[-15:])
    assert child.returncode == 0, tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 8, tail  # the marked tests really ran
