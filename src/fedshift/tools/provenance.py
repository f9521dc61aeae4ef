"""Published numbers and the artifacts they come from.

A results folder (``benchmarks/results/<name>/``) holds ``provenance.yaml`` (what the numbers
are and are not, the machine, the commit, the commands that made the runs and the commands
that render the markdown from them), the small per-run artifacts (``config.yaml``,
``metrics.jsonl``, ``summary.json``, or a benchmark's JSON), packed into ``artifacts.tar.xz``
(:mod:`fedshift.tools.artifacts`) or still loose, and the markdown rendered from them. Two
checks keep published numbers honest:

- ``render(folder, check=True)`` re-renders the folder's markdown from its artifacts into a
  copy (with the archive unpacked into it, so the render commands read the runs at the same
  paths) and names every file that differs from the committed one;
- ``unbacked(text, values)`` lists the numbers of a piece of markdown (prose or tables: every
  number with a decimal point or a thousands separator, outside code) that no artifact holds
  at the precision printed. A section of the README or of a documentation page
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
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml
from pydantic import Field, ValidationError, field_validator

from fedshift.config.base import Strict
from fedshift.core.errors import FedshiftError
from fedshift.tools.artifacts import ARCHIVE, artifact_files, extract

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


@dataclass(frozen=True)
class Number:
    text: str
    value: float
    decimals: int
    line: int


_CODE = re.compile(r"```.*?```|<!--.*?-->", re.S)
_INLINE = re.compile(r"`[^`\n]*`")
_RAW = re.compile(r"(?<![\w.§])([-−]?)(\d[\d.,]*\d|\d)")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = re.compile(r"\d+\.\d+")


def numbers(text: str) -> list[Number]:
    """The numbers of markdown ``text`` that read as measurements: with a decimal point or a
    thousands separator, outside code blocks, inline code and comments; a comma list such as
    ``89.6,81.3`` gives each of its decimals, a version such as ``2.14.1`` or a section such
    as ``§7.7`` nothing. A minus
    counts as a sign only after a space or bracket (``0.4-0.75`` is a range)."""

    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    text = _INLINE.sub(blank, _CODE.sub(blank, text))
    out = []
    for m in _RAW.finditer(text):
        sign, body = m.group(1), m.group(2)
        if sign and m.start() > 0 and text[m.start() - 1] not in " \t\n(|[":
            sign = ""
        line = text.count("\n", 0, m.start()) + 1
        parts = [body] if _THOUSANDS.fullmatch(body) else body.split(",")
        for i, part in enumerate(parts):
            if not (_THOUSANDS.fullmatch(part) or _DECIMAL.fullmatch(part)):
                continue
            digits = part.replace(",", "")
            decimals = len(digits.split(".")[1]) if "." in digits else 0
            s = sign if i == 0 else ""
            out.append(Number(s + part, float(digits) * (-1 if s else 1), decimals, line))
    return out


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


def render(folder: Path, root: Path, fedshift: Fedshift, check: bool = False) -> list[str]:
    """Re-render the folder's markdown from its artifacts. With ``check``, render into a copy
    and return the generated files whose text differs from the committed ones (else the files
    written; a packed folder renders in an unpacked copy too, and gets the files back)."""
    folder = Path(folder)
    prov = load_provenance(folder)
    with tempfile.TemporaryDirectory() as tmp:
        target = folder
        if check or (folder / ARCHIVE).is_file():  # a packed folder renders from a copy
            target = Path(tmp) / folder.name
            shutil.copytree(folder, target, ignore=shutil.ignore_patterns(ARCHIVE))
            extract(folder, target)
        for r in prov.render:
            out = _run(r.command, target.resolve(), root, fedshift)
            if r.stdout:
                (target / r.stdout).write_text(out)
        if not check:
            if target != folder:
                for f in prov.generated():
                    (folder / f).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(target / f, folder / f)
            return prov.generated()
        return [
            f
            for f in prov.generated()
            if not (folder / f).is_file() or (folder / f).read_text() != (target / f).read_text()
        ]


# ---------------------------------------------------------------- checks


def check_folder(folder: Path) -> list[str]:
    """Problems of one results folder: its provenance, and every number of its hand-written
    markdown that its artifacts do not hold."""
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
    try:
        values = artifact_values(folder, prov.generated())
    except FedshiftError as err:
        return [str(err)]
    for path in sorted(folder.rglob("*.md")):
        if str(path.relative_to(folder)) in prov.generated():
            continue
        for n in unbacked(path.read_text(), values):
            problems.append(f"{path}:{n.line}: {n.text} is in no artifact of {folder.name}")
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


def check_document(path: Path, results: Path) -> list[str]:
    """Problems of a document that quotes results (the README): each section's numbers must be
    held by the artifacts of the results folders it cites."""
    problems = []
    cache: dict[str, list[float]] = {}
    for first, text in sections(Path(path).read_text()):
        cited = sorted({m.group(1).split("/")[0] for m in _CITE.finditer(text)})
        values: list[float] = []
        for name in cited:
            folder = results / name
            if not (folder / PROVENANCE).is_file():
                problems.append(f"{path}:{first}: cites {folder}, which has no {PROVENANCE}")
                continue
            if name not in cache:
                cache[name] = artifact_values(folder, load_provenance(folder).generated())
            values += cache[name]
        values.sort()
        where = ", ".join(cited) or "no results folder"
        for n in unbacked(text, values):
            line = first + n.line - 1
            problems.append(f"{path}:{line}: {n.text} is in no artifact of {where}")
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
    ``fedshift`` command to render with, also whether its tables re-render to the committed
    text) and the documents that quote them (default: the README and every ``docs/**/*.md``)."""
    results = root / "benchmarks" / "results"
    problems = []
    for folder in sorted(p for p in results.iterdir() if not p.name.startswith(".")):
        if not folder.is_dir():
            problems.append(f"{folder}: a result outside a results folder (no provenance)")
            continue
        found = check_folder(folder)
        problems += found
        if render_with is not None and not found:
            problems += [
                f"{folder}/{f}: differs from what its artifacts render to"
                for f in render(folder, root, render_with, check=True)
            ]
    for doc in documents if documents is not None else default_documents(root):
        problems += check_document(doc, results)
    return problems
