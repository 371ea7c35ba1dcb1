"""`tune` keeps the simpler setting when a gain is within the noise of its measurements."""

import statistics
from types import SimpleNamespace as NS

from gguf_exact.bench.report import TARGET
from gguf_exact.bench.tune_pick import TOO_NOISY, Setting, gain_and_noise, pick_adaptive, pick_setting, too_noisy


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


FIXED3 = Setting(3)
DEFAULT = Setting(4, True, 0.0)
P5 = Setting(4, True, 0.5)


def adaptive_measured(tps: dict[Setting, list[float]]):
    """Runs and rows as tune records them, keyed by each setting's label."""
    runs = [
        NS(arm=s.label, prompt=f"p{i}", round=0, tokens_per_second=t) for s, ts in tps.items() for i, t in enumerate(ts)
    ]
    rows = [NS(label=s.label, n_max=s.n_max, tokens_per_second_median=statistics.median(ts)) for s, ts in tps.items()]
    return rows, runs, {s.label: s for s in tps}


def test_adaptive_within_the_noise_of_the_best_fixed_length_is_kept():
    rows, runs, settings = adaptive_measured(
        {
            Setting(0): [100.0, 100.0, 100.0],
            FIXED3: [180.0, 184.0, 176.0],
            DEFAULT: [178.0, 180.0, 177.0],  # 0.99x n-max 3 (the median ratio of the same requests)
            P5: [179.0, 181.0, 176.0],  # +0.6% over the default, within its +-0.6%: the default stays
        }
    )
    assert pick_setting(rows, runs).n_max == 3  # adaptive rows are not fixed lengths
    a = pick_adaptive(rows, runs, settings, DEFAULT, FIXED3)
    assert (a.best, a.kept, a.default_tokens_per_second, a.best_tokens_per_second) == (DEFAULT, DEFAULT, 178.0, 178.0)
    assert round(a.default_vs_fixed, 4) == round(178.0 / 180.0, 4)
    assert a.notes == (
        "kept the default (adaptive, n-max bound 4, p-min 0): adaptive, n-max bound 4, p-min 0.5 is +0.6% faster, "
        "within the noise (+-0.6%)",
    )


def test_a_fixed_length_faster_beyond_the_noise_is_kept_and_a_better_threshold_is_found():
    rows, runs, settings = adaptive_measured(
        {
            FIXED3: [180.0, 181.0, 179.0],
            DEFAULT: [150.0, 151.0, 149.0],
            P5: [165.0, 166.0, 164.0],  # +10% over the default, beyond the noise
        }
    )
    a = pick_adaptive(rows, runs, settings, DEFAULT, FIXED3)
    assert (a.best, a.kept, a.best_tokens_per_second) == (P5, FIXED3, 165.0)
    assert round(a.default_vs_fixed, 3) == round(150 / 180, 3)
    assert a.notes == ("kept n-max 3: +9.1% faster than adaptive, n-max bound 4, p-min 0.5, beyond the noise (+-0.1%)",)
    assert [s.overrides() for s in (FIXED3, P5, Setting(0))] == [
        ["spec-draft-adaptive=false", "spec-draft-n-max=3"],
        ["spec-draft-adaptive=true", "spec-draft-n-max=4", "spec-draft-p-min=0.5"],
        [],
    ]


def test_too_noisy_to_rank():
    """The issue-41 run: the target alone at 52.6 and 727.1 tokens/s on the same request, n-max 1
    at 2,008.9 and 3,166.3: a spread no setting can be ranked within."""
    rows, runs = measured({TARGET: [727.1, 52.6], "n_max=1": [3166.3, 2008.9]})
    pick = pick_setting(rows, runs)
    assert round(pick.spread, 2) == 16.92 and too_noisy(pick.spread)
    assert TOO_NOISY == 0.5 and not too_noisy(0.5) and too_noisy(0.51) and not too_noisy(None)
    assert not too_noisy(16.92, limit=20)


def test_tune_says_its_rule():
    from gguf_exact.cli import load_groups

    option = next(p for p in load_groups()["tune"].params if p.name == "max_spread")
    assert option.default == TOO_NOISY
