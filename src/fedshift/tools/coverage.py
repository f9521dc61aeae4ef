"""The reproduction coverage of the four papers: every table and result figure, with its status,
rendered into ``docs/reproducing.md`` between two markers (``fedshift results coverage``) and
checked by ``fedshift results check``.

Nothing of the status is written by hand. The list of the papers' tables and figures is fixed
(``fedshift/studies/papers/coverage.yaml``: id, title, whether it reports numbers, and the
reasons); per entry ``paper/id`` (``fedrc/table1``):

- **re-run** when a results folder's ``provenance.yaml`` lists it under ``reproduces``; the
  scale (columns, runs, clients, rounds, seeds) is read from the folder's run configs;
- **runnable** when a registered reproduce table is named ``<paper>-<id>`` (``fedrc-table1``),
  or the entry's ``run`` commands name only registered reproduce tables and configs that exist;
- **not implemented** otherwise, with the entry's ``missing`` reason.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml
from pydantic import Field, ValidationError

from fedshift.config.base import Strict
from fedshift.core.errors import FedshiftError
from fedshift.studies.papers import TABLES
from fedshift.tools.artifacts import artifact_files
from fedshift.tools.provenance import PROVENANCE, load_provenance

CATALOGUE = Path(__file__).resolve().parents[1] / "studies" / "papers" / "coverage.yaml"
PAGE = PurePosixPath("docs/reproducing.md")
START = "<!-- coverage:start -->"
END = "<!-- coverage:end -->"
PAPERS = {"fedrc": "FedRC", "fednh": "FedNH", "dfl": "DFL", "feddaa": "FedDAA"}
REPRODUCED, RUNNABLE, MISSING, SETTING = (
    "re-run",
    "runnable, not run",
    "not implemented",
    "not a result",
)
_KEY = re.compile(r"([a-z]+)-((?:table|fig)\d+)")


class Entry(Strict):
    """One table or figure of a paper, as ``coverage.yaml`` lists it."""

    id: str = Field(pattern=r"^(table|fig)\d+$")
    title: str = Field(min_length=1)
    numbers: bool | None = Field(None, description="reports numbers (default: a table does)")
    result: bool = Field(True, description="false: a setting, not a result")
    run: list[str] = Field(default_factory=list, description="commands that would make it")
    not_run: str = Field("", description="why it (or part of it) was not run")
    missing: str = Field("", description="what a not-implemented entry lacks")


@dataclass(frozen=True)
class Item:
    """A catalogue entry of one paper."""

    paper: str
    entry: Entry

    @property
    def ref(self) -> str:
        """``paper/id``, as a provenance.yaml's ``reproduces`` names it."""
        return f"{self.paper}/{self.entry.id}"

    @property
    def kind(self) -> str:
        return "table" if self.entry.id.startswith("table") else "figure"

    @property
    def numbers(self) -> bool:
        return self.entry.numbers if self.entry.numbers is not None else self.kind == "table"

    @property
    def label(self) -> str:
        name = PAPERS.get(self.paper, self.paper)
        if self.kind == "table":
            return f"{name} Table {self.entry.id.removeprefix('table')}"
        return f"{name} Fig. {self.entry.id.removeprefix('fig')}"


@dataclass(frozen=True)
class Row:
    """An item with its derived status: how to run it and where its numbers are."""

    item: Item
    status: str
    how: tuple[str, ...]
    notes: str


