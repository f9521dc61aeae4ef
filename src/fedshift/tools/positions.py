"""Numbers in markdown and where they stand: a table cell (its row label and column header) or
prose (its order in the text).

:mod:`fedshift.tools.provenance` checks published numbers with these: a rendered file number by
number against what its artifacts render to now, a hand-written table cell by cell against the
rendered cell of the same row and column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


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
    return list(_numbers(text))


@lru_cache(maxsize=1 << 16)
def _numbers(text: str) -> tuple[Number, ...]:
    """:func:`numbers` as a tuple, kept for the next call with the same text (a cell is read
    many times)."""
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
    return tuple(out)


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


@lru_cache(maxsize=1 << 16)
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


def family(row: Row, references: list[Table]) -> list[Row]:
    """The ``references`` rows labelled as ``row`` is, or as a variant of it (``FedAvg
    (re-split)`` for ``FedAvg``)."""
    key = label(row.cells[0])
    return [
        other
        for ref in references
        for other in ref.rows
        if other.cells and (label(other.cells[0]) + " (").startswith(key + " (")
    ]


def _from(other: Row, k: int) -> str:
    """The cells of ``other`` from its ``k``-th on, as one cell (a published cell may join two
    rendered ones: ``98.08 / 95.49`` for ``train acc %`` and ``test acc %``)."""
    return " | ".join(other.cells[k:])


def kin(row: Row, ref: Table, variant: str) -> list[Row]:
    """The rows of ``ref`` labelled as ``row`` is followed by ``variant`` (`` (re-split)``; or
    a longer variant ending so: `` (true count, re-split)``), or, where there is none, as
    ``row`` is."""
    key = label(row.cells[0])
    names = [(o, label(o.cells[0])) for o in ref.rows if o.cells]
    rows = [o for o, name in names if name == key + variant]
    rows = rows or [
        o
        for o, name in names
        if variant and name.startswith(key + " (") and name.endswith(", " + variant[2:])
    ]
    return rows or [o for o, name in names if name == key]


def renamed(table: Table, column: int, references: list[Table]) -> tuple[Table, int, str] | None:
    """The rendered column a column whose header no reference has stands for: the one (a
    reference table, its column and a row variant such as `` (re-split)``) at which most of its
    cells hold the numbers of their row's rendered cell; None where no cell does."""
    rows = [r for r in table.rows if column < len(r.cells) and numbers(r.cells[column])]
    best, most = None, 0
    for ref in references:
        variants = {""} | {
            label(o.cells[0])[len(label(r.cells[0])) :] for r in rows for o in family(r, [ref])
        }
        for variant in sorted(variants):
            for k in range(1, len(ref.header)):
                hits = sum(
                    any(same_cell(r.cells[column], _from(o, k)) for o in kin(r, ref, variant))
                    for r in rows
                )
                if hits > most:
                    best, most = (ref, k, variant), hits
    return best


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


def transposed(table: Table) -> Table:
    """``table`` read the other way: its header's cells (after the first) are the row labels,
    its first column the header; row ``k`` stands for the table's column ``k`` (at line ``k``:
    its cells come from several lines)."""
    rows = tuple(
        Row(k, (name, *(r.cells[k] if k < len(r.cells) else "" for r in table.rows)))
        for k, name in enumerate(table.header[1:], 1)
    )
    return Table((table.header[0], *(r.cells[0] if r.cells else "" for r in table.rows)), rows)


def _cells_of(
    table: Table, references: list[Table], lines: tuple[int, ...] | None = None
) -> list[Cell]:
    """The cells of one table with numbers, tied to ``references`` (:func:`cells`); a cell's
    line is its row's, or with ``lines`` (a transposed table) that of its column ``j``:
    ``lines[j - 1]``."""
    out, columns = [], {}
    for row in table.rows:
        for j, cell in enumerate(row.cells[1 : len(table.header)], 1):
            if not numbers(cell):
                continue
            at = tuple(locate(table, row, j, references))
            if not at and family(row, references):
                if j not in columns:
                    columns[j] = renamed(table, j, references)
                if columns[j]:
                    ref, k, variant = columns[j]
                    at = tuple(_from(o, k) for o in kin(row, ref, variant))
            same_row = () if at else tuple(c for o in family(row, references) for c in o.cells)
            line = row.line if lines is None else lines[j - 1]
            out.append(Cell(line, row.cells[0], table.header[j], cell, at, same_row))
    return out


