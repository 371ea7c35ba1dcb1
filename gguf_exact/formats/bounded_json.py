"""Input files opened and JSON parsed within bounds: size, nesting depth, integer length.

Every JSON an input brings (a safetensors header, ``config.json``, the shard index) goes
through :func:`parse_json`, and every input file is opened by :func:`open_input`, so a
hostile file is refused in one line naming it (and the field, where there is one):

- **Size**: a side file (``config.json``, the index) is read only up to
  :data:`MAX_SIDE_FILE_BYTES`, never whole: a 3 GB sparse ``config.json`` is refused from
  its size, not read into 6 GB of memory.
- **Depth**: Python's json parser recurses once per ``[`` or ``{``; 200,000 of them raise
  ``RecursionError`` from deep inside it (or overflow the C stack of a thread with a small
  one). Catching that after the fact would trust a blown stack to unwind cleanly, so the
  depth is measured *before* the text reaches the parser (:func:`too_deep_at`), by one
  linear, vectorised pass that skips brackets inside strings, and the parser only ever
  sees text at most :data:`MAX_DEPTH` deep.
- **Integers**: Python refuses to convert an integer of more than 4,300 digits
  (``ValueError``, sys.int_info.str_digits_check_threshold), and converting one costs time
  quadratic in its length. No count, size or offset these files hold needs more than the
  20 digits of a 64-bit integer (:data:`MAX_INT_DIGITS`).
"""

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from gguf_exact.errors import InputError

# The deepest nesting the safetensors library's own parser takes (serde_json's recursion
# limit, 128): safetensors 0.8.0 parses a header 127 levels deep and refuses 128, measured.
# A safetensors header is 3 deep, a config.json 4 or 5, an index 2.
MAX_DEPTH = 127
MAX_INT_DIGITS = 20  # 18,446,744,073,709,551,615 (2**64 - 1) has 20
MAX_SIDE_FILE_BYTES = 16 << 20  # config.json is a few KB; an index of 100,000 tensors is under 10 MB

_SCAN_CHUNK = 1 << 18  # bytes per vectorised step: a few MB of temporaries, whatever the text's size
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (MAX_INT_DIGITS + 1))


def shown(name: str, limit: int = 120) -> str:
    """A name from an input (a key, a field) as a one-line message may show it: characters
    that are not printable (a newline, an escape sequence) escaped as ``repr`` escapes
    them, and at most ``limit`` characters."""
    if not name.isprintable():
        name = repr(name)[1:-1]
    return name if len(name) <= limit else name[: limit - 3] + "..."


