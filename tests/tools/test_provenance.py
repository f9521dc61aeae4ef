"""Published numbers are backed by committed artifacts (fedshift.tools.provenance): the repository's
own results, README and documentation pages, and the checker itself on planted mistakes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from fedshift.cli import app
from fedshift.core.errors import FedshiftError
from fedshift.tools.artifacts import ARCHIVE, archive_bytes, loose_files, members, pack, unpack
from fedshift.tools.provenance import (
    Number,
    artifact_values,
    backed,
    check_all,
    check_document,
    check_folder,
    default_documents,
    load_provenance,
    numbers,
    render,
    sections,
    unbacked,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def fedshift(argv: list[str]) -> int | None:
    """The ``fedshift`` command in this process, as the command line's ``results`` passes it."""
    return app(args=argv, prog_name="fedshift", standalone_mode=False)


# ------------------------------------------------------------------ the repository itself


def test_every_published_number_is_in_an_artifact():
    """Every results folder has its provenance and every number of the README, of the
    documentation pages and of the folders' notes is held by an artifact of the folder(s)
    cited."""
    assert check_all(ROOT) == []


def test_the_documents_checked_are_the_readme_and_every_docs_page():
    docs = default_documents(ROOT)
    assert docs[0] == ROOT / "README.md"
    assert ROOT / "docs" / "tutorials" / "fedrc.md" in docs
    assert set(docs[1:]) == set((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("folder", sorted(p.name for p in RESULTS.iterdir() if p.is_dir()))
def test_each_results_folder_re_renders_to_its_committed_tables(folder):
    assert render(RESULTS / folder, ROOT, fedshift, check=True) == []


def test_results_hold_folders_only():
    loose = [p.name for p in RESULTS.iterdir() if not p.is_dir()]
    assert loose == [], "a result needs its own folder with provenance.yaml"


def test_results_folders_are_packed_small_and_re_pack_to_the_same_bytes():
    """Every committed results folder keeps its run files in its archive (no loose ones, under
    2 MB), and packing its files again gives the committed bytes."""
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        assert loose_files(folder) == [], f"{folder}: run `fedshift results pack {folder}`"
        archive = folder / ARCHIVE
        assert archive.stat().st_size < 2 * 2**20, archive
        assert archive_bytes(members(folder)) == archive.read_bytes(), archive


# ------------------------------------------------------------------ packed folders


def _packed_copy(tmp_path: Path, folder: str) -> Path:
    """A copy of the results folder ``folder``, packed."""
    copy = tmp_path / folder
    shutil.copytree(RESULTS / folder, copy)
    if loose_files(copy):
        pack(copy)
    return copy


def test_packing_is_deterministic_and_round_trips(tmp_path):
    copy = _packed_copy(tmp_path, "cpu2_digit_domains")
    first = (copy / ARCHIVE).read_bytes()
    assert loose_files(copy) == [] and (copy / "table.md").is_file()
    assert fedshift(["results", "unpack", str(copy)]) is None
    assert not (copy / ARCHIVE).exists() and len(loose_files(copy)) == 12
    for path in (copy / "digit-domains").rglob("*"):  # other times and modes: same archive
        path.touch()
        path.chmod(0o600 if path.is_file() else 0o700)
    assert fedshift(["results", "pack", str(copy)]) is None
    assert (copy / ARCHIVE).read_bytes() == first
    assert not (copy / "digit-domains").exists()
    assert archive_bytes(members(copy)) == first


def test_unpacking_a_copy_leaves_the_folder_and_a_partial_pack_is_refused(tmp_path):
    copy = _packed_copy(tmp_path, "cpu2_digit_domains")
    written = unpack(copy, tmp_path / "look")
    assert (tmp_path / "look" / "digit-domains" / "dfl" / "summary.json").is_file()
    assert len(written) == 12 and (copy / ARCHIVE).is_file() and loose_files(copy) == []
    (copy / "digit-domains" / "new").mkdir(parents=True)
    (copy / "digit-domains" / "new" / "summary.json").write_text("{}")
    with pytest.raises(FedshiftError, match="unpack it first"):
        pack(copy)  # would drop the archive's runs


PROVENANCE_YAML = (
    "what: w\nnot: n\nmachine: m\ncommit: 'abcdef0'\ndate: 2026-11-26\ncommands: [c]\n"
)


def _bench_folder(tmp_path: Path, value: float) -> Path:
    """A packed results folder whose note quotes 12.35, held only by its benchmark JSON."""
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / "provenance.yaml").write_text(PROVENANCE_YAML)
    (folder / "README.md").write_text("# Bench\n\nThe batched executor: 12.35 samples/s.\n")
    (folder / "runs" / "r0").mkdir(parents=True)
    (folder / "runs" / "r0" / "bench.json").write_text(json.dumps({"sps": value}))
    pack(folder)
    assert loose_files(folder) == [] and list(members(folder)) == ["runs/r0/bench.json"]
    return folder


def test_a_number_only_in_a_packed_artifact_is_found(tmp_path):
    folder = _bench_folder(tmp_path, 12.3456)
    assert 12.3456 in artifact_values(folder)
    assert check_folder(folder) == []


def test_a_wrong_number_in_a_packed_artifact_is_caught(tmp_path):
    folder = _bench_folder(tmp_path, 13.3456)
    problems = check_folder(folder)
    assert len(problems) == 1 and "12.35 is in no artifact of bench" in problems[0], problems


def test_a_packed_folder_renders_from_its_archive(tmp_path):
    """The render commands read the runs at their paths in the folder: they are unpacked into
    the copy; a render into the folder itself leaves it packed."""
    copy = _packed_copy(tmp_path, "cpu2_digit_domains")
    assert render(copy, ROOT, fedshift, check=True) == []
    (copy / "table.md").write_text("stale\n")
    assert render(copy, ROOT, fedshift) == ["table.md"]
    assert (copy / "table.md").read_text() == (
        RESULTS / "cpu2_digit_domains" / "table.md"
    ).read_text()
    assert sorted(p.name for p in copy.iterdir()) == [ARCHIVE, "provenance.yaml", "table.md"]


def test_a_wrong_number_in_a_packed_run_file_is_caught_by_the_render(tmp_path):
    copy = _packed_copy(tmp_path, "cpu2_digit_domains")
    unpack(copy)
    metrics = copy / "digit-domains" / "fedavg" / "metrics.jsonl"
    *rounds, last = metrics.read_text().splitlines(keepends=True)
    assert '"local_acc": 73.5333' in last  # the table's 73.53, at the last round
    metrics.write_text("".join(rounds) + last.replace('"local_acc": 73.5', '"local_acc": 75.5'))
    pack(copy)
    assert render(copy, ROOT, fedshift, check=True) == ["table.md"]


# ------------------------------------------------------------------ planted mistakes


def _with_one_number_changed(tmp_path: Path, doc: str) -> tuple[Path, int]:
    """A copy of the document ``doc`` in which the first number of a section that cites a
    results folder has its last digit changed to one that no cited folder holds (so the edit
    is a mistake the check must see); the line it is on."""
    text = (ROOT / doc).read_text()
    lines = text.splitlines(keepends=True)
    for first, section in sections(text):
        cited = sorted(set(re.findall(r"benchmarks/results/([\w.\-]+)", section)))
        if not cited:
            continue
        values = sorted(
            v
            for name in cited
            for v in artifact_values(RESULTS / name, load_provenance(RESULTS / name).generated())
        )
        for n in numbers(section):
            i = first + n.line - 2
            if lines[i].count(n.text) != 1:
                continue
            for digit in "123456789":
                edited = n.text[:-1] + digit
                value = float(edited.replace(",", "").replace("−", "-"))
                if edited != n.text and not backed(Number(edited, value, n.decimals, 0), values):
                    lines[i] = lines[i].replace(n.text, edited)
                    out = tmp_path / Path(doc).name
                    out.write_text("".join(lines))
                    return out, i + 1
    raise AssertionError(f"no cited number in {doc} to edit")


@pytest.mark.parametrize(
    "doc", ["README.md", "docs/tutorials/fedrc.md", "docs/tutorials/feddaa.md"]
)
def test_an_edited_number_of_a_document_is_caught(tmp_path, doc):
    copy, line = _with_one_number_changed(tmp_path, doc)
    assert check_document(ROOT / doc, RESULTS) == []
    problems = check_document(copy, RESULTS)
    assert any(p.startswith(f"{copy}:{line}:") for p in problems), problems


def test_check_all_reads_the_docs_pages(tmp_path):
    """A number in a docs page that no cited folder holds fails ``check_all``."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# R\n\nNothing measured.\n")
    page = tmp_path / "docs" / "tutorials" / "x.md"
    page.parent.mkdir(parents=True)
    page.write_text("# X\n\nOurs: 12.5% better.\n")
    problems = check_all(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"{page}:3: 12.5 is in no artifact")


def _copy_with_one_edit(tmp_path, folder: str, file: str, old: str, new: str):
    """A copy of the results folder ``folder`` whose ``file`` has ``old`` changed to ``new``."""
    copy = tmp_path / folder
    shutil.copytree(RESULTS / folder, copy)
    edited = copy / file
    assert old in edited.read_text()
    edited.write_text(edited.read_text().replace(old, new, 1))
    return copy


def test_an_edited_note_in_a_results_folder_is_caught(tmp_path):
    copy = _copy_with_one_edit(
        tmp_path, "h200_fedrc_table1_fmnist_partial", "README.md", "53.33", "55.33"
    )
    problems = check_folder(copy)
    assert len(problems) == 1 and "55.33 is in no artifact" in problems[0], problems


def test_an_edited_rendered_table_is_caught(tmp_path):
    copy = _copy_with_one_edit(tmp_path, "h200_throughput", "fmnist_cnn.md", "0.50", "0.60")
    assert render(copy, ROOT, fedshift, check=True) == ["fmnist_cnn.md"]


def test_a_folder_without_provenance_is_reported(tmp_path):
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "table.md").write_text("| a | 1.5 |\n")
    problems = check_folder(tmp_path / "loose")
    assert len(problems) == 1 and "no provenance.yaml" in problems[0]


def test_a_readme_citing_a_folder_without_provenance_is_reported(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    (results / "old").mkdir(parents=True)
    doc = tmp_path / "README.md"
    doc.write_text("# R\n\nSee `benchmarks/results/old`: 12.5% better.\n")
    problems = check_document(doc, results)
    assert any("has no provenance.yaml" in p for p in problems), problems
    assert any("12.5 is in no artifact" in p for p in problems), problems


# ------------------------------------------------------------------ the parts


def test_numbers_reads_measurements_not_code_versions_or_integers():
    text = (
        "FedRC 59.60 (paper 59.00 ±4.91), 2,947 samples/s, 89.6,81.3 per step, round 150,\n"
        "torch 2.14.1, spec §7.7, a range 0.4-0.75, a drop of -1.25 points, `lr=0.06` and\n"
        "```\nfedshift run x train.lr=0.15\n```\n<!-- 9.99 -->\n"
    )
    got = [(n.text, n.value, n.decimals, n.line) for n in numbers(text)]
    assert got == [
        ("59.60", 59.6, 2, 1),
        ("59.00", 59.0, 2, 1),
        ("4.91", 4.91, 2, 1),
        ("2,947", 2947.0, 0, 1),
        ("89.6", 89.6, 1, 1),
        ("81.3", 81.3, 1, 1),
        ("0.4", 0.4, 1, 2),
        ("0.75", 0.75, 2, 2),
        ("-1.25", -1.25, 2, 2),
    ]


def test_backed_at_the_printed_precision_or_as_a_percentage():
    values = sorted([59.604, 0.4313, 2947.0])
    assert backed(Number("59.60", 59.60, 2, 1), values)
    assert not backed(Number("59.61", 59.61, 2, 1), values)
    assert backed(Number("59.6", 59.6, 1, 1), values)
    assert backed(Number("43.13", 43.13, 2, 1), values)  # 0.4313 printed as a percentage
    assert not backed(Number("43.2", 43.2, 1, 1), values)
    assert backed(Number("2,947", 2947.0, 0, 1), values)
    assert unbacked("59.60 and 59.70", values) == [Number("59.70", 59.7, 2, 1)]


def test_artifact_values_take_benchmark_json_and_rendered_tables_not_run_files(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"a": [1.25, {"b": 3}], "ok": True}))
    run = tmp_path / "r" / "lr0.1-seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"acc": 77.77}))
    (tmp_path / "table.md").write_text("| x | 12.34 |\n")
    assert artifact_values(tmp_path, ["table.md"]) == [1.25, 3.0, 12.34]


def test_an_all_digit_commit_must_be_quoted():
    """YAML reads ``commit: 5377012`` as a number: the error says to quote it."""
    import yaml
    from pydantic import ValidationError

    from fedshift.tools.provenance import Provenance

    raw = yaml.safe_load(
        "what: w\nnot: n\nmachine: m\ncommit: 5377012\ndate: 2026-11-26\ncommands: [c]\n"
    )
    with pytest.raises(ValidationError, match="write the commit in quotes"):
        Provenance.model_validate(raw)
    assert Provenance.model_validate({**raw, "commit": "5377012"}).commit == "5377012"


def test_a_render_command_that_fails_is_reported_not_skipped(tmp_path):
    """A render whose command exits with an error (here a report of a run folder that is not
    there) fails the check; before, the committed text was compared with itself."""
    folder = tmp_path / "cpu2_throughput"
    shutil.copytree(RESULTS / "cpu2_throughput", folder)
    prov = folder / "provenance.yaml"
    prov.write_text(
        prov.read_text().replace(
            "fedshift bench --from-json {dir}/fmnist_cnn.json",
            "fedshift report {dir}/no-such-run --protocol last",
        )
    )
    with pytest.raises(FedshiftError, match="render command failed"):
        render(folder, ROOT, fedshift, check=True)


# ------------------------------------------------------------------ numbers at their positions

RENDER_PY = """import json, sys
scores = json.load(open(sys.argv[1]))
print(f"Scores of {len(scores)} methods; IFCA reaches {scores['IFCA']['global']:.2f} global.")
print()
print("| algorithm | global % | local % |")
print("|---|---|---|")
for name, s in scores.items():
    print(f"| {name} | {s['global']:.2f} | {s['local']:.2f} |")
"""

NOTE = """# Demo

| algorithm | global % |
|---|---|
| FedAvg | 30.70 |
| IFCA | 45.87 |

IFCA reaches 45.87.
"""


def _demo(tmp_path: Path) -> Path:
    """A results folder ``demo`` whose ``table.md`` is rendered by ``render.py`` (in
    ``tmp_path``, the repository of the render command) from ``scores.json``, and whose note
    quotes the table."""
    folder = tmp_path / "demo"
    folder.mkdir()
    (tmp_path / "render.py").write_text(RENDER_PY)
    scores = {
        "FedAvg": {"global": 30.7012, "local": 58.5},
        "IFCA": {"global": 45.8667, "local": 70.83},
    }
    (folder / "scores.json").write_text(json.dumps(scores))
    render_yaml = "render:\n  - command: python render.py {dir}/scores.json\n    stdout: table.md\n"
    (folder / "provenance.yaml").write_text(PROVENANCE_YAML + render_yaml)
    (folder / "README.md").write_text(NOTE)
    assert render(folder, tmp_path, fedshift) == ["table.md"]
    pack(folder)
    return folder


def _edit(path: Path, old: str, new: str) -> None:
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))


def test_an_unchanged_folder_passes_and_its_rendered_file_is_what_the_script_prints(tmp_path):
    folder = _demo(tmp_path)
    assert (folder / "table.md").read_text().splitlines()[-1] == "| IFCA | 45.87 | 70.83 |"
    assert check_folder(folder, tmp_path, fedshift) == []


def test_two_numbers_swapped_in_a_hand_written_table_fail_at_their_row_and_column(tmp_path):
    folder = _demo(tmp_path)
    _edit(
        folder / "README.md",
        "| FedAvg | 30.70 |\n| IFCA | 45.87 |",
        "| FedAvg | 45.87 |\n| IFCA | 30.70 |",
    )
    note = folder / "README.md"
    assert check_folder(folder, tmp_path, fedshift) == [
        f"{note}:5: row 'FedAvg', column 'global %': 45.87 published, 30.70 there in the"
        " rendered tables of demo",
        f"{note}:6: row 'IFCA', column 'global %': 30.70 published, 45.87 there in the"
        " rendered tables of demo",
    ]
    assert check_folder(folder) == check_folder(folder, tmp_path, fedshift)  # committed tables


def test_a_hand_written_cell_may_round_within_its_printed_digits(tmp_path):
    folder = _demo(tmp_path)
    _edit(folder / "README.md", "| IFCA | 45.87 |", "| IFCA | 45.9 |")
    assert check_folder(folder, tmp_path, fedshift) == []
    _edit(folder / "README.md", "| IFCA | 45.9 |", "| IFCA | 45.8 |")
    assert check_folder(folder)[0].endswith(
        "45.8 published, 45.87 there in the rendered tables of demo"
    )
    _edit(folder / "README.md", "| IFCA | 45.8 |", "| IFCA | 45.88 |")
    assert len(check_folder(folder)) == 1  # the same digits as the rendered cell: not rounding


def test_numbers_swapped_in_a_rendered_file_fail_in_its_table_and_its_prose(tmp_path):
    folder = _demo(tmp_path)
    table = folder / "table.md"
    _edit(
        table,
        "| FedAvg | 30.70 | 58.50 |\n| IFCA | 45.87 |",
        "| FedAvg | 45.87 | 58.50 |\n| IFCA | 30.70 |",
    )
    _edit(table, "IFCA reaches 45.87", "IFCA reaches 30.70")
    problems = check_folder(folder, tmp_path, fedshift)
    assert sorted(problems) == sorted(
        [
            f"{table}:1: 30.70 published where the artifacts render 45.87 (prose)",
            f"{table}:5: row 'FedAvg', column 'global %': 45.87 published, 30.70 rendered",
            f"{table}:6: row 'IFCA', column 'global %': 30.70 published, 45.87 rendered",
        ]
    )


def test_a_swap_in_a_committed_folders_table_fails(tmp_path):
    """The swap that used to pass (issue 40): IFCA's and FedAvg's global accuracy in the FedRC
    folder's README, each of them a number its artifacts hold, but not in that row."""
    folder = "cpu2_fedrc_table1_fmnist_reduced"
    copy = _copy_with_one_edit(
        tmp_path, folder, "README.md", "| 30.70 | 34.35 ±0.92 |", "| 45.87 | 34.35 ±0.92 |"
    )
    _edit(copy / "README.md", "| 45.87 | 31.30 ±2.69 |", "| 30.70 | 31.30 ±2.69 |")
    problems = check_folder(copy)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "row 'FedAvg', column 'global % (ours)': 45.87 published, 30.70 there in the rendered"
        f" tables of {folder}",
        "row 'IFCA', column 'global % (ours)': 30.70 published, 45.87 there in the rendered"
        f" tables of {folder}",
    ]


