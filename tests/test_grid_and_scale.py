"""Grid detection and scale choice on synthetic QAT data with known levels."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from gguf_exact.core import bf16, q4_0
from gguf_exact.core.exact import plan_matrix
from gguf_exact.core.grid import fit_grid
from gguf_exact.core.published import published_q4_0
from gguf_exact.core.scale import choose_scales
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.synthetic import qat_matrix, random_matrix


def blocks_with_levels(levels, step):
    """bf16 bits of level * step per block (step fp32)."""
    return bf16.from_f32(
        levels.astype(np.float32) * np.float32(step)[:, None] if np.ndim(step) else levels * np.float32(step)
    )


def test_fit_grid_recovers_trained_levels_and_plus8_sign():
    rng = np.random.default_rng(3)
    levels = np.clip(np.rint(rng.normal(0, 3, (1000, 32))), -7, 7)
    levels[:500, 0] = -8  # extreme -8: positive scale
    levels[500:600, 0] = 8  # extreme +8: negative scale, levels negated
    step = (0.002 * np.exp(rng.normal(0, 0.5, 1000))).astype(np.float32)
    fit = fit_grid(bf16.to_f32(bf16.from_f32(levels * step[:, None])))
    assert fit.on_grid.all()
    signed = fit.levels * np.sign(fit.step)[:, None]
    np.testing.assert_array_equal(signed, levels)
    assert (fit.step[500:600] < 0).all() and (fit.step[:500] > 0).all()
    assert fit.levels.min() == -8 and fit.levels.max() <= 7
    assert fit.residual.max() < 1 / 16


def test_fit_grid_zero_blocks_and_random_data():
    rng = np.random.default_rng(4)
    x = bf16.to_f32(random_matrix(rng, 64, 64)).reshape(-1, 32)
    x[0] = 0.0
    fit = fit_grid(x)
    assert fit.on_grid.tolist() == [True] + [False] * (len(x) - 1)
    assert fit.step[0] == 0 and not fit.levels.any()


def test_block_with_both_extremes_is_off_grid():
    levels = np.zeros((1, 32))
    levels[0, :2] = [-8, 8]
    fit = fit_grid(bf16.to_f32(bf16.from_f32(levels * np.float32(0.01))))
    # -8 and +8 together do not fit Q4_0 at m=8, but the values are +-amax and 0,
    # which in lowest terms are levels -1, 0, 1 with step amax
    assert fit.on_grid.all()
    assert sorted(set((fit.levels[0] * np.sign(fit.step[0])).tolist())) == [-1.0, 0.0, 1.0]
    assert abs(fit.step[0]) == bf16.to_f32(bf16.from_f32(np.array([0.08], np.float32)))[0]


def test_levels_are_put_in_lowest_terms():
    # trained at m=4 (levels -4..4, all reached): m=8 fits too, with doubled levels
    levels = np.tile(np.array([-4, -3, -1, 0, 1, 2, 3, 4]), 4)[None, :]
    x = bf16.to_f32(bf16.from_f32(levels * np.float32(0.003)))
    fit = fit_grid(x)
    np.testing.assert_array_equal(fit.levels * np.sign(fit.step)[:, None], levels)


def test_bf16_step_is_fully_exact():
    rng = np.random.default_rng(5)
    bits = qat_matrix(rng, 256, 512, step_kind="bf16", zero_fraction=0.01)
    plan = plan_matrix(bits)
    assert plan.on_grid
    assert plan.exact_values == plan.n_values == 256 * 512


def test_fp32_step_reaches_goal_and_beats_published_method_and_q8_0():
    rng = np.random.default_rng(6)
    bits = qat_matrix(rng, 512, 1024, step_kind="fp32", plus8_fraction=0.0)
    plan = plan_matrix(bits)
    assert plan.on_grid and plan.exact_fraction >= 0.995
    source = bf16.to_f32(bits)

    published, fitted = published_q4_0(bits)
    assert fitted.all()
    pub_decoded = q4_0.dequantize(published).reshape(source.shape)
    pub_exact = bf16.same_value(bf16.from_f32(pub_decoded), bits).mean()
    assert pub_exact < 0.98 and plan.exact_fraction - pub_exact > 0.015

    ours = q4_0.dequantize(plan.data.reshape(-1, 18)).reshape(source.shape)
    q8 = quants.dequantize(quants.quantize(source, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)

    def rel(a):  # in bf16, the source's precision (see core.error_stats)
        return np.linalg.norm((bf16.to_f32(bf16.from_f32(a)) - source).ravel()) / np.linalg.norm(source.ravel())

    assert rel(ours) <= rel(q8) / 10


def test_plus8_blocks_are_stored_with_negative_scale_and_decode_exactly():
    rng = np.random.default_rng(7)
    bits = qat_matrix(rng, 64, 256, step_kind="bf16", plus8_fraction=0.3)
    plan = plan_matrix(bits)
    levels, d = q4_0.unpack(plan.data.reshape(-1, 18))
    assert (d < 0).sum() > 0
    decoded = q4_0.dequantize(plan.data.reshape(-1, 18)).reshape(bits.shape)
    assert bf16.same_value(bf16.from_f32(decoded), bits).all()


def test_subnormal_fp16_steps():
    # steps around 1e-6 are fp16 subnormals (below 6.1e-5): still on grid, d subnormal
    levels = np.tile(np.arange(-8, 8), 2)[None, :].repeat(4, axis=0)
    step = np.array([1e-6, 2e-6, 3e-7, 5e-6], dtype=np.float32)
    bits = bf16.from_f32(levels * step[:, None])
    plan = plan_matrix(bits.reshape(4, 32))
    assert plan.on_grid
    _, d = q4_0.unpack(plan.data.reshape(-1, 18))
    assert ((d.view(np.uint16) & 0x7C00) == 0).all()  # exponent 0: subnormal
    choice = choose_scales(fit_grid(bf16.to_f32(bits)).levels, bits, fit_grid(bf16.to_f32(bits)).step)
    assert choice.exact.sum() == plan.exact_values


def test_nan_and_row_length_errors():
    bits = np.zeros((2, 64), dtype=np.uint16)
    bits[1, 40] = 0x7FC0
    with pytest.raises(GgufExactError, match=r"1 values are NaN or Inf \(first at row 1, column 40\)"):
        plan_matrix(bits)
    with pytest.raises(GgufExactError, match="row length 48 is not a multiple of 32"):
        plan_matrix(np.zeros((2, 48), dtype=np.uint16))


def test_off_grid_blocks_are_counted_and_located():
    rng = np.random.default_rng(8)
    bits = qat_matrix(rng, 8, 128, step_kind="bf16")
    bits[5, 64:96] = random_matrix(rng, 1, 32)
    plan = plan_matrix(bits)
    assert plan.off_grid_blocks == 1 and plan.data is None
    assert plan.first_off_grid[0][:2] == (5, 64)
    assert plan.on_grid_fraction == 1 - 1 / 32


def test_level_histogram_counts_trained_levels_and_skips_off_grid_blocks():
    rng = np.random.default_rng(9)
    levels = np.clip(np.rint(rng.normal(0, 3, (64, 32))), -8, 7)
    levels[:, 0] = -8  # every block fitted at m = 8, so the levels are the trained ones
    step = (0.001 * np.exp(rng.normal(0, 0.3, 64))).astype(np.float32)
    bits = bf16.from_f32(levels * step[:, None]).reshape(8, 256)
    bits[3, 32:64] = random_matrix(rng, 1, 32)  # block 1 of row 3: off the grid
    plan = plan_matrix(bits)
    on_grid = np.ones(64, dtype=bool)
    on_grid[3 * 8 + 1] = False
    expected = np.bincount((levels[on_grid] + 8).astype(int).ravel(), minlength=16)
    assert plan.off_grid_blocks == 1
    np.testing.assert_array_equal(plan.level_histogram, expected)
    assert plan.level_histogram.sum() == 63 * 32