def open_input(path: Path, where: str | None = None) -> int:
    """A read-only descriptor on the input ``path``, or one line saying why it cannot be
    read (permission denied, an I/O error); ``where`` names it in messages (default: the
    path). The caller closes it."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as err:
        raise InputError(f"{where or path}: cannot be read ({err.strerror})") from None


def read_at(fd: int, n: int, offset: int, where: str | Path) -> bytes:
    """Up to ``n`` bytes at ``offset`` (fewer only where the file ends)."""
    parts, done = [], 0
    try:
        while done < n:
            part = os.pread(fd, min(n - done, 1 << 24), offset + done)
            if not part:
                break
            parts.append(part)
            done += len(part)
    except OSError as err:
        raise InputError(f"{where}: cannot be read ({err.strerror})") from None
    return b"".join(parts)


def read_side_file(path: Path, what: str, hint: str = "replace it with the model's own") -> bytes:
    """The bytes of a small JSON file of a model folder (``what``: config.json, the index),
    refused from its size, before any of it is read, when over :data:`MAX_SIDE_FILE_BYTES`."""
    fd = open_input(path)
    try:
        size = os.fstat(fd).st_size
        # one byte more than the limit at most: a size that lies (a growing file) still stops here
        raw = read_at(fd, MAX_SIDE_FILE_BYTES + 1, 0, path)
    finally:
        os.close(fd)
    if max(size, len(raw)) > MAX_SIDE_FILE_BYTES:
        raise InputError(
            f"{path}: {max(size, len(raw)):,} bytes, more than the {MAX_SIDE_FILE_BYTES:,} a {what} may hold; {hint}"
        )
    return raw


def too_deep_at(raw: bytes, limit: int = MAX_DEPTH) -> int | None:
    """The byte offset at which JSON text ``raw`` first nests deeper than ``limit``, or None.

    Brackets inside strings do not count: a quote opens or closes a string unless an odd
    run of backslashes comes before it. On valid JSON this is exact; past the first
    invalid byte it may be wrong either way, but the parser stops there too, so it never
    goes deeper than this scan has seen. Vectorised (numpy, a chunk at a time): a Python
    loop over a 100 MB header would take minutes."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None
    data = np.frombuffer(raw, dtype=np.uint8)
    depth, quotes, backslash_run = 0, 0, 0  # carried from one chunk to the next
    for start in range(0, len(data), _SCAN_CHUNK):
        chunk = data[start : start + _SCAN_CHUNK]
        index = np.arange(len(chunk))
        # the index of the last byte at or before each that is not a backslash
        last_other = np.maximum.accumulate(np.where(chunk == _BACKSLASH, -1 - backslash_run, index))
        run_before = index - 1 - np.concatenate(([-1 - backslash_run], last_other[:-1]))
        opens_or_closes = (chunk == _QUOTE) & (run_before % 2 == 0)
        in_string = (quotes + np.cumsum(opens_or_closes)) % 2 == 1
        levels = depth + np.cumsum(np.where(in_string, 0, _BRACKET_STEP[chunk]), dtype=np.int64)
        over = np.flatnonzero(levels > limit)
        if over.size:
            return start + int(over[0])
        depth, quotes = int(levels[-1]), quotes + int(opens_or_closes.sum())
        backslash_run = len(chunk) - 1 - int(last_other[-1])
    return None


class _LongInteger:
    """Stands in, while parsing, for an integer too long to convert."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _first_long_integer(value: Any, path: str = "") -> tuple[str, _LongInteger] | None:
    """The first :class:`_LongInteger` in ``value`` and where it is, as ``a.b[3]`` (the
    depth is bounded: this recursion is safe)."""
    if isinstance(value, _LongInteger):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        here = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{shown(key, 80)}"
        found = _first_long_integer(item, here)
        if found is not None:
            return found
    return None


def parse_json(raw: bytes, where: str | Path) -> Any:
    """JSON text (UTF-8 bytes) as Python values, or one line naming ``where`` and, for a
    number too long, the field: invalid JSON, not UTF-8, nested deeper than
    :data:`MAX_DEPTH`, an integer of more than :data:`MAX_INT_DIGITS` digits."""
    deep = too_deep_at(raw)
    if deep is not None:
        raise InputError(
            f"{where}: JSON nested deeper than {MAX_DEPTH} levels (at byte {deep:,}); no model file nests so deep"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{where}: not UTF-8 text (byte {err.start:,}), so not JSON") from None

    def parse_int(digits: str) -> int | _LongInteger:
        n = len(digits.lstrip("-"))
        return int(digits) if n <= MAX_INT_DIGITS else _LongInteger(n)

    # the default parser, unless a run of digits too long for an integer is somewhere (if only in a string)
    long_digits = _LONG_DIGITS.search(raw) is not None
    try:
        value = json.loads(text, parse_int=parse_int) if long_digits else json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{where}: not valid JSON ({err})") from None
    found = _first_long_integer(value) if long_digits else None
    if found is not None:
        field, number = found
        raise InputError(
            f"{where}: {field.lstrip('.') or 'the value'}: an integer of {number.digits:,} digits, more than"
            f" the {MAX_INT_DIGITS} of any 64-bit count, size or offset"
        )
    return value


def read_json_file(path: Path, what: str) -> Any:
    """A model folder's small JSON file (``what``: how messages call it), read within
    :data:`MAX_SIDE_FILE_BYTES` and parsed by :func:`parse_json`."""
    return parse_json(read_side_file(path, what), path)
