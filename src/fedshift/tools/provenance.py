"""Published numbers and the artifacts they come from.

A results folder (``benchmarks/results/<name>/``) holds ``provenance.yaml`` (what the numbers
are and are not, the machine, the commit, the commands that made the runs and the commands
that render the markdown from them), the small per-run artifacts (``config.yaml``,
``metrics.jsonl``, ``summary.json``, or a benchmark's JSON), packed into ``artifacts.tar.xz``
(:mod:`fedshift.tools.artifacts`) or still loose, and the markdown rendered from them. Two
checks keep published numbers honest:

- ``render(folder, check=True)`` re-renders the folder's markdown from its artifacts into a
  copy (with the archive unpacked into it, so the render commands read the runs at the same
  paths) and names every file that differs from the committed one; ``check_folder`` names
  each number that differs at its position (a table cell's row and column, the order of the
  prose: :mod:`fedshift.tools.positions`);
- a hand-written table cell (a folder's README, the README, a documentation page) whose row
  and column a rendered table also has must hold that rendered cell's numbers (``placed``);
- ``unbacked(text, values)`` lists the numbers of a piece of markdown (prose or tables: every
  number with a decimal point or a thousands separator, outside code) that no artifact holds
  at the precision printed: the rule for prose and for cells no rendered table places. A section of the README or of a documentation page
  (``docs/**/*.md``) may quote numbers only from the results folders it cites
  (``benchmarks/results/<name>``).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import io
import json
import re
import runpy
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import yaml
from pydantic import Field, ValidationError, field_validator

from fedshift.config.base import Strict
from fedshift.core.errors import FedshiftError
from fedshift.tools.artifacts import ARCHIVE, artifact_files, extract
from fedshift.tools.positions import Number, Table, cells, moved, numbers, said, tables

PROVENANCE = "provenance.yaml"


class Render(Strict):
    """One command that writes markdown from the folder's artifacts (``{dir}``: the folder)."""

    command: str
    writes: list[str] = Field(default_factory=list, description="files the command writes")
    stdout: str | None = Field(None, description="file the command's output goes to")


class Provenance(Strict):
    what: str = Field(min_length=1, description="what the numbers are")
    not_: str = Field(alias="not", min_length=1, description="what they are not")
    machine: str = Field(min_length=1)
    commit: str = Field(pattern=r"^[0-9a-f]{7,40}$", description="code the runs were made with")
    date: datetime.date
    commands: list[str] = Field(min_length=1, description="the commands that made the artifacts")
    render: list[Render] = Field(default_factory=list)
    gpu_record: bool = Field(False, description="a GPU run that cannot be redone here")
    reproduces: list[str] = Field(
        default_factory=list,
        description="the papers' tables and figures the folder reproduces, e.g. fedrc/table1"
        " (docs/reproducing.md's coverage, fedshift.tools.coverage)",
    )

    @field_validator("commit", mode="before")
    @classmethod
    def _quoted(cls, value: object) -> object:
        if isinstance(value, int | float):  # YAML reads an all-digit hash as a number
            raise ValueError("write the commit in quotes (YAML read this hash as a number)")
        return value

    def generated(self) -> list[str]:
        return [f for r in self.render for f in ([r.stdout] if r.stdout else r.writes)]


def load_provenance(folder: Path) -> Provenance:
    path = Path(folder) / PROVENANCE
    if not path.is_file():
        raise FedshiftError(f"{folder}: no {PROVENANCE}; a results folder says where it came from")
    try:
        return Provenance.model_validate(yaml.safe_load(path.read_text()) or {})
    except (ValidationError, yaml.YAMLError) as err:
        first = str(err).splitlines()
        raise FedshiftError(f"{path}: {' '.join(first[:3])}") from None


# ---------------------------------------------------------------- numbers in markdown


RUN_FILES = ("summary.json", "metrics.jsonl", "config.yaml")


