"""The reproduction coverage of docs/reproducing.md (fedshift.tools.coverage): the page's
generated block is what its sources render to, the statuses are derived from the results
folders and the reproduce tables, and ``fedshift results check`` fails on a stale block or on
a results folder declaring a table the papers do not have."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedshift.cli import app
from fedshift.tools.coverage import (
    END,
    MISSING,
    PAGE,
    REPRODUCED,
    RUNNABLE,
    SETTING,
    START,
    counts,
    coverage_markdown,
    coverage_problems,
    coverage_rows,
    load_catalogue,
    page_block,
    registered,
    write_page,
)

ROOT = Path(__file__).resolve().parents[2]


def fedshift(argv: list[str]) -> int | None:
    """The ``fedshift`` command in this process; its exit code (None: 0)."""
    return app(args=argv, prog_name="fedshift", standalone_mode=False)


def mini_repo(tmp_path: Path, reproduces: list[str]) -> Path:
    """A repository with one results folder declaring ``reproduces``, the real configs, an
    empty README and a docs/reproducing.md whose coverage block is freshly written."""
    root = tmp_path / "repo"
    folder = root / "benchmarks" / "results" / "cpu2_demo"
    folder.mkdir(parents=True)
    provenance = {
        "what": "a demo",
        "not": "a result",
        "machine": "none",
        "commit": "abcdef0",
        "date": "2026-11-29",
        "commands": ["none"],
        "reproduces": reproduces,
    }
    (folder / "provenance.yaml").write_text(yaml.safe_dump(provenance))
    (root / "configs").symlink_to(ROOT / "configs")
    (root / "README.md").write_text("# demo\n")
    (root / "docs").mkdir()
    (root / PAGE).write_text(f"# Reproducing\n\n{START}\n{END}\n\nafter\n")
    write_page(root)
    return root


def _row(rows, ref):
    return next(r for r in rows if r.item.ref == ref)


# ------------------------------------------------------------------ the repository itself


def test_the_page_block_regenerates_identically():
    rows = coverage_rows(ROOT)
    assert page_block(ROOT) == coverage_markdown(rows)
    assert coverage_problems(ROOT) == []


def test_the_papers_have_15_3_4_5_tables_with_numbers():
    per_paper = counts(coverage_rows(ROOT))
    assert {p: c["tables"] for p, c in per_paper.items()} == {
        "fedrc": 15,
        "fednh": 3,
        "dfl": 4,
        "feddaa": 5,
    }
    refs = {i.ref for i in load_catalogue()}
    assert {"fedrc/fig7", "fednh/fig4", "feddaa/table6"} <= refs
    assert "27 tables with numbers" in page_block(ROOT)


def test_statuses_are_derived_from_folders_and_reproduce_tables():
    rows = coverage_rows(ROOT)
    table1 = _row(rows, "fedrc/table1")
    assert table1.status == REPRODUCED
    assert "cpu2_fedrc_table1_fmnist_reduced" in table1.notes
    assert "30 clients, 150 rounds, 1 seed" in table1.notes
    # every registered paper table is at least runnable
    for ref in registered():
        assert _row(rows, ref).status in (REPRODUCED, RUNNABLE), ref
    assert _row(rows, "fedrc/table3").status == MISSING
    assert _row(rows, "feddaa/table6").status == SETTING


# ------------------------------------------------------------------ planted mistakes


def test_a_declaring_folder_makes_a_table_reproduced(tmp_path):
    root = mini_repo(tmp_path, ["fedrc/table3"])
    row = _row(coverage_rows(root), "fedrc/table3")
    assert row.status == REPRODUCED and "benchmarks/results/cpu2_demo" in row.notes
    assert _row(coverage_rows(root), "fedrc/table1").status == RUNNABLE
    assert coverage_problems(root) == []
    assert fedshift(["results", "check", "--root", str(root)]) is None


def test_a_stale_block_fails_the_check(tmp_path, capsys):
    root = mini_repo(tmp_path, ["fedrc/table3"])
    page = root / PAGE
    text = page.read_text()
    assert "| FedRC Table 3 |" in text
    page.write_text(text.replace("**re-run**", "not implemented", 1))
    problems = coverage_problems(root)
    assert len(problems) == 1 and "coverage block is out of date" in problems[0], problems
    capsys.readouterr()
    assert fedshift(["results", "coverage", "--check", "--root", str(root)]) == 2
    assert "out of date" in capsys.readouterr().out
    assert fedshift(["results", "check", "--root", str(root)]) == 2
    out = capsys.readouterr()
    assert "out of date" in out.out
    assert (
        out.err.strip()
        == "error: 0 published number(s) or table(s) not backed, 1 coverage problem(s)"
    )
    # writing the page again makes the check pass
    assert fedshift(["results", "coverage", "--root", str(root)]) is None
    assert page.read_text() == text
    assert fedshift(["results", "check", "--root", str(root)]) is None


def test_a_folder_declaring_an_unknown_table_fails_the_check(tmp_path, capsys):
    root = mini_repo(tmp_path, ["fedrc/table99"])
    problems = coverage_problems(root)
    assert len(problems) == 1 and "reproduces fedrc/table99" in problems[0], problems
    capsys.readouterr()
    assert fedshift(["results", "check", "--root", str(root)]) == 2
    out = capsys.readouterr()
    assert "fedrc/table99" in out.out and len(out.err.strip().splitlines()) == 1


def test_a_page_without_markers_fails_the_check(tmp_path):
    root = mini_repo(tmp_path, [])
    (root / PAGE).write_text("# Reproducing\n")
    problems = coverage_problems(root)
    assert len(problems) == 1 and START in problems[0]


def test_a_run_command_naming_a_missing_config_is_reported(tmp_path):
    items = load_catalogue()
    table5 = next(i for i in items if i.ref == "fedrc/table5")
    broken = table5.entry.model_copy(update={"run": ["fedshift compare configs/nowhere.yaml"]})
    items = [i if i is not table5 else type(i)(i.paper, broken) for i in items]
    root = mini_repo(tmp_path, [])
    assert _row(coverage_rows(root, items), "fedrc/table5").status == MISSING
    problems = coverage_problems(root, items)
    assert any("no config configs/nowhere.yaml" in p for p in problems), problems


@pytest.mark.parametrize("key", ["fedrc-table99", "fedrc-fig1"])
def test_a_reproduce_table_named_after_no_listed_table_is_reported(tmp_path, key):
    from fedshift.studies.papers import TABLES

    root = mini_repo(tmp_path, [])
    tables = {**TABLES, key: TABLES["fedrc-table1"]}
    problems = coverage_problems(root, tables=tables)
    assert any(f"reproduce table {key}" in p for p in problems), problems
