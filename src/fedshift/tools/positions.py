"""Numbers in markdown and where they stand: a table cell (its row label and column header) or
prose (its order in the text).

:mod:`fedshift.tools.provenance` checks published numbers with these: a rendered file number by
number against what its artifacts render to now, a hand-written table cell by cell against the
rendered cell of the same row and column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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


def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group(0))


def numbers(text: str) -> list[Number]:
    """The numbers of markdown ``text`` that read as measurements: with a decimal point or a
    thousands separator, outside code blocks, inline code and comments; a comma list such as
    ``89.6,81.3`` gives each of its decimals, a version such as ``2.14.1`` or a section such
    as ``§7.7`` nothing. A minus
    counts as a sign only after a space or bracket (``0.4-0.75`` is a range)."""
    text = _INLINE.sub(_blank, _CODE.sub(_blank, text))
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


def same_printed(published: Number, artifact: Number) -> bool:
    """Whether ``published`` is ``artifact`` at the coarser of their two precisions (45.9 is
    45.87 printed with one decimal; 45.88 is not 45.87), as is or a fraction as %."""
    tol = 0.5 * 10.0 ** -min(published.decimals, artifact.decimals) * (1 + 1e-9) + 1e-12
    return any(
        abs(value - artifact.value) <= t
        for value, t in ((published.value, tol), (published.value / 100, tol / 100))
    )


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class Row:
    line: int
    cells: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[Row, ...]


_SEPARATOR = re.compile(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def _cells(line: str) -> tuple[str, ...]:
    """The cells of a table line (``|`` inside inline code or escaped does not split)."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    cells, cell, code = [], "", False
    for i, ch in enumerate(body):
        code ^= ch == "`"
        if ch == "|" and not code and (i == 0 or body[i - 1] != "\\"):
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return (*cells, cell.strip())


def _table_lines(text: str) -> list[tuple[int, str]]:
    """The (line number, line) of text outside code blocks and comments that start with ``|``."""
    text = _CODE.sub(_blank, text)
    return [(i, s) for i, s in enumerate(text.splitlines(), 1) if s.lstrip().startswith("|")]


def tables(text: str) -> list[Table]:
    """The markdown tables of ``text``: a header line, a ``|---|`` line, then rows (each with
    its line number), outside code blocks."""
    out: list[Table] = []
    block: list[tuple[int, str]] = []
    for item in [*_table_lines(text), (-1, "")]:
        if block and item[0] == block[-1][0] + 1:
            block.append(item)
            continue
        if len(block) >= 2 and _SEPARATOR.fullmatch(block[1][1].strip()):
            rows = tuple(Row(i, _cells(s)) for i, s in block[2:])
            out.append(Table(_cells(block[0][1]), rows))
        block = [item]
    return out


def prose(text: str) -> str:
    """``text`` with its table lines blanked: what is left is prose (and code, headings)."""
    blank = {i for i, _ in _table_lines(text)}
    return "\n".join("" if i in blank else s for i, s in enumerate(text.split("\n"), 1))


def label(cell: str) -> str:
    """A cell as a key: without emphasis, code marks and link targets, spaces collapsed,
    lower case."""
    cell = _LINK.sub(r"\1", cell).replace("**", "").replace("`", "")
    return " ".join(cell.split()).lower()


def locate(table: Table, row: Row, column: int, references: list[Table]) -> list[str]:
    """The cells of ``references`` at the row and column of ``row``'s cell ``column`` in
    ``table``: rows with the same label (first cell) in tables with the same column header,
    whose other cells without a number agree where the two tables share a column header (so
    that ``FedAvg | defaults`` and ``FedAvg | prox`` are told apart)."""
    header, key = label(table.header[column]), label(row.cells[0])
    found = []
    for ref in references:
        names = [label(h) for h in ref.header]
        if header not in names:
            continue
        k = names.index(header)
        shared = [
            (i, names.index(label(h)))
            for i, h in enumerate(table.header)
            if 0 < i < len(row.cells)
            and i != column
            and label(h) in names
            and not numbers(row.cells[i])
        ]
        for other in ref.rows:
            cells = other.cells
            if k >= len(cells) or not cells or label(cells[0]) != key:
                continue
            if all(m < len(cells) and label(row.cells[i]) == label(cells[m]) for i, m in shared):
                found.append(cells[k])
    return found