def test_a_swap_in_a_documents_table_fails(tmp_path):
    doc = tmp_path / "fedrc.md"
    text = (ROOT / "docs" / "tutorials" / "fedrc.md").read_text()
    assert text.count("| 58.50 |") == 1 and text.count("| 70.83 |") == 1
    doc.write_text(
        text.replace("| 58.50 |", "| X |")
        .replace("| 70.83 |", "| 58.50 |")
        .replace("| X |", "| 70.83 |")
    )
    problems = check_document(doc, RESULTS)
    assert len(problems) == 2 and all("column 'local % (ours)'" in p for p in problems), problems


def test_a_missing_rendered_file_is_reported_by_the_folder_and_a_document_still_checks(tmp_path):
    folder = _demo(tmp_path)
    (folder / "table.md").unlink()
    assert check_folder(folder) == [f"{folder}/table.md: rendered file missing"]
    doc = tmp_path / "README.md"
    doc.write_text("# R\n\n`benchmarks/results/demo`: IFCA reaches 45.87, not 12.34.\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    shutil.move(str(folder), tmp_path / "benchmarks" / "results" / "demo")
    problems = check_document(doc, tmp_path / "benchmarks" / "results")
    assert [p.split(": ", 1)[1] for p in problems] == ["12.34 is in no artifact of demo"]
