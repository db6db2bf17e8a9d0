"""Jupyter notebooks as one program: all code cells together, magics kept verbatim.

A notebook is migrated like a module made of its code cells in order (an import in
the first cell serves the fifth), so the engine sees one program. IPython syntax that
is not Python (``%magic``, ``!shell``, ``x = !cmd``, ``obj?``) is swapped for a
placeholder statement before parsing and swapped back afterwards; cells run by a cell
magic (``%%bash``, ``%%time``, ...) are left out whole. Only the ``source`` of cells
whose code changed is replaced; the JSON is written back in the layout it was read
in (indent, key order, escaping), or not at all.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from dataclasses import dataclass
from typing import Any

# A statement, not a comment, marks where a cell starts: rewrites may drop or move
# comments, but never delete an unrelated expression statement.
_MARKER = "__ampmigrate_cell__({})"
_MARKER_LINE = re.compile(r"^__ampmigrate_cell__\((\d+)\)\n", re.MULTILINE)
_PLACEHOLDER = "pass  # __ampmigrate_magic_{}__"
_PLACEHOLDER_LINE = re.compile(r"^([ \t]*)pass  # __ampmigrate_magic_(\d+)__$", re.MULTILINE)
# Line magics, shell escapes, help (`?obj`, `obj?`) and assignments from them.
_MAGIC_LINE = re.compile(r"^[ \t]*(?:[%!?]|[\w.]+\?\??[ \t]*$|[\w., \t]+=[ \t]*[%!])")
_RESERVED = "__ampmigrate_"
_FUTURE_LINE = re.compile(r"^from[ \t]+__future__[ \t]+import[ \t]")
# IPython runs a line that starts with a magic's or an alias's name without its `%` (automagic,
# on by default): `cat metrics.json`, `ls data/`, `pip install x`. Such a line is taken for a magic
# only where it is not Python (it does not compile alone), so `ls = []` or `cd(x)` stay code.
_AUTOMAGIC_LINE = re.compile(
    r"^[ \t]*(?:cat|cp|ldir|lf|lk|ll|ls|lx|mkdir|mv|rm|rmdir|clear|less|more|man|cd|pwd|pip|conda|mamba|env|"
    r"set_env|load_ext|reload_ext|matplotlib|time|timeit|run|who|whos|history|bookmark|pushd|popd|dhist|sx|"
    r"system|alias|reset|xdel|config|autoreload|aimport|tensorboard|load|writefile)[ \t]+"
    # IPython's assignment check comes first: `ls = ...` and `cat, dog = ...` are Python
    r"(?![=,])\S"
)


class NotebookError(Exception):
    """The notebook cannot be read, or its migration cannot be put back safely."""


@dataclass(frozen=True)
class CellSpan:
    """Where one code cell's text sits in the program (program lines are 1-based)."""

    cell: int  # index in the notebook's cell list, 0-based
    first_line: int
    line_count: int


@dataclass(frozen=True)
class Layout:
    """How a notebook's JSON was written: what json.dumps needs to write it the same way."""

    indent: int | None
    ensure_ascii: bool
    final_newline: bool
    bom: bool
    crlf: bool

    def render(self, data: Any) -> str:
        text = json.dumps(data, indent=self.indent, ensure_ascii=self.ensure_ascii)
        text += "\n" if self.final_newline else ""
        # JSON strings escape their newlines, so every raw one is layout.
        text = text.replace("\n", "\r\n") if self.crlf else text
        return "\ufeff" + text if self.bom else text


