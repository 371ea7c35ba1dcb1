"""core/same_levels: two Q4_0 encodings hold the same levels when their level vectors are
proportional (sign and common factor included); scales are not compared."""

from fractions import Fraction

import numpy as np
import pytest
from helpers import block

from gguf_exact.core import q4_0
from gguf_exact.core.same_levels import proportional_levels, same_levels

BASE = [-8, -4, 0, 2, 6, 7] + [1] * 26
HALVED = [-4, -2, 0, 1, 3] + [0] * 27  # lowest terms of the doubled block below
DOUBLED = [-8, -4, 0, 2, 6] + [0] * 27


@pytest.mark.parametrize(
    "a, b, same",
    [
        (block(BASE), block(BASE), True),
        (block(BASE, 0.01), block(BASE, 0.02), True),  # only the scale differs
        (block([-x for x in BASE[1:]] + [-1], -0.01), block(BASE[1:] + [1], 0.01), True),  # -d and negated levels
        (block(HALVED, 0.02), block(DOUBLED, 0.01), True),  # a common factor 2
        (block([3] * 32), block([-6] * 32), True),  # factor -2
        (block([0] * 32, 0.0), block([0] * 32, 0.5), True),  # all zero in both
        (block([0] * 32), block([0] * 31 + [1]), False),  # zero against nonzero
        (block([0] * 31 + [1]), block([0] * 32), False),
        (block(BASE), block(BASE[:5] + [5] + BASE[6:]), False),  # one level changed
        (block(HALVED), block([-4, -2, 0, 1, 2] + [0] * 27), False),
        (block([1, 2] + [0] * 30), block([2, 3] + [0] * 30), False),  # not proportional, same zero pattern
        (block([1, 0] + [0] * 30), block([0, 1] + [0] * 30), False),  # same count of nonzeros, other place
    ],
)
def test_same_levels_cases(a, b, same):
    assert same_levels(a, b).tolist() == [same]
    assert same_levels(b, a).tolist() == [same]  # symmetric


def test_same_levels_agrees_with_exact_rational_arithmetic():
    rng = np.random.default_rng(7)
    n = 4000
    a = rng.integers(-8, 8, (n, 32), dtype=np.int8)
    a[rng.random(n) < 0.05] = 0
    sparse = rng.random(n) < 0.3  # mostly-zero blocks, where pivots matter
    a[sparse] *= (rng.random((int(sparse.sum()), 32)) < 0.1).astype(np.int8)
    factor = rng.choice([-2, -1, 1, 2], n)
    b = np.clip(a.astype(np.int16) * factor[:, None], -8, 7).astype(np.int8)
    tweak = rng.random(n) < 0.3
    b[tweak, rng.integers(0, 32, n)[tweak]] = rng.integers(-8, 8, n, dtype=np.int8)[tweak]

    def proportional(x, y):
        if not x.any() or not y.any():
            return not x.any() and not y.any()
        j = int(np.flatnonzero(y)[0])
        r = Fraction(int(x[j]), int(y[j]))
        return r != 0 and all(Fraction(int(p)) == r * int(q) for p, q in zip(x, y))

    expected = [proportional(a[i], b[i]) for i in range(n)]
    got = same_levels(q4_0.pack(a, np.full(n, 0.01, np.float16)), q4_0.pack(b, np.full(n, -0.03, np.float16)))
    assert got.tolist() == expected
    assert 0.2 * n < sum(expected) < 0.9 * n  # both outcomes are well represented
    assert proportional_levels(a, b).tolist() == expected


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="shapes"):
        proportional_levels(np.zeros((2, 32)), np.zeros((3, 32)))
