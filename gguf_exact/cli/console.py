"""How the CLI prints: its two consoles, tables that fit the terminal, progress bars, figures.

Commands print results on :data:`out` (stdout) and notes, warnings and progress on
:data:`err` (stderr). Both are looked up at call time (``console.out``), so a test can
swap one for a console of another width.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import TYPE_CHECKING, Callable, cast

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:  # imported where used: a command off a terminal draws neither (`convert` in a script)
    from rich.console import JustifyMethod
    from rich.progress import Progress
    from rich.table import Table


def width() -> int | None:
    """The terminal's width on a terminal; off one (pipes, CI logs) ``$COLUMNS`` when set,
    else 160, so logs keep whole tensor names."""
    if sys.stdout.isatty():
        return None
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return 160


out = Console(highlight=False, width=width())
err = Console(stderr=True, highlight=False)


def say(line: str) -> None:
    """One line of a command's output on stdout, as it is (no markup, never cut)."""
    out.print(line, markup=False, soft_wrap=True)


_PIECE = re.compile(r"[^ /]*/|[^ /]+ *| +")  # where a line may break: after a space or a "/"


def fit(line: str, width: int, indent: str = "    ") -> list[str]:
    """``line`` as lines of at most ``width`` columns: broken after spaces, a path after a
    ``/``, a word longer than a line where it must; the lines after the first indented
    under the first's own indent plus ``indent``."""
    if len(line) <= width:
        return [line]
    lead = line[: len(line) - len(line.lstrip(" "))]
    lines, current = [], lead
    for piece in _PIECE.findall(line[len(lead) :]):
        if len(current) + len(piece.rstrip()) > width and current.strip():
            lines.append(current.rstrip())
            current, piece = lead + indent, piece.lstrip(" ")
        while len(current) + len(piece.rstrip()) > width:  # longer than a whole line
            room = width - len(current)
            lines.append(current + piece[:room])
            current, piece = lead + indent, piece[room:]
        current += piece
    if current.strip():
        lines.append(current.rstrip())
    return lines


def say_fitted(line: str, indent: str = "    ") -> None:
    """One line of output on stdout, wrapped to the console's width (:func:`fit`)."""
    for piece in fit(line, out.width, indent):
        say(piece)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def say_markdown(text: str) -> None:
    """Markdown text (a report's tables and notes) on stdout, fitted to the console: a
    table that fits is printed as it is; a wider one row by row, its first cell, then
    ``header value`` for the others, wrapped (:func:`fit`); other lines wrapped."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("|"):
            say_fitted(lines[i])
            i += 1
            continue
        table = []
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            table.append(lines[i])
            i += 1
        if max(map(len, table)) <= out.width:
            for row in table:
                say(row)
            continue
        header = _cells(table[0])
        for row in table[2:] if len(table) > 1 and set(table[1]) <= set("|-: ") else table[1:]:
            cells = _cells(row)
            say_fitted(cells[0])
            pairs = [f"{h} {c}" for h, c in zip(header[1:], cells[1:])]
            line = ""
            for n, pair in enumerate(pairs):
                piece = pair + (";" if n < len(pairs) - 1 else "")
                if line and len(line) + 1 + len(piece) > out.width:
                    say_fitted(line)
                    line = ""
                line = f"{line} {piece}" if line else f"  {piece}"  # a pair is never split between lines
            say_fitted(line)


def note(line: str) -> None:
    """One line on stderr, as it is: what a command found or chose, beside its output."""
    err.print(line, markup=False, soft_wrap=True)


def warn(text: str) -> None:
    """``warning: text`` on stderr."""
    err.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)


def error(text: str) -> None:
    """``error: text`` on stderr."""
    err.print(f"[bold red]error:[/] {escape(text)}", soft_wrap=True)


def progress_lines() -> Callable[[str], None]:
    """A callback that prints each progress line on stderr, on a terminal only."""
    return (lambda s: err.print(s, markup=False)) if err.is_terminal else (lambda s: None)


class _Bar:
    """A progress callback (:mod:`gguf_exact.progress`) drawing a bar over tensors."""

    def __init__(self, progress: Progress | None = None, task=None) -> None:
        self.progress, self.task = progress, task

    def start(self, total: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, total=total)

    def __call__(self, name: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=1, description=name)


@contextlib.contextmanager
def tensor_progress(label: str, enabled: bool = True):
    """A progress bar over tensors on stderr (only on a terminal); yields the callback
    to give the API call, which says how many tensors there are."""
    if not enabled or not err.is_terminal:
        yield _Bar()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        yield _Bar(progress, progress.add_task("", total=None))


@contextlib.contextmanager
def status(label: str):
    """A spinner on stderr naming the step under way (on a terminal only), for steps that
    take seconds (loading a model, generating); yields a callback that renames the step."""
    if not err.is_terminal:
        yield lambda _label: None
        return
    with err.status(escape(label)) as spinner:
        yield lambda next_label: spinner.update(escape(next_label))


def common_prefix(names: list[str]) -> str:
    """The longest dotted prefix (``model.language_model.``) that at least 80% of the
    names share, or "" when none is worth taking out."""
    counts: dict[str, int] = {}
    for name in names:
        for i, ch in enumerate(name[:-1]):
            if ch == ".":
                counts[name[: i + 1]] = counts.get(name[: i + 1], 0) + 1
    shared = [p for p, n in counts.items() if n >= max(2, 0.8 * len(names)) and len(p) >= 6]
    return max(shared, key=len, default="")


def shorten_middle(name: str, width: int) -> str:
    """``name`` in at most ``width`` columns: as it is, or its start and end with "…" for
    the middle, which tell names apart (``blk.12.`` … ``ffn_gate.weight``, a path's folder
    and file). rich cuts text only at its end (``overflow="ellipsis"``), hence this."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]


