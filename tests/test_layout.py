"""Q4_0 bytes and bf16 rounding, checked against gguf-py and ml_dtypes."""

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, quants

from gguf_exact.core import bf16, q4_0


def test_q4_0_block_bytes_by_hand():
    levels = np.tile(np.arange(-8, 8, dtype=np.int8), 2)[None, :]
    block = q4_0.pack(levels, np.array([1.0], dtype=np.float16))
    # d = fp16 1.0 = 0x3C00 little-endian; qs[j] = u[j] | u[j+16] << 4 with u = j
    assert block.tobytes() == b"\x00\x3c" + bytes(j | (j << 4) for j in range(16))


def test_q4_0_negative_scale_decodes_plus_eight():
    levels = np.full((1, 32), -8, dtype=np.int8)
    block = q4_0.pack(levels, np.array([-0.5], dtype=np.float16))
    assert block[0, :2].tobytes() == b"\x00\xb8"
    assert np.all(q4_0.dequantize(block) == 4.0)


def test_q4_0_matches_gguf_py_dequantize():
    rng = np.random.default_rng(0)
    levels = rng.integers(-8, 8, (64, 32)).astype(np.int8)
    d = rng.normal(0, 0.01, 64).astype(np.float16)
    blocks = q4_0.pack(levels, d)
    ours = q4_0.dequantize(blocks)
    theirs = quants.dequantize(blocks.reshape(2, -1), GGMLQuantizationType.Q4_0).reshape(64, 32)
    np.testing.assert_array_equal(ours, theirs)
    back_levels, back_d = q4_0.unpack(blocks)
    np.testing.assert_array_equal(back_levels, levels)
    np.testing.assert_array_equal(back_d.view(np.uint16), d.view(np.uint16))


def test_bf16_rounding_matches_ml_dtypes_including_ties():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, 100_000).astype(np.float32)
    # exact ties: low 16 bits 0x8000 with even and odd kept parts
    ties = (np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x00008000], dtype=np.uint32)).view(np.float32)
    x = np.concatenate([x, ties])
    np.testing.assert_array_equal(bf16.from_f32(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    bits = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(bf16.to_f32(bits), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_same_value_treats_signed_zeros_equal_and_counts_ulps():
    a = np.array([0x0000, 0x8000, 0x3F80, 0x3F80, 0xBF80], dtype=np.uint16)
    b = np.array([0x8000, 0x0000, 0x3F80, 0x3F81, 0x3F80], dtype=np.uint16)
    assert bf16.same_value(a, b).tolist() == [True, True, True, False, False]
    assert bf16.ulp_distance(a, b).tolist() == [0, 0, 0, 1, 2 * 0x3F80]
