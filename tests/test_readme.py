"""The README and the documentation pages say what the code does: the Python API example on the
getting-started page runs as printed (in a fresh interpreter, so the algorithm it registers does
not leak into other tests), the algorithm table is the registry, the command table names every
command, the README keeps the two commands CI runs, and every relative link resolves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import api_example

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
ALGORITHMS = DOCS / "algorithms.md"


def test_the_python_api_example_runs(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", api_example()],
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


def test_the_algorithm_table_is_the_registry_with_papers():
    """docs/algorithms.md's algorithm/paper table is what `fedshift list --markdown` prints
    now: an algorithm added (or a paper changed) without updating the page fails here."""
    from fedshift.reporting.catalogue import algorithm_markdown

    text = ALGORITHMS.read_text()
    block = re.search(r"<!-- algorithms:begin -->\n(.*?)<!-- algorithms:end -->", text, re.S)
    assert block, "docs/algorithms.md lost its <!-- algorithms:begin/end --> block"
    assert block.group(1) == algorithm_markdown(), (
        "docs/algorithms.md's algorithm table is stale: paste `fedshift list --markdown` "
        "between the markers"
    )


def test_the_command_table_names_every_command():
    """The getting-started page's table of commands has a row for every command of the CLI
    (a command added without a row fails here, and so does a row of a removed command)."""
    import typer

    from fedshift.cli import app

    commands = set(typer.main.get_command(app).commands)
    text = GETTING_STARTED.read_text()
    table = text[text.index("## The commands") :]
    rows = set(re.findall(r"^\| `fedshift (\w+)", table, re.M))
    assert rows == commands, f"missing: {sorted(commands - rows)}, extra: {sorted(rows - commands)}"


def test_the_readme_keeps_the_two_commands():
    """CI runs the test command exactly as the README prints it."""
    text = README.read_text()
    two = text[text.index("## Two commands") :]
    two = two[: two.index("\n## ", 1)]
    blocks = re.findall(r"```bash\n(.*?)```", two, re.S)
    assert [b.strip() for b in blocks] == [
        "FEDSHIFT_DATA=../shared/data bash scripts/demo.sh",
        "FEDSHIFT_DATA=../shared/data bash scripts/test.sh",
    ]


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_relative_links_resolve():
    """Every relative link of the README and of the pages points at a file that exists (the
    site build checks its own pages too; this also covers the README's links into docs/)."""
    broken = []
    for doc in [README, *sorted(DOCS.rglob("*.md"))]:
        for link in _links(doc):
            if re.match(r"[a-z]+:", link) or link.startswith("#"):
                continue
            target = (doc.parent / link.split("#")[0]).resolve()
            if not target.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {link}")
    assert broken == []
