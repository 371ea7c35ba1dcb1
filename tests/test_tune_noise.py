"""`tune` keeps the simpler setting when a gain is within the noise of its measurements."""

import statistics
from types import SimpleNamespace as NS

from gguf_exact.bench.report import TARGET
from gguf_exact.bench.tune import gain_and_noise, pick_setting


def measured(tps: dict[str, list[float]]):
    """Runs (one per prompt, round 0) and summary rows from tokens/s per arm and prompt."""
    runs = [
        NS(arm=label, prompt=f"p{i}", round=0, tokens_per_second=t)
        for label, ts in tps.items()
        for i, t in enumerate(ts)
    ]
    rows = [
        NS(
            label=label,
            n_max=0 if label == TARGET else int(label.split("=")[1]),
            tokens_per_second_median=statistics.median(ts),
        )
        for label, ts in tps.items()
    ]
    return rows, runs


def test_gain_within_noise_keeps_the_shorter_n_max_and_says_the_target_is_as_fast():
    rows, runs = measured(
        {
            TARGET: [100.0, 100.0, 100.0],
            "n_max=1": [101.0, 99.0, 103.0],
            "n_max=2": [102.0, 97.0, 106.0],  # the fastest median, +1% over n-max 1 with +-2.5% noise
        }
    )
    gain, noise = gain_and_noise(runs, "n_max=2", "n_max=1")
    assert round(gain, 4) == 0.0099 and round(noise, 4) == 0.0247
    pick = pick_setting(rows, runs)
    assert (pick.n_max, pick.fastest_n_max, pick.tokens_per_second) == (1, 2, 101.0)
    assert pick.target_within_noise is True
    assert pick.notes == (
        "kept n-max 1, the simpler setting: n-max 2 is +1.0% faster, within the noise (+-2.5%)",
        "n-max 1 is +1.0% against the target alone, within the noise (+-2.0%): "
        "the target alone (--no-draft) is as fast on this machine",
    )
    assert round(pick.spread, 4) == 0.0247  # the larger of the two comparisons' noise


def test_a_clear_gain_keeps_the_fastest():
    rows, runs = measured(
        {
            TARGET: [100.0, 100.0, 100.0],
            "n_max=1": [130.0, 131.0, 129.0],
            "n_max=3": [180.0, 181.0, 179.0],
        }
    )
    pick = pick_setting(rows, runs)
    assert (pick.n_max, pick.fastest_n_max, pick.target_within_noise, pick.notes) == (3, 3, False, ())
    assert pick.tokens_per_second == 180.0 and 0 < pick.spread < 0.02