@dataclass
class Notebook:
    """A parsed notebook and what is needed to write it back unchanged elsewhere."""

    data: dict[str, Any]
    layout: Layout | None  # None: no json.dumps settings reproduce the file

    @property
    def cells(self) -> list[dict[str, Any]]:
        return self.data["cells"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Program:
    """The code cells joined into one module, with the way back to the cells."""

    text: str
    spans: tuple[CellSpan, ...]
    magics: tuple[str, ...]  # original lines, by placeholder number
    # placeholders of the lines a magic continues onto (`!cmd \`): put back exactly as they were
    continued: frozenset[int] = frozenset()

    def locate(self, line: int) -> tuple[int, int]:
        """Map a program line to (1-based cell number, line within the cell)."""
        for span in reversed(self.spans):
            if line >= span.first_line:
                return span.cell + 1, max(1, line - span.first_line + 1)
        first = self.spans[0]
        return first.cell + 1, 1


def load(data: bytes) -> Notebook:
    """Parse notebook bytes; raise NotebookError when they are not a notebook."""
    bom = data.startswith(b"\xef\xbb\xbf")
    try:
        text = data.decode("utf-8-sig" if bom else "utf-8")
        parsed = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise NotebookError(f"not a readable notebook: {error}") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("cells"), list):
        raise NotebookError("not a notebook: no list of cells (nbformat 4 is required)")
    for cell in parsed["cells"]:
        if not isinstance(cell, dict) or not isinstance(cell.get("source", ""), (str, list)):
            raise NotebookError("not a notebook: a cell has no readable source")
    return Notebook(parsed, _detect_layout(text, parsed, bom))


def is_python(notebook: Notebook) -> bool:
    """Whether the notebook's kernel runs Python (notebooks that do not say are taken to)."""
    metadata = notebook.data.get("metadata") or {}
    language = (metadata.get("language_info") or {}).get("name") or (metadata.get("kernelspec") or {}).get("language")
    return language is None or str(language).lower() in {"python", "python3", "ipython"}


def cell_source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def to_program(notebook: Notebook) -> Program | None:
    """Join the migratable code cells; None when there are none."""
    parts: list[str] = []
    spans: list[CellSpan] = []
    magics: list[str] = []
    continued: set[int] = set()
    line = 1
    for index, cell in enumerate(notebook.cells):
        if cell.get("cell_type") != "code":
            continue
        source = cell_source(cell)
        if source.lstrip().startswith("%%"):
            continue  # a cell magic decides how the whole cell runs: not ours to touch
        if _RESERVED in source:
            raise NotebookError(f"cell {index + 1} contains the reserved name {_RESERVED!r}")
        if spans:  # the first cell needs no marker: whatever comes first is its
            parts.append(_MARKER.format(index) + "\n")
            line += 1
        body = _hide_magics(source, magics, continued, later=bool(spans))
        if body and not body.endswith("\n"):
            body += "\n"
        spans.append(CellSpan(index, line, body.count("\n")))
        parts.append(body)
        line += body.count("\n")
    if not spans:
        return None
    return Program("".join(parts), tuple(spans), tuple(magics), frozenset(continued))


def _hide_magics(source: str, magics: list[str], continued: set[int], *, later: bool = False) -> str:
    """``source`` with its magic lines as placeholders (kept in ``magics``); in a ``later`` cell,
    also its ``from __future__`` imports: IPython compiles each cell alone, where they stand
    first, but they would stop the joined program from parsing."""
    lines = source.splitlines(keepends=True)
    number = 0
    while number < len(lines):
        text = lines[number]
        future = later and _FUTURE_LINE.match(text) is not None and not _inside_statement(text)
        # `% 2)` continuing an open bracket is Python, not a magic.
        if (future or _MAGIC_LINE.match(text) or _is_automagic(text)) and not _inside_statement(
            "".join(lines[:number])
        ):
            content = text.rstrip("\r\n")
            ending = text[len(content) :]
            indent = content[: len(content) - len(content.lstrip(" \t"))]
            lines[number] = indent + _PLACEHOLDER.format(len(magics)) + ending
            magics.append(content.lstrip(" \t"))
            # IPython joins a magic's backslash-continued lines into one command: each becomes a
            # placeholder at the magic's indent (one per line, so line numbers hold)
            while content.endswith("\\") and number + 1 < len(lines):
                number += 1
                content = lines[number].rstrip("\r\n")
                continued.add(len(magics))
                lines[number] = indent + _PLACEHOLDER.format(len(magics)) + lines[number][len(content) :]
                magics.append(content)
        number += 1
    return "".join(lines)


