"""docs/writing-an-algorithm.md runs as printed: its Python blocks (FedProx and a clustered
method, then the conformance harness on both) run in a fresh interpreter, every check passes,
and the report the page shows is the one the harness prints."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import example_blocks


def test_the_guide_runs_and_prints_the_report_it_shows(tmp_path):
    code = "\n".join(example_blocks("python"))
    assert "class MyProx" in code and "class MyIFCA" in code and "check_algorithm" in code
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "my-prox (premise: iid)" in res.stdout and "FAIL" not in res.stdout
    shown = example_blocks("text")[0].strip().splitlines()
    assert shown[0] == "my-ifca (premise: concepts)"
    for line in shown:
        assert line in res.stdout, (line, res.stdout)
