"""bench's paired ratios (gguf_exact/bench/paired.py): the geometric mean of per-request ratios and its t interval."""

import math

import pytest

from gguf_exact.bench.paired import paired_ratio, t_975


def test_the_interval_is_the_t_interval_of_the_log_ratios():
    # log ratios 0.1, 0.2, 0.3: mean 0.2, standard deviation 0.1, t(2) = 4.303, half width 4.303 x 0.1 / sqrt(3)
    est = paired_ratio([1.0, 2.0, 4.0], [math.exp(0.1), 2 * math.exp(0.2), 4 * math.exp(0.3)])
    assert est is not None and est.pairs == 3
    assert (est.ratio, est.low, est.high) == pytest.approx((1.2214028, 0.9527204, 1.5658579), abs=5e-7)
    assert est.describe() == "1.221x (95% 0.953-1.566, 3 request pairs)"


def test_a_drift_both_members_of_a_pair_share_cancels():
    """The host slowed requests 2 and 4 by a fifth for both arms: every pair's ratio is 0.99, so the interval is
    0.99 itself; unpaired (the second arm's rates taken in another order) the same figures spread it past 1."""
    base, arm = [10.0, 8.0, 10.0, 8.0], [9.9, 7.92, 9.9, 7.92]
    est = paired_ratio(base, arm)
    assert est is not None and (est.ratio, est.low, est.high) == pytest.approx((0.99, 0.99, 0.99), abs=1e-12)
    shuffled = paired_ratio(base, [7.92, 9.9, 7.92, 9.9])
    assert shuffled is not None and shuffled.low < 0.9 and shuffled.high > 1.05


def test_no_interval_without_two_pairs_or_where_the_rates_do_not_pair():
    assert paired_ratio([10.0], [9.0]) is None
    assert paired_ratio([10.0, 9.0, 8.0], [9.0, 8.0]) is None  # not the same requests
    assert paired_ratio([10.0, 0.0, 8.0], [9.0, 7.0, 0.0]) is None  # a request without a rate is left out: one pair
    left_out = paired_ratio([10.0, 0.0, 8.0, 6.0], [9.0, 7.0, 8.0, 6.0])
    assert left_out is not None and left_out == paired_ratio([10.0, 8.0, 6.0], [9.0, 8.0, 6.0]) and left_out.pairs == 3


def test_the_t_quantiles_are_students():
    assert [t_975(df) for df in (1, 2, 3, 7, 15, 30)] == [12.706, 4.303, 3.182, 2.365, 2.131, 2.042]
    assert t_975(31) == pytest.approx(1.959964, abs=1e-6)  # the normal's beyond the table