def _wrap_words(text: str, width: int) -> list[str]:
    """``text`` wrapped at its spaces to ``width``; a word longer than that shortened in
    the middle (:func:`shorten_middle`), never broken across lines."""
    lines: list[str] = []
    for word in text.split():
        word = shorten_middle(word, width)
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


_GAP = 2  # spaces between two columns of a compact table


class CompactTable:
    """A table narrowed to the console as plain lines (see :func:`fitted_table`)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def __rich_console__(self, console, options):
        from rich.text import Text

        for line in self.lines:
            yield Text(line, no_wrap=True, overflow="ignore")


def _narrow(widths: dict[int, int], floors: dict[int, int], excess: int) -> None:
    """Take ``excess`` columns off ``widths``, the widest first, none below its floor."""
    while excess > 0:
        room = [i for i in widths if widths[i] > floors[i]]
        if not room:
            return
        widest = max(room, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1


def _compact_lines(
    title: str, columns: list[tuple[str, str]], headers: list[str], cells: list[list[str]], wrap: tuple[int, ...]
) -> list[str]:
    """The lines of a compact table at the console's width: names (first column) never
    broken, each on the row's line when it fits the name column, else on a line of its own
    above the row's figures (shortened in the middle only when longer than a line); the
    other columns in ``wrap`` wrapped at spaces, headers before cells."""
    width = out.width
    names = [r[0] for r in cells]
    prefix = common_prefix(names)
    names = ["…" + n[len(prefix) :] if prefix and n.startswith(prefix) else n for n in names]
    others = range(1, len(columns))
    room = width - _GAP * (len(columns) - 1)

    def longest_word(text: str) -> int:
        return max((len(w) for w in text.split()), default=0)

    natural = {i: max([len(headers[i])] + [len(r[i]) for r in cells]) for i in others}
    cells_whole = {i: max([longest_word(headers[i])] + [len(r[i]) for r in cells]) for i in others}
    words_whole = {i: max([longest_word(headers[i])] + [longest_word(r[i]) for r in cells]) for i in others}
    for floors in (cells_whole, words_whole):
        for i in others:
            if i not in wrap:
                floors[i] = natural[i]
    name_need = max(len(n) for n in [headers[0], *names])
    widths = dict(natural)
    _narrow(widths, cells_whole, name_need + sum(widths.values()) - room)
    # cells wrap too when that puts every name on its row's line, or as far as the name header needs
    fits_all = name_need + sum(words_whole.values()) <= room
    _narrow(widths, words_whole, (name_need if fits_all else len(headers[0])) + sum(widths.values()) - room)
    name_width = min(name_need, room - sum(widths.values()))
    if name_width < len(headers[0]):  # not even the header fits: each row as its name, then header-value pairs
        lines = _wrap_words(title + (f" (… = {prefix})" if prefix else ""), width)
        for name, row in zip(names, cells):
            lines.append(shorten_middle(name, width))
            pairs = "; ".join(f"{h} {c}" for h, c in zip(headers[1:], row[1:]))
            lines += fit("  " + pairs, width)
        return lines
    widths[0] = name_width
    table_width = sum(widths.values()) + _GAP * (len(columns) - 1)

    def render(row: list[str]) -> list[str]:
        pieces = [[row[0]]] + [_wrap_words(row[i], widths[i]) if i in wrap else [row[i]] for i in others]
        height = max(map(len, pieces))
        lines = []
        for k in range(height):
            line = []
            for i, piece in enumerate(pieces):
                text = piece[k] if k < len(piece) else ""
                line.append(text.rjust(widths[i]) if columns[i][1] == "right" else text.ljust(widths[i]))
            lines.append((" " * _GAP).join(line).rstrip())
        return lines

    caption = _wrap_words(title, width)
    note = f"(… = {prefix})"
    if prefix and len(caption[-1]) + 1 + len(note) <= width:
        caption[-1] += " " + note
    elif prefix:
        caption.append(shorten_middle(note, width))
    lines = [line.center(table_width).rstrip() for line in caption]
    lines += render(headers) + ["─" * table_width]
    for name, row in zip(names, cells):
        if len(name) > name_width:
            lines.append(shorten_middle(name, width))
            name = ""
        lines += render([name, *row[1:]])
    return lines


def fitted_table(
    title: str,
    columns: list[tuple[str, str]],
    rows: Callable[[bool], list[list[str]]],
    wrap: tuple[int, ...] = (0,),
    compact_headers: list[str] | None = None,
) -> Table | CompactTable:
    """A table under ``columns`` ((header, justify) pairs) that fits the console.

    ``rows(compact)`` gives the cells, the first column a name. As it is when it fits;
    else a :class:`CompactTable`: figures as ``rows(True)`` gives them (fewer digits),
    headers as ``compact_headers`` gives them (shorter) when given, no rules but the one
    under the headers, the prefix most names share shown once in the title and as "…" in
    them, the other columns in ``wrap`` wrapped at spaces, and every name whole on a line:
    on its row's when it fits, else on one of its own above the row (a name longer than a
    line shortened in the middle, :func:`shorten_middle`)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.HEAVY_HEAD)
    for i, (header, justify) in enumerate(columns):
        # justify: one of rich's words ("left", "right"), as every caller's column list spells it
        table.add_column(header, justify=cast("JustifyMethod", justify), overflow="fold", no_wrap=i not in wrap)
    for row in rows(False):
        table.add_row(*row)
    if table.__rich_measure__(out, out.options).maximum <= out.width:
        return table
    headers = compact_headers or [header for header, _ in columns]
    return CompactTable(_compact_lines(title, columns, headers, rows(True), wrap))


def human_size(n: int) -> str:
    """``46,080`` -> ``45.0 KiB``; ``2,415,919,104`` -> ``2.25 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}" if unit == "GiB" else f"{n / size:,.1f} {unit}"
    return f"{n:,} B"


def pct(x: float | None, digits: int = 4) -> str:
    """A share as a percentage, ``-`` for none."""
    return "-" if x is None else f"{x:.{digits}%}"


def type_mix(types: dict[str, int]) -> str:
    """``{"Q4_0": 23, "F32": 26}`` -> ``F32 x26, Q4_0 x23``."""
    return ", ".join(f"{k} x{v}" for k, v in sorted(types.items()))