def artifact_values(folder: Path, generated: list[str] = ()) -> list[float]:
    """The numbers a results folder vouches for, sorted: those of its rendered markdown (which
    ``render`` re-makes from the runs' files) and of its benchmark JSON files, packed or loose (a
    run's own ``summary.json``, ``metrics.jsonl`` and ``config.yaml`` back the rendered tables,
    not prose: their thousands of per-round values would match almost any number by chance)."""
    folder = Path(folder)
    values: list[float] = []

    def walk(x) -> None:
        if isinstance(x, bool):
            return
        if isinstance(x, int | float):
            values.append(float(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for rel, data in artifact_files(folder, ".json").items():
        if PurePosixPath(rel).name not in RUN_FILES:
            walk(json.loads(data))
    for name in generated:
        values += [n.value for n in numbers((folder / name).read_text())]
    return sorted(values)


def backed(n: Number, values: list[float]) -> bool:
    """Whether some value prints as ``n`` at its precision (as is, or a fraction as %)."""
    tol = 0.5 * 10.0**-n.decimals * (1 + 1e-9) + 1e-12
    for target in (n.value, n.value / 100):
        t = tol if target == n.value else tol / 100
        i = bisect.bisect_left(values, target - t)
        if i < len(values) and values[i] <= target + t:
            return True
    return False


def unbacked(text: str, values: list[float]) -> list[Number]:
    return [n for n in numbers(text) if not backed(n, values)]


# ---------------------------------------------------------------- rendering

#: runs the ``fedshift`` command in this process on an argument list and returns its exit code;
#: the command line passes its own (``fedshift results``), a test ``fedshift.cli.app``'s
Fedshift = Callable[[list[str]], int | None]


def _run(command: str, folder: Path, root: Path, fedshift: Fedshift) -> str:
    """Run one render command in this process; its standard output."""
    argv = [a.replace("{dir}", str(folder)) for a in shlex.split(command)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.chdir(root):
        if argv[0] == "fedshift":
            try:  # without standalone mode a command's exit code comes back, not raised
                code = fedshift(argv[1:])
            except SystemExit as e:
                code = e.code
            if code:
                raise FedshiftError(f"render command failed ({code}): {command}")
        elif argv[0] == "python" and argv[1].endswith(".py"):
            old, old_path = sys.argv, list(sys.path)
            sys.argv = argv[1:]
            sys.path.insert(0, str((root / argv[1]).parent))  # as `python X.py` has it
            try:
                runpy.run_path(str(root / argv[1]), run_name="__main__")
            finally:
                sys.argv, sys.path[:] = old, old_path
        else:
            raise FedshiftError(
                f"render command must be `fedshift ...` or `python X.py`: {command}"
            )
    return buf.getvalue()


def rendered(folder: Path, root: Path, fedshift: Fedshift) -> dict[str, str]:
    """The text each rendered file of the folder has when its render commands run now, from its
    artifacts: rendered into a copy (with the archive unpacked into it, so that the commands
    read the runs at their usual paths), the folder left as it is."""
    folder = Path(folder)
    prov = load_provenance(folder)
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / folder.name
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns(ARCHIVE))
        extract(folder, target)
        for r in prov.render:
            out = _run(r.command, target.resolve(), root, fedshift)
            if r.stdout:
                (target / r.stdout).write_text(out)
        return {f: (target / f).read_text() for f in prov.generated()}


def render(folder: Path, root: Path, fedshift: Fedshift, check: bool = False) -> list[str]:
    """Re-render the folder's markdown from its artifacts. With ``check``, render into a copy
    and return the generated files whose text differs from the committed ones (else the files
    written; a packed folder renders in an unpacked copy too, and gets the files back)."""
    folder = Path(folder)
    prov = load_provenance(folder)
    if check or (folder / ARCHIVE).is_file():
        now = rendered(folder, root, fedshift)
        if check:
            return [f for f, text in now.items() if _committed(folder, f) != text]
        for f, text in now.items():
            (folder / f).parent.mkdir(parents=True, exist_ok=True)
            (folder / f).write_text(text)
        return prov.generated()
    for r in prov.render:
        out = _run(r.command, folder.resolve(), root, fedshift)
        if r.stdout:
            (folder / r.stdout).write_text(out)
    return prov.generated()


def _committed(folder: Path, name: str) -> str | None:
    path = folder / name
    return path.read_text() if path.is_file() else None


# ---------------------------------------------------------------- checks


def placed(
    text: str,
    rendered_tables: dict[str, list[Table]],
    values: list[float],
    where: str,
    rows: bool = True,
) -> list[str]:
    """Problems of the hand-written markdown ``text`` (``LINE: ...``). A table cell whose row
    label and column header a rendered table also has must hold that rendered cell's numbers,
    at the printed precision; where a rendered table has its row but not its column, the
    numbers of that row. The rendered tables are those of the files (keys of
    ``rendered_tables``) its section names, or all where it names none. Every other number
    (prose, and cells of rows no rendered table has) must be held by some artifact
    (``values``) of ``where``; with ``rows`` (a folder's notes), a prose number of a sentence
    that names one rendered row label must be that row's, where another row holds it
    (:func:`fedshift.tools.positions.said`)."""
    problems = []
    for first, section in sections(text):
        named = [f for f in rendered_tables if re.search(rf"(?<![\w/-]){re.escape(f)}", section)]
        references = [t for f in named or rendered_tables for t in rendered_tables[f]]
        tied = set()
        for cell in cells(section, references):
            if not cell.placed():
                continue
            tied |= {(cell.line, n.text) for n in numbers(cell.text)}
            if not cell.matches():
                held = f"{cell.at[0]} there" if cell.at else "not in that row"
                problems.append(
                    f"{first + cell.line - 1}: row {cell.row!r}, column {cell.column!r}:"
                    f" {cell.text} published, {held} in the rendered tables of {where}"
                )
        for s in said(section, references) if rows else []:
            if s.in_row():  # else held by an artifact (no other row's) or wrong (another's)
                tied.add((s.number.line, s.number.text))
            if not s.matches():
                held = ", ".join(n.text for n in s.held[:8]) + (" ..." if len(s.held) > 8 else "")
                problems.append(
                    f"{first + s.number.line - 1}: row {s.row!r}: {s.number.text} published,"
                    f" the row holds {held or 'no number'} in the rendered tables of {where}"
                )
        problems += [
            f"{first + n.line - 1}: {n.text} is in no artifact of {where}"
            for n in unbacked(section, values)
            if (n.line, n.text) not in tied
        ]
    return problems


def check_folder(
    folder: Path, root: Path | None = None, render_with: Fedshift | None = None
) -> list[str]:
    """Problems of one results folder: its provenance; with ``render_with`` (the ``fedshift``
    command) its rendered files against what its artifacts render to now, number by number at
    its position (a table's row and column, the order of the prose); its hand-written markdown
    (:func:`placed`) against the rendered tables (those rendered now, or the committed ones)
    and its artifacts."""
    folder = Path(folder)
    try:
        prov = load_provenance(folder)
    except FedshiftError as err:
        return [str(err)]
    problems = [
        f"{folder}/{f}: rendered file missing"
        for f in prov.generated()
        if not (folder / f).is_file()
    ]
    if problems:
        return problems
    committed = {f: (folder / f).read_text() for f in prov.generated()}
    now = committed if render_with is None else rendered(folder, root or Path("."), render_with)
    for f, text in committed.items():
        if text != now[f]:
            problems += [f"{folder}/{f}:{m}" for m in moved(text, now[f])] or [
                f"{folder}/{f}: differs from what its artifacts render to"
            ]
    try:
        values = artifact_values(folder, prov.generated())
    except FedshiftError as err:
        return [str(err)]
    references = {f: tables(text) for f, text in now.items()}
    for path in sorted(folder.rglob("*.md")):
        if str(path.relative_to(folder)) not in prov.generated():
            found = placed(path.read_text(), references, values, folder.name)
            problems += [f"{path}:{p}" for p in found]
    return problems


_CITE = re.compile(r"benchmarks/results/([\w.\-]+)")


def sections(text: str) -> list[tuple[int, str]]:
    """The markdown split at its headings (outside code): (first line, text) per section."""
    lines = text.splitlines(keepends=True)
    starts, fence = [0], False
    for i, line in enumerate(lines):
        fence ^= line.startswith("```")
        if i and not fence and line.startswith("#"):
            starts.append(i)
    starts.append(len(lines))
    return [(a + 1, "".join(lines[a:b])) for a, b in zip(starts, starts[1:], strict=False) if b > a]


Cited = dict[str, tuple[list[float], dict[str, list[Table]]]]


def check_document(
    path: Path, results: Path, text: str | None = None, cache: Cited | None = None
) -> list[str]:
    """Problems of a document that quotes results (the README), or of ``text`` as that document:
    in each section, a table cell whose row and column a rendered table of a results folder the
    section cites also has must hold that cell's numbers; every other number must be held by
    the artifacts of the folders the section cites (:func:`placed`). ``cache`` keeps each
    cited folder's values and tables between calls."""
    problems = []
    cache = {} if cache is None else cache
    text = Path(path).read_text() if text is None else text
    for first, section in sections(text):
        cited = sorted({m.group(1).split("/")[0] for m in _CITE.finditer(section)})
        values: list[float] = []
        references: dict[str, list[Table]] = {}
        for name in cited:
            folder = results / name
            if not (folder / PROVENANCE).is_file():
                problems.append(f"{path}:{first}: cites {folder}, which has no {PROVENANCE}")
                continue
            if name not in cache:
                # a rendered file that is missing is the folder's problem (check_folder)
                made = [f for f in load_provenance(folder).generated() if (folder / f).is_file()]
                texts = {f: (folder / f).read_text() for f in made}
                found = {f"{name}/{f}": tables(t) for f, t in texts.items()}
                cache[name] = (artifact_values(folder, made), found)
            values += cache[name][0]
            references |= cache[name][1]
        values.sort()
        where = ", ".join(cited) or "no results folder"
        for p in placed(section, references, values, where, rows=False):
            line, rest = p.split(":", 1)
            problems.append(f"{path}:{first + int(line) - 1}:{rest}")
    return problems


def default_documents(root: Path) -> list[Path]:
    """The documents that may quote results: the README and every page of the documentation
    site (``docs/**/*.md``)."""
    root = Path(root)
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def check_all(
    root: Path, documents: list[Path] | None = None, render_with: Fedshift | None = None
) -> list[str]:
    """Every results folder under ``root/benchmarks/results`` (with ``render_with``, the
    ``fedshift`` command to render with, also against what its artifacts render to now:
    :func:`check_folder`) and the documents that quote them (default: the README and every
    ``docs/**/*.md``)."""
    results = root / "benchmarks" / "results"
    problems = []
    for folder in sorted(p for p in results.iterdir() if not p.name.startswith(".")):
        if not folder.is_dir():
            problems.append(f"{folder}: a result outside a results folder (no provenance)")
            continue
        problems += check_folder(folder, root, render_with)
    for doc in documents if documents is not None else default_documents(root):
        problems += check_document(doc, results)
    return problems