def _is_automagic(line: str) -> bool:
    """``cat /content/metrics.json``: a magic or alias called without its ``%``, not Python."""
    if not _AUTOMAGIC_LINE.match(line) or _inside_statement(line):
        return False
    try:
        compile(line.strip(), "<cell line>", "exec", dont_inherit=True)
    except SyntaxError:
        return True
    except ValueError:  # a NUL byte
        return False
    return False


def _inside_statement(text: str) -> bool:
    """Whether ``text`` ends inside a bracket, a string or a backslash continuation."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except tokenize.TokenError:  # "EOF in multi-line statement/string"
        return True
    except (SyntaxError, ValueError):  # other IPython syntax the tokenizer rejects
        return False
    return False


def from_program(notebook: Notebook, program: Program, migrated: str) -> dict[int, str]:
    """Split the migrated program back into cells: {cell index: new source} for changed cells.

    Raises NotebookError when the cell markers or magic placeholders did not survive
    the migration exactly once each, in order: then the notebook is not rewritten.
    """
    pieces = _MARKER_LINE.split(migrated)
    # split() with one group gives: first cell, index, text, index, text, ...
    indices = [int(value) for value in pieces[1::2]]
    texts = [pieces[0], *pieces[2::2]]
    expected = [span.cell for span in program.spans]
    if [expected[0], *indices] != expected:
        raise NotebookError("the migrated code could not be split back into its cells")
    seen: list[int] = []

    def restore(match: re.Match[str]) -> str:
        number = int(match.group(2))
        seen.append(number)
        if number in program.continued:
            return program.magics[number]
        return match.group(1) + program.magics[number]

    changed: dict[int, str] = {}
    for span, text in zip(program.spans, texts):
        original = cell_source(notebook.cells[span.cell])
        restored = _PLACEHOLDER_LINE.sub(restore, text)
        if not original.endswith("\n") and restored.endswith("\n"):
            restored = restored[:-1]
        if not _starts_blank(original) and _starts_blank(restored):
            # the cell's first statement went (`from apex import amp`): so does the blank line after it
            lines = restored.splitlines(keepends=True)
            while lines and not lines[0].strip():
                lines.pop(0)
            restored = "".join(lines)
        if restored != original:
            changed[span.cell] = restored
    if sorted(seen) != list(range(len(program.magics))):
        raise NotebookError("an IPython magic line could not be put back where it was")
    return changed


def _starts_blank(source: str) -> bool:
    first = source.split("\n", 1)[0]
    return bool(source) and not first.strip()


def dump(notebook: Notebook, sources: dict[int, str]) -> bytes:
    """The notebook's bytes with the given cell sources replaced, layout kept."""
    if notebook.layout is None:
        raise NotebookError("the notebook's JSON layout cannot be reproduced, so it is not rewritten")
    for index, source in sources.items():
        cell = notebook.cells[index]
        # nbformat stores source as a list of lines or as one string; keep whichever it was.
        cell["source"] = source.splitlines(keepends=True) if isinstance(cell.get("source"), list) else source
    return notebook.layout.render(notebook.data).encode("utf-8")


def _detect_layout(text: str, parsed: Any, bom: bool) -> Layout | None:
    """The json.dumps settings that reproduce ``text`` exactly, if there are any."""
    crlf = "\r\n" in text
    final_newline = text.endswith("\n")
    for indent in (1, 2, 4, None):
        for ensure_ascii in (False, True):
            layout = Layout(indent, ensure_ascii, final_newline, False, crlf)
            if layout.render(parsed) == text:
                return Layout(indent, ensure_ascii, final_newline, bom, crlf)
    return None
