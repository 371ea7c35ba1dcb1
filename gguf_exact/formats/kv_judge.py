"""A GGUF's key/value pairs held to the pairs its writer would write, as bytes.

Equal bytes mean the same key, the same value type and the same value, which is what
llama.cpp's loader reads (it checks types as well as values). Keys the plan cannot know
(a donor's tokenizer when no donor is given) are not judged; they are counted and named,
never passed over in silence.
"""

import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from gguf import GGUFValueType

from gguf_exact.errors import Message
from gguf_exact.formats.gguf_layout import KeyValue, pair_numbers, parse_pair

NUMERIC = {
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16, GGUFValueType.UINT32,
    GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
}  # fmt: skip
SHOWN_NAMES = 4  # key names shown in a "not judged" line
SHOWN_ELEMENTS = 8  # array elements shown in a message


@dataclass
class KeyJudgement:
    judged: int = 0  # keys compared with the plan and equal to it
    failures: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # one line per group of keys not judged (Messages)
    unchecked_keys: int = 0


def describe(kv: KeyValue) -> str:
    """A pair's value in words, short enough for one line."""
    if isinstance(kv.value, str):
        text = kv.value if len(kv.value) <= 60 else kv.value[:57] + "..."
        return f"{text!r} (STRING)"
    if not isinstance(kv.value, tuple):
        return f"{kv.value!r} ({kv.vtype.name})"
    sub, count = kv.value
    numbers = pair_numbers(kv)
    if numbers is None:
        return f"an array of {count:,} {sub.name}"
    shown = ", ".join(repr(x) for x in numbers[:SHOWN_ELEMENTS]) + (", ..." if count > SHOWN_ELEMENTS else "")
    return f"[{shown}] ({sub.name} array of {count:,})"


def _difference(kv: KeyValue, plan: KeyValue) -> str:
    """How a stored pair differs from the planned one: its value, or for two arrays of
    the same type and length (a vocabulary), the first element that differs."""
    if isinstance(kv.value, tuple) and kv.value == plan.value:
        ours, theirs = array_elements(kv), array_elements(plan)
        i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if i is not None:
            return f"({describe(kv)}) differs at element {i:,}: {ours[i]!r}, not {theirs[i]!r}"
    return f"is {describe(kv)}"


def array_elements(kv: KeyValue) -> list:
    """The elements of an array pair (strings as bytes); a message helper, not a parser
    for whole vocabularies on a hot path."""
    numbers = pair_numbers(kv)
    if numbers is not None:
        return numbers
    sub, count = kv.value
    if sub != GGUFValueType.STRING:
        return []
    pos = 8 + len(kv.key.encode()) + 4 + 4 + 8  # key, value type, element type, count
    out = []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", kv.raw, pos)
        out.append(kv.raw[pos + 8 : pos + 8 + n])
        pos += 8 + n
    return out


def judge_keys(
    pairs: list[KeyValue],
    expected: list[bytes],
    writer: str,
    not_judged: Callable[[str], str | None] = lambda key: None,
    version: tuple[int, int] | None = None,
) -> KeyJudgement:
    """Hold ``pairs`` (the file's, in order) to ``expected`` (raw pairs as ``writer``
    would write them). A file key that is not expected fails, unless ``not_judged(key)``
    gives a reason it cannot be judged here; keys with the same reason are one line.
    ``version``: (the file's GGUF version, the writer's), judged with the keys."""
    out = KeyJudgement()
    if version is not None and version[0] != version[1]:
        out.failures.append(f"GGUF version {version[0]}; {writer} writes version {version[1]}")
    want = {p.key: p for p in (parse_pair(raw) for raw in expected)}
    counts = Counter(kv.key for kv in pairs)
    groups: dict[str, list[str]] = {}
    for key, n in counts.items():
        if n > 1:
            out.failures.append(f"key {key} appears {n} times")
    for kv in pairs:
        if counts[kv.key] > 1:
            continue
        plan = want.get(kv.key)
        if plan is None:
            reason = not_judged(kv.key)
            if reason is None:
                out.failures.append(f"key {kv.key} ({describe(kv)}) is not one {writer} writes")
            else:
                groups.setdefault(reason, []).append(kv.key)
        elif plan.raw == kv.raw:
            out.judged += 1
        else:
            out.failures.append(f"key {kv.key} {_difference(kv, plan)}; {writer} writes {describe(plan)}")
    for key, plan in want.items():
        if key not in counts:
            out.failures.append(f"key {key} is missing; {writer} writes it as {describe(plan)}")
    for reason, keys in groups.items():
        names = ", ".join(keys[:SHOWN_NAMES]) + (", ..." if len(keys) > SHOWN_NAMES else "")
        out.unchecked.append(Message(f"{len(keys)} key{'s' if len(keys) != 1 else ''} ({names}): ", reason))
        out.unchecked_keys += len(keys)
    return out
