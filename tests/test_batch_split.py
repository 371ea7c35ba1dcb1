"""Why `serve` shares one KV cache where a drafter serves several slots (ServingConfig.kv_unified):
with a cache per slot llama.cpp cuts a batch whose slots bring unequal rows into several graph
passes, as `equal_split` says, each pass reading every weight; with one cache it is one pass. The
passes are counted by the target's output node in llama.cpp's eval callback, on the tiny target."""

from __future__ import annotations

import pytest

from gguf_exact.bench.pass_costs import shared_passes
from gguf_exact.engines.shared.batch_cost import equal_split
from gguf_exact.tiny.hidden_pair import write_hidden_state_pair

COMPOSITIONS = [(1, 1, 1, 1), (4, 4, 4, 4), (4, 1, 1, 1), (4, 2, 1, 1), (1, 4, 1, 2), (1, 0, 1, 1), (0, 3, 0, 2), (4, 0, 0, 0)]


def test_equal_split_takes_a_run_of_slots_as_many_rows_each_as_its_shortest():
    assert [equal_split(c) for c in COMPOSITIONS] == [
        [4], [16], [4, 3], [4, 2, 2], [4, 3, 1], [1, 2], [3, 2], [4],
    ]  # fmt: skip
    assert equal_split([]) == [] and equal_split([0, 0]) == []


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_hidden_state_pair(tmp_path_factory.mktemp("split"))[0]


@pytest.mark.bindings
@pytest.mark.parametrize("unified", [False, True], ids=["a cache per slot", "one cache"])
def test_llama_cpp_passes_a_batch_of_slots_as_equal_split_says(target, unified):
    seen: list[int] = []
    with shared_passes(target, 4, threads=1, unified=unified, context=20, rows_seen=seen) as decode:
        got = []
        for c in COMPOSITIONS:
            seen.clear()
            decode(c)
            got.append(list(seen))
    assert got == [[sum(c)] if unified else equal_split(c) for c in COMPOSITIONS]
