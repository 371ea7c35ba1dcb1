"""The bounded JSON reader (gguf_exact/formats/bounded_json.py): its depth scan against a
plain one-byte-at-a-time reference, its limits against the safetensors library's own,
and the lines it refuses with."""

import json
import random
import struct

import pytest
from safetensors import SafetensorError, safe_open

from gguf_exact.errors import InputError
from gguf_exact.formats import bounded_json
from gguf_exact.formats.bounded_json import MAX_DEPTH, parse_json, read_side_file, too_deep_at
from gguf_exact.formats.gguf_layout import LayoutError, parse_header


def reference_too_deep_at(raw: bytes, limit: int) -> int | None:
    """The same answer, one byte at a time: the JSON string rules, written out."""
    depth, in_string, escaped = 0, False, False
    for i, byte in enumerate(raw):
        c = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return i
        elif c in "]}":
            depth -= 1
    return None


@pytest.mark.parametrize(
    "text, at",
    [
        ("[" * 3, 2),  # the third bracket goes past 2
        ('["[[[[", "{{{{"]', None),  # brackets in strings do not count
        (r'["\"[[[", 1]', None),  # an escaped quote does not end the string
        (r'["\\", [[1]]]', 8),  # an escaped backslash does: the quote after it closes the string
        (r'["\\\"[[", 1]', None),  # three backslashes: the quote is escaped
        ('{"a": {"b": [1, 2]}}', 12),
        ('{"a": {"b": 1}, "c": [2]}', None),
    ],
)
def test_depth_scan_counts_brackets_outside_strings(text, at):
    assert too_deep_at(text.encode(), 2) == at
    assert reference_too_deep_at(text.encode(), 2) == at


def test_depth_scan_agrees_with_the_reference_across_chunk_boundaries(monkeypatch):
    """Backslash runs, strings and depth carried from one chunk to the next: chunks of 1 to 7
    bytes over random texts of brackets and strings of brackets, escaped quotes and
    escaped backslashes (a backslash outside a string ends the parser: not generated)."""
    rng = random.Random(42)

    def string() -> str:
        return (
            '"' + "".join(rng.choice(["a", "[", "{", "]", "\\\\", '\\"', ":"]) for _ in range(rng.randrange(8))) + '"'
        )

    def text() -> bytes:
        return "".join(rng.choice(["[", "{", "]", "}", ",", string()]) for _ in range(rng.randrange(1, 60))).encode()

    # a run of backslashes across chunks: an even one closes the string, an odd one escapes the quote
    runs = [b'["' + b"\\" * n + b'", "[[[[[[", [[[[[[' for n in (33, 34)]
    texts = [text() for _ in range(400)] + runs
    assert [reference_too_deep_at(t, 3) for t in runs] == [41, 51]  # the brackets after, or those after the next string
    for chunk in range(1, 8):
        monkeypatch.setattr(bounded_json, "_SCAN_CHUNK", chunk)
        for limit in (0, 1, 3):
            for text in texts:
                assert too_deep_at(text, limit) == reference_too_deep_at(text, limit), (chunk, limit, text)


def _safetensors_with_header(tmp_path, header: bytes):
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1])
def test_the_depth_limit_is_the_safetensors_librarys(tmp_path, depth):
    """The library parses a header nested MAX_DEPTH levels (to find it is no header), and
    refuses one more with its own recursion limit; so does parse_json."""
    header = b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    path = _safetensors_with_header(tmp_path, header)
    with pytest.raises(SafetensorError) as library:
        safe_open(str(path), framework="numpy")
    if depth == MAX_DEPTH:
        assert "recursion limit" not in str(library.value)
        assert parse_json(header, "h") == {"x": json.loads(b"[" * (depth - 1) + b"]" * (depth - 1))}
    else:
        assert "recursion limit exceeded" in str(library.value)
        with pytest.raises(InputError) as ours:
            parse_json(header, "h")
        at = len(b'{"x":') + 126  # the 127th [ is the 128th level
        assert str(ours.value) == f"h: JSON nested deeper than 127 levels (at byte {at}); no model file nests so deep"


def test_integers_up_to_20_digits_are_read_longer_ones_are_named():
    assert parse_json(b'{"a": [18446744073709551615, -99999999999999999999]}', "f") == {"a": [2**64 - 1, -(10**20 - 1)]}
    with pytest.raises(InputError) as err:
        parse_json(b'{"a": {"b": [1, 123456789012345678901]}}', "f")
    assert str(err.value) == "f: a.b[1]: an integer of 21 digits, more than the 20 of any 64-bit count, size or offset"
    # a long run of digits in a string is text, not a number
    assert parse_json(b'{"sha": "' + b"1" * 64 + b'", "n": 3}', "f") == {"sha": "1" * 64, "n": 3}


def test_a_side_file_is_refused_from_its_size_without_being_read(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_bytes(b"{}" + b" " * (bounded_json.MAX_SIDE_FILE_BYTES - 2))
    assert read_side_file(path, "config.json") == b"{}" + b" " * (bounded_json.MAX_SIDE_FILE_BYTES - 2)
    with path.open("ab") as f:
        f.write(b" ")
    with pytest.raises(InputError) as err:
        read_side_file(path, "config.json")
    assert str(err.value) == (
        f"{path}: 16,777,217 bytes, more than the 16,777,216 a config.json may hold; replace it with the model's own"
    )


def test_text_that_is_not_utf8_is_one_line():
    with pytest.raises(InputError) as err:
        parse_json(b'{"a": "\xff"}', "f")
    assert str(err.value) == "f: not UTF-8 text (byte 7), so not JSON"


def test_a_name_from_the_file_is_shown_on_one_line():
    """A key with a newline or an escape sequence in it cannot break the one line, or
    reach the terminal as a control sequence."""
    with pytest.raises(InputError) as err:
        parse_json(b'{"a\\nb\\u001b[2J": 1' + b"0" * 30 + b"}", "f")
    assert str(err.value) == (
        "f: a\\nb\\x1b[2J: an integer of 31 digits, more than the 20 of any 64-bit count, size or offset"
    )
    key = "nested\narrays".encode()
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    header += struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 3 + struct.pack("<IQ", 0, 0)
    with pytest.raises(LayoutError) as err:
        parse_header(header)
    assert str(err.value) == "key nested\\narrays: an array of arrays, which llama.cpp does not load"