def load_catalogue(path: Path = CATALOGUE) -> list[Item]:
    """The papers' tables and figures, in the file's order."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
        items = [
            Item(paper, Entry.model_validate(e)) for paper, entries in data.items() for e in entries
        ]
    except (ValidationError, yaml.YAMLError, AttributeError, TypeError) as err:
        raise FedshiftError(f"{path}: {' '.join(str(err).splitlines()[:3])}") from None
    refs = [i.ref for i in items]
    twice = sorted({r for r in refs if refs.count(r) > 1})
    if twice:
        raise FedshiftError(f"{path}: {', '.join(twice)} listed twice")
    return items


def registered(tables: Mapping[str, object] | None = None) -> dict[str, str]:
    """``paper/id`` -> the reproduce table named ``<paper>-<id>`` (others, e.g. ``baselines``,
    reproduce no paper table)."""
    tables = TABLES if tables is None else tables
    return {f"{m[1]}/{m[2]}": key for key in tables if (m := _KEY.fullmatch(key))}


def declared(results: Path) -> dict[str, list[str]]:
    """Results folder name -> the ``paper/id`` its provenance.yaml ``reproduces``."""
    out = {}
    for folder in sorted(p for p in Path(results).iterdir() if (p / PROVENANCE).is_file()):
        try:
            out[folder.name] = list(load_provenance(folder).reproduces)
        except FedshiftError:  # results check reports a broken provenance on its own
            continue
    return out


def command_problems(commands: list[str], root: Path, tables: Mapping[str, object]) -> list[str]:
    """What a ``run`` command names that does not exist: a reproduce table not registered, a
    config file not in the repository."""
    problems = []
    for command in commands:
        argv = shlex.split(command)
        if argv[:2] == ["fedshift", "reproduce"] and (len(argv) < 3 or argv[2] not in tables):
            problems.append(f"`{command}`: no reproduce table {argv[2] if len(argv) > 2 else ''}")
        for arg in argv:
            if arg.endswith((".yaml", ".yml")) and not (Path(root) / arg).is_file():
                problems.append(f"`{command}`: no config {arg}")
    return problems


def _runs_of(folder: Path, key: str | None, tables: Mapping[str, object]) -> dict[str, list[dict]]:
    """Column -> the run configs of the folder that make the table ``key``: those under a
    top-level ``<runs key>-<column>/``, else anywhere under one, else all of the folder's
    (grouped by dataset)."""
    configs = {
        rel: yaml.safe_load(data) or {}
        for rel, data in artifact_files(folder, "config.yaml").items()
        if PurePosixPath(rel).name == "config.yaml"
    }
    table = tables.get(key) if key else None
    prefix = (getattr(table, "runs", "") or key) if table is not None else None
    columns = list(getattr(table, "configs", {})) if table is not None else []
    names = {f"{prefix}-{c}": c for c in columns}
    for anywhere in (False, True):
        found: dict[str, list[dict]] = defaultdict(list)
        for rel, config in configs.items():
            parts = PurePosixPath(rel).parts
            for part in parts if anywhere else parts[:1]:
                if part in names:
                    found[names[part]].append(config)
                    break
        if found:
            return dict(sorted(found.items()))
    found = defaultdict(list)
    for config in configs.values():
        found[str((config.get("scenario") or {}).get("dataset", "runs"))].append(config)
    return dict(sorted(found.items()))


def _span(values: set[int]) -> str:
    return str(min(values)) if len(values) == 1 else f"{min(values)}-{max(values)}"


def scale(folder: Path, key: str | None, tables: Mapping[str, object]) -> str:
    """What a folder ran of a table, per column: runs, clients, rounds and seeds, read from
    its run configs."""
    parts = []
    for column, configs in _runs_of(folder, key, tables).items():
        clients = {int((c.get("scenario") or {}).get("num_clients") or 0) for c in configs}
        rounds = {int((c.get("train") or {}).get("rounds") or 0) for c in configs}
        seeds = {c.get("seed") for c in configs}
        n = len(seeds)
        parts.append(
            f"`{column}`: {len(configs)} run{'s' * (len(configs) != 1)}, {_span(clients)} clients,"
            f" {_span(rounds)} rounds, {n} seed{'s' * (n != 1)}"
        )
    return "; ".join(parts) or "no run configs"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "/")


def coverage_rows(
    root: Path,
    items: list[Item] | None = None,
    tables: Mapping[str, object] | None = None,
) -> list[Row]:
    """Every item with its status derived from the results folders under ``root`` and the
    registered reproduce tables (default: ``fedshift.studies.papers.TABLES``)."""
    tables = TABLES if tables is None else tables
    items = load_catalogue() if items is None else items
    results = Path(root) / "benchmarks" / "results"
    by_ref: dict[str, list[str]] = defaultdict(list)
    for folder, refs in declared(results).items():
        for ref in refs:
            by_ref[ref].append(folder)
    keys = registered(tables)
    rows = []
    for item in items:
        e, key = item.entry, keys.get(item.ref)
        how = (f"fedshift reproduce {key}",) if key else tuple(e.run)
        runnable = bool(key) or bool(e.run and not command_problems(e.run, root, tables))
        if by_ref.get(item.ref):
            where = [
                f"`benchmarks/results/{f}` ({scale(results / f, key, tables)})"
                for f in by_ref[item.ref]
            ]
            rest = f"; not run: {e.not_run}" if e.not_run else ""
            rows.append(Row(item, REPRODUCED, how, "; ".join(where) + rest))
        elif runnable:
            rows.append(Row(item, RUNNABLE, how, e.not_run or "(no reason given in coverage.yaml)"))
        elif not e.result:
            rows.append(Row(item, SETTING, (), e.missing))
        else:
            rows.append(Row(item, MISSING, (), e.missing or "(nothing given in coverage.yaml)"))
    return rows


def counts(rows: list[Row]) -> dict[str, dict[str, int]]:
    """Per paper, the tables that report numbers: how many in all and per status."""
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.item.kind == "table" and row.item.numbers:
            paper = out.setdefault(row.item.paper, {"tables": 0})
            paper["tables"] += 1
            paper[row.status] = paper.get(row.status, 0) + 1
    return out


def coverage_markdown(rows: list[Row]) -> str:
    """The generated block of docs/reproducing.md (without its markers)."""
    tables = [r for r in rows if r.item.kind == "table" and r.item.numbers]
    figures = [r for r in rows if r.item.kind == "figure"]

    def tally(rs: list[Row]) -> str:
        return "; ".join(
            f"{sum(r.status == s for r in rs)} {s}" for s in (REPRODUCED, RUNNABLE, MISSING)
        )

    per_paper = ", ".join(f"{PAPERS.get(p, p)} {c['tables']}" for p, c in counts(rows).items())
    lines = [
        "<!-- generated by `fedshift results coverage` from"
        " src/fedshift/studies/papers/coverage.yaml, the reproduce tables and the results"
        " folders' provenance.yaml; do not edit -->",
        "",
        f"**{len(tables)} tables with numbers** ({per_paper}): {tally(tables)}."
        f" **{len(figures)} figures with results**: {tally(figures)}.",
        "",
        "| table / figure | what it shows | status | how to run | where, at which scale / why not |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        status = f"**{r.status}**" if r.status == REPRODUCED else r.status
        how = "<br>".join(f"`{_cell(c)}`" for c in r.how) or "-"
        lines.append(
            f"| {r.item.label} | {_cell(r.item.entry.title)} | {status} | {how} | {_cell(r.notes)} |"
        )
    return "\n".join(lines) + "\n"


def _split(text: str, where: str) -> tuple[str, str, str]:
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise FedshiftError(f"{where}: no {START} ... {END} block (once each, in that order)")
    head, rest = text.split(START)
    block, tail = rest.split(END)
    return head, block, tail


def page_block(root: Path) -> str:
    """The generated block as the page holds it now."""
    path = Path(root) / PAGE
    return _split(path.read_text(), str(path))[1].strip("\n") + "\n"


def write_page(root: Path, rows: list[Row] | None = None) -> bool:
    """Write the block into docs/reproducing.md between its markers; whether it changed."""
    path = Path(root) / PAGE
    text = path.read_text()
    head, _, tail = _split(text, str(path))
    block = coverage_markdown(coverage_rows(root) if rows is None else rows)
    new = f"{head}{START}\n{block}{END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text


def coverage_problems(
    root: Path,
    items: list[Item] | None = None,
    tables: Mapping[str, object] | None = None,
) -> list[str]:
    """What ``fedshift results check`` reports of the coverage: a results folder that declares
    a table or figure the catalogue does not list, a reproduce table named after one it does not
    list, a ``run`` command naming a table or config that does not exist, and a page whose
    generated block differs from what the sources render to now."""
    tables = TABLES if tables is None else tables
    try:
        items = load_catalogue() if items is None else items
    except FedshiftError as err:
        return [str(err)]
    known = {i.ref for i in items}
    results = Path(root) / "benchmarks" / "results"
    problems = [
        f"{results / folder}/provenance.yaml: reproduces {ref}, which is not a table or figure"
        f" of {CATALOGUE.name} (one of {', '.join(PAPERS)}, e.g. fedrc/table1)"
        for folder, refs in declared(results).items()
        for ref in refs
        if ref not in known
    ]
    problems += [
        f"reproduce table {key}: {ref} is not a table or figure of {CATALOGUE.name}"
        for ref, key in registered(tables).items()
        if ref not in known
    ]
    problems += [
        f"{CATALOGUE.name}: {i.ref}: {p}"
        for i in items
        for p in command_problems(i.entry.run, root, tables)
    ]
    try:
        stale = page_block(root) != coverage_markdown(coverage_rows(root, items, tables))
    except FedshiftError as err:
        return [*problems, str(err)]
    except FileNotFoundError:
        return [*problems, f"{Path(root) / PAGE}: missing"]
    if stale:
        problems.append(
            f"{Path(root) / PAGE}: the coverage block is out of date with its sources;"
            " run `fedshift results coverage`"
        )
    return problems
