"""The block rule of `verify` (core/block_exactness.py) on blocks built by hand: exact
counts, +0 and -0, equally exact and more exact alternatives, and no slack."""

import numpy as np
from gguf_edit import oracle_figures
from helpers import block

from gguf_exact.core.block_exactness import block_figures, judge_blocks
from gguf_exact.core.exact import plan_rows

ONES = [1, -1, 0, 1] * 8  # levels of a block whose values are +-1.0 and 0
SOURCE_ONES = np.array([[0x3F80, 0xBF80, 0x0000, 0x3F80] * 8], np.uint16)  # bf16 1.0, -1.0, +0, 1.0


def test_figures_count_bit_exact_values_and_the_worst_step():
    exact, worst = block_figures(block(ONES, 1.0), SOURCE_ONES)
    assert (exact.tolist(), worst.tolist()) == ([32], [0])
    # d one fp16 step below 1.0 (0.99951171875): +-1 level values round to bf16 1.0 still
    # (bf16 has 8 significant bits, fp16 11), so all 32 stay exact
    assert block_figures(block(ONES, 0.99951171875), SOURCE_ONES)[0].tolist() == [32]
    # d = 1.0078125 (bf16's own step above 1.0): every +-1 value is one bf16 step off
    exact, worst = block_figures(block(ONES, 1.0078125), SOURCE_ONES)
    assert (exact.tolist(), worst.tolist()) == ([8], [1])
    assert oracle_figures(block(ONES, 1.0078125), SOURCE_ONES) == ([8], [1])


def test_plus_and_minus_zero_are_the_same_value():
    negative_zero = SOURCE_ONES.copy()
    negative_zero[0, 2::4] = 0x8000  # the source holds -0 where level 0 decodes to +0 * d
    assert block_figures(block(ONES, 1.0), negative_zero)[0].tolist() == [32]
    # and a negative scale decodes level 0 as -0 against a +0 source: still exact
    assert block_figures(block([-x for x in ONES], -1.0), SOURCE_ONES)[0].tolist() == [32]


def test_the_plans_bytes_pass_without_decoding():
    got = judge_blocks(block(ONES, 1.0), block(ONES, 1.0), SOURCE_ONES)
    assert (got.as_planned, got.equally_exact, got.more_exact, got.less_exact, got.ok) == (1, 0, 0, 0, True)


def test_an_equally_exact_scale_passes_and_is_counted():
    got = judge_blocks(block(ONES, 0.99951171875), block(ONES, 1.0), SOURCE_ONES)
    assert (got.as_planned, got.equally_exact, got.more_exact, got.less_exact) == (0, 1, 0, 0)
    # the same grid stored as -d with negated levels (how +8 extremes are stored)
    got = judge_blocks(block([-x for x in ONES], -1.0), block(ONES, 1.0), SOURCE_ONES)
    assert (got.equally_exact, got.less_exact) == (1, 0)
    # levels not in lowest terms: 2 * level at d / 2
    got = judge_blocks(block([2 * x for x in ONES], 0.5), block(ONES, 1.0), SOURCE_ONES)
    assert (got.equally_exact, got.less_exact) == (1, 0)


def test_a_more_exact_block_passes_and_is_counted():
    got = judge_blocks(block(ONES, 1.0), block(ONES, 1.0078125), SOURCE_ONES)
    assert (got.more_exact, got.less_exact) == (1, 0)


def test_one_exact_value_fewer_fails_with_its_figures():
    source = SOURCE_ONES.copy()
    source[0, 0] = 0x3F81  # value 0 is 1.0078125 in the source: the plan's d = 1.0 gets 31 of 32
    plan = block(ONES, 1.0)
    assert oracle_figures(plan, source) == ([31], [1])
    # d = 1.0078125: value 0 becomes exact, the other 23 +-1 values one step off; with the 8 zeros, 9 of 32
    got = judge_blocks(block(ONES, 1.0078125), plan, source)
    assert got.less_exact == 1 and got.ok is False
    b = got.first_less_exact[0]
    assert (b.index, b.exact, b.plan_exact, b.worst, b.plan_worst) == (0, 9, 31, 1, 1)
    assert oracle_figures(block(ONES, 1.0078125), source) == ([9], [1])


def test_no_value_may_be_further_off_than_the_plans_worst():
    # as many values exact as the plan, but one of them far off where the plan's worst is one step
    source = np.zeros((1, 32), np.uint16)
    source[0, 0] = 0x3F81  # 1.0078125, then 31 zeros
    plan = block([1] + [0] * 31, 1.0)  # value 0 decodes to 1.0, one step off: 31 exact, worst 1
    stored = block([1, 1] + [0] * 30, 1.0078125)  # value 0 exact, value 1 (a zero) decodes to 1.0078125
    assert oracle_figures(plan, source) == ([31], [1]) and oracle_figures(stored, source) == ([31], [0x3F81])
    got = judge_blocks(stored, plan, source)
    b = got.first_less_exact[0]
    assert (got.less_exact, b.exact, b.plan_exact, b.worst, b.plan_worst) == (1, 31, 31, 0x3F81, 1)


def test_a_chunk_counts_every_kind_and_keeps_the_first_failures_in_order():
    stored = np.concatenate([block(ONES, 1.0), block(ONES, 0.99951171875), block(ONES, 1.0078125)] * 2)
    planned = np.concatenate([block(ONES, 1.0)] * 6)
    source = np.concatenate([SOURCE_ONES] * 6)
    got = judge_blocks(stored, planned, source, keep=5)
    assert (got.n_blocks, got.as_planned, got.equally_exact, got.more_exact, got.less_exact) == (6, 2, 2, 0, 2)
    assert [b.index for b in got.first_less_exact] == [2, 5]


def test_the_packers_own_plan_is_as_exact_as_itself_on_qat_data():
    from gguf_exact.tiny.synthetic import qat_matrix

    bits = qat_matrix(np.random.default_rng(5), 64, 256, step_kind="fp32")
    plan = plan_rows(bits).data
    exact, _ = block_figures(plan, bits.reshape(-1, 32))
    assert exact.sum() == plan_rows(bits).exact_values  # the kernel's count, recomputed
    oracle_exact, _ = oracle_figures(plan, bits.reshape(-1, 32))
    assert np.array_equal(exact, oracle_exact)