def family(row: Row, references: list[Table]) -> list[str]:
    """The cells of the ``references`` rows labelled as ``row`` is, or as a variant of it
    (``FedAvg (re-split)`` for ``FedAvg``)."""
    key = label(row.cells[0])
    return [
        cell
        for ref in references
        for other in ref.rows
        if other.cells and (label(other.cells[0]) + " (").startswith(key + " (")
        for cell in other.cells
    ]


def same_cell(published: str, artifact: str) -> bool:
    """Whether the numbers of the ``published`` cell are those of the ``artifact`` cell, in
    order, at the printed precision (the published cell may leave trailing ones out, such as
    a ``±`` spread)."""
    ours, theirs = numbers(published), numbers(artifact)
    return len(ours) <= len(theirs) and all(map(same_printed, ours, theirs))


@dataclass(frozen=True)
class Cell:
    """A published table cell with numbers, and the reference cells at its row and column
    (``at``); where no reference has both, those of its row (``row_cells``)."""

    line: int
    row: str
    column: str
    text: str
    at: tuple[str, ...]
    row_cells: tuple[str, ...]

    def placed(self) -> bool:
        """Whether a reference has this cell's row (and, with ``at``, its column)."""
        return bool(self.at or self.row_cells)

    def matches(self) -> bool:
        if self.at:
            return any(same_cell(self.text, ref) for ref in self.at)
        held = [n for cell in self.row_cells for n in numbers(cell)]
        return all(any(same_printed(n, m) for m in held) for n in numbers(self.text))


def cells(text: str, references: list[Table]) -> list[Cell]:
    """Every table cell of ``text`` that holds a number, with the cells of ``references`` at its
    row label and column header, or where none has that column, those of its row (none where
    no reference has that row)."""
    out = []
    for table in tables(text):
        for row in table.rows:
            for j, cell in enumerate(row.cells[1 : len(table.header)], 1):
                if numbers(cell):
                    at = tuple(locate(table, row, j, references))
                    same_row = () if at else tuple(family(row, references))
                    out.append(Cell(row.line, row.cells[0], table.header[j], cell, at, same_row))
    return out


def moved(published: str, rendered: str) -> list[str]:
    """Where the ``published`` text of a rendered file holds other numbers than the text its
    artifacts render to now: per table cell (``LINE: row R, column C: P published, A rendered``,
    tables and rows taken in order) and per number of the prose, in order. Empty when the two
    differ in no number at its position, or differ in shape (other tables, rows or prose
    numbers: the caller names the file)."""
    ours, theirs = tables(published), tables(rendered)
    out = []
    if [(t.header, len(t.rows)) for t in ours] != [(t.header, len(t.rows)) for t in theirs]:
        ours, theirs = [], []  # another shape: no cell stands for another
    for table, ref in zip(ours, theirs, strict=True):
        for row, other in zip(table.rows, ref.rows, strict=True):
            pairs = zip(row.cells[: len(table.header)], other.cells, strict=False)
            for j, (cell, want) in enumerate(pairs):
                if cell != want and (numbers(cell) or numbers(want)):
                    where = f"row {row.cells[0]!r}, column {table.header[j]!r}"
                    out.append(f"{row.line}: {where}: {cell} published, {want} rendered")
    words, rendered_words = numbers(prose(published)), numbers(prose(rendered))
    if len(words) != len(rendered_words):
        return out
    return out + [
        f"{n.line}: {n.text} published where the artifacts render {m.text} (prose)"
        for n, m in zip(words, rendered_words, strict=True)
        if n.text != m.text
    ]