def cells(text: str, references: list[Table]) -> list[Cell]:
    """Every table cell of ``text`` that holds a number, with the cells of ``references`` at its
    row label and column header, or where none has that column, those of its row (none where
    no reference has that row). A table none of whose cells a reference places is read
    transposed (:func:`transposed`: its header holds row labels, its first column headers)
    where that places some."""
    out = []
    for table in tables(text):
        found = _cells_of(table, references)
        if table.rows and not any(c.placed() for c in found):
            lines = tuple(r.line for r in table.rows)
            flipped = _cells_of(transposed(table), references, lines)
            found = flipped if any(c.placed() for c in flipped) else found
        out += found
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


# ---------------------------------------------------------------- prose

_SENTENCE_END = re.compile(
    r"(?<=[.!?;:])[ \t]+(?=[A-Z*(\[`])|\n[ \t]*\n|\n(?=[ \t]*(?:[-*+]|\d+\.)\s)"
)


def sentences(text: str) -> list[tuple[int, str]]:
    """The sentences of the prose of ``text`` (its tables blanked) with the line each starts
    on: split after ``.``, ``!``, ``?``, ``;`` or ``:`` before a capital, at blank lines and
    where a list item starts (so a bullet is a sentence of its own)."""
    text = prose(text)
    out, start = [], 0
    for m in [*_SENTENCE_END.finditer(text), None]:
        end = m.start() if m else len(text)
        if text[start:end].strip():
            out.append((text.count("\n", 0, start) + 1, text[start:end]))
        start = m.end() if m else end
    return out


def named(sentence: str, labels: set[str]) -> str | None:
    """The one row label (with a letter) that ``sentence`` names as whole words, a longer
    label standing for the shorter ones it holds (``FedAvg (re-split)`` names not ``FedAvg``);
    None where it names none or several."""
    plain = label(sentence)
    hits = {
        key
        for key in labels
        if re.search("[a-z]", key) and re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", plain)
    }
    hits = {key for key in hits if not any(key != other and key in other for other in hits)}
    return hits.pop() if len(hits) == 1 else None


@dataclass(frozen=True)
class Said:
    """A prose number of a sentence that names one rendered row, and that row's numbers."""

    number: Number
    row: str
    held: tuple[Number, ...]
    others: tuple[Number, ...]

    def in_row(self) -> bool:
        return any(same_printed(self.number, m) for m in self.held)

    def matches(self) -> bool:
        """Whether the row holds the number, or no other row does (then the number is not a
        row's: a setting, a paper's value, another round's, which the artifacts must hold)."""
        return self.in_row() or not any(same_printed(self.number, m) for m in self.others)


def _base(key: str) -> str:
    """A row label without its variant or run: ``fedavg`` for ``fedavg (re-split)`` and for
    ``fedavg/lr0.06-seed0``."""
    key = key.split(" (")[0]
    run = key.split("/")
    return run[0] if len(run) == 2 and re.match(r"lr[\d.]+-seed\d", run[1]) else key


def said(text: str, references: list[Table]) -> list[Said]:
    """Every prose number of ``text`` in a sentence that names exactly one row label of
    ``references`` (:func:`named`), with the numbers of the rows so labelled (any column)."""
    rows: dict[str, list[Number]] = {}
    for ref in references:
        for row in ref.rows:
            if row.cells:
                rows.setdefault(_base(label(row.cells[0])), []).extend(
                    n for c in row.cells[1:] for n in numbers(c)
                )
    out = []
    for first, sentence in sentences(text):
        key = named(sentence, {k for k, held in rows.items() if held and not re.search(r"\d", k)})
        if key is None:
            continue
        for n in numbers(sentence):
            at = Number(n.text, n.value, n.decimals, first + n.line - 1)
            others = tuple(m for other, held in rows.items() if other != key for m in held)
            out.append(Said(at, key, tuple(rows[key]), others))
    return out
