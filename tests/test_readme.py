"""The README's Python API example runs as printed (in a fresh interpreter, so the algorithm it
registers does not leak into other tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    block = re.search(
        r"<!-- python-api:start -->\s*```python\n(.*?)```\s*<!-- python-api:end -->", text, re.S
    )
    assert block, "README.md lost its Python API example"
    return block.group(1)


def test_readme_python_example_runs(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", readme_example()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "8 clients of concepts" in out
    for name in ("fedavg:", "fedavg-smooth:", "fedrc:"):
        assert name in out, out
    assert (tmp_path / "runs" / "api-demo" / "comparison.md").is_file()
    assert (tmp_path / "runs" / "api-demo" / "fedavg-smooth" / "metrics.jsonl").is_file()


def test_readme_algorithm_table_is_the_registry_with_papers():
    """The README's algorithm/paper table is what `fedshift list --markdown` prints now: an
    algorithm added (or a paper changed) without updating the README fails here."""
    from fedshift.report import algorithm_markdown

    text = README.read_text()
    block = re.search(r"<!-- algorithms:begin -->\n(.*?)<!-- algorithms:end -->", text, re.S)
    assert block, "README lost its <!-- algorithms:begin/end --> block"
    assert block.group(1) == algorithm_markdown(), (
        "README's algorithm table is stale: paste `fedshift list --markdown` between the markers"
    )
