"""What ``tune`` keeps from its measurements: the settings it measures (:class:`Setting`) and
the choices among them, within the noise of the runs.

- :func:`pick_setting`: the best fixed length (a shorter one when the fastest's gain over
  it is within the noise: half the range of the tokens/s ratios of the same request on
  both arms), and whether drafting's gain over the target alone is within the noise.
- :func:`pick_adaptive`: the best of the adaptive policy's settings (n-max bound, p-min),
  the default kept unless another beats it beyond the noise; and against the best fixed
  length, adaptive is kept unless the fixed length is faster beyond the noise (it adapts
  where the text changes, where one fixed length cannot).

- :func:`too_noisy`: whether the measurements can rank settings at all (:data:`TOO_NOISY`).

Pure: rows and runs in (anything with the bench report's fields), choices out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gguf_exact.bench.report import TARGET
from gguf_exact.bench.request import adaptive_length, fixed_length


@dataclass(frozen=True)
class Setting:
    """One arm's draft settings: the target alone (``n_max`` 0), a fixed length, or the
    adaptive policy bounded by ``n_max`` with a drafter-confidence floor ``p_min``."""

    n_max: int
    adaptive: bool = False
    p_min: float = 0.0

    @property
    def label(self) -> str:
        if not self.n_max:
            return TARGET
        if not self.adaptive:
            return f"n_max={self.n_max}"
        return f"adaptive n_max={self.n_max} p_min={self.p_min:g}"

    def overrides(self) -> list[str]:
        """The profile overrides that serve this setting."""
        return adaptive_length(self.n_max, self.p_min) if self.adaptive else fixed_length(self.n_max)

    def describe(self) -> str:
        """In the words the output uses: ``n-max 3``, ``adaptive, n-max bound 4, p-min 0.5``."""
        if not self.n_max:
            return "the target alone"
        return f"adaptive, n-max bound {self.n_max}, p-min {self.p_min:g}" if self.adaptive else f"n-max {self.n_max}"


# The most noise a ranking is trusted with: the same request's tokens/s ratio between two arms
# varying by more than +-50% around its middle (one visit twice as fast as another of the same
# request) says the machine, not the setting, set the figures: on a busy machine, or on models so
# small that a request takes a few milliseconds (the tiny pairs: +-4,500% and more measured).
TOO_NOISY = 0.5


def too_noisy(spread: float | None, limit: float = TOO_NOISY) -> bool:
    """True when ``spread`` (:attr:`Pick.spread`) is over ``limit``: no setting can be told
    from another, and tune writes no profile."""
    return spread is not None and spread > limit


def _ratios(runs: list, a: str, b: str) -> list[float]:
    """tokens/s of arm ``a`` over arm ``b``, paired by (prompt, round): the same request on both."""
    of_b = {(r.prompt, r.round): r.tokens_per_second for r in runs if r.arm == b}
    return [
        r.tokens_per_second / of_b[(r.prompt, r.round)]
        for r in runs
        if r.arm == a and of_b.get((r.prompt, r.round), 0) > 0
    ]


def gain_and_noise(runs: list, a: str, b: str) -> tuple[float, float]:
    """How much faster arm ``a`` is than ``b`` (the median paired ratio, less 1) and the
    noise of that figure: half the range of the paired ratios (0 with fewer than two)."""
    ratios = _ratios(runs, a, b)
    if not ratios:
        return 0.0, 0.0
    noise = (max(ratios) - min(ratios)) / 2 if len(ratios) > 1 else 0.0
    return statistics.median(ratios) - 1.0, noise


@dataclass(frozen=True)
class Pick:
    """What :func:`pick_setting` keeps."""

    n_max: int
    tokens_per_second: float
    fastest_n_max: int
    spread: float | None
    target_within_noise: bool
    notes: tuple[str, ...]


def pick_setting(summary: list, runs: list) -> Pick:
    """The fixed length tune keeps: the fastest n-max by median run, unless a shorter one is
    within the noise of it (its gain no more than the spread of the paired measurements),
    then the shortest such; and whether drafting's gain over the target alone is within
    the noise too (then the target alone is as fast). Adaptive rows are not looked at."""
    drafting = sorted((s for s in summary if s.n_max and s.label == Setting(s.n_max).label), key=lambda s: s.n_max)
    fastest = max(drafting, key=lambda s: s.tokens_per_second_median)
    kept, notes, spread = fastest, [], None
    for s in drafting:
        if s.n_max >= fastest.n_max:
            break
        gain, noise = gain_and_noise(runs, fastest.label, s.label)
        spread = noise if spread is None else max(spread, noise)
        if gain <= noise:
            kept = s
            notes.append(
                f"kept n-max {s.n_max}, the simpler setting: n-max {fastest.n_max} is {gain:+.1%} faster, "
                f"within the noise (+-{noise:.1%})"
            )
            break
    within = False
    target = next((s for s in summary if s.label == TARGET), None)
    if target is not None:
        gain, noise = gain_and_noise(runs, kept.label, TARGET)
        spread = noise if spread is None else max(spread, noise)
        if gain <= noise:
            within = True
            notes.append(
                f"n-max {kept.n_max} is {gain:+.1%} against the target alone, within the noise (+-{noise:.1%}): "
                "the target alone (--no-draft) is as fast on this machine"
            )
    return Pick(int(kept.n_max), kept.tokens_per_second_median, int(fastest.n_max), spread, within, tuple(notes))


@dataclass(frozen=True)
class AdaptivePick:
    """What :func:`pick_adaptive` finds: the default's and the best adaptive setting's
    figures, beside the best fixed length, and the setting kept."""

    default: Setting
    default_tokens_per_second: float
    default_vs_fixed: float  # the default's median paired ratio to the best fixed length's
    best: Setting  # the best adaptive setting (the default unless another beats it beyond the noise)
    best_tokens_per_second: float
    kept: Setting  # best, or the fixed length where that is faster beyond the noise
    notes: tuple[str, ...]


def pick_adaptive(
    summary: list, runs: list, settings: dict[str, Setting], default: Setting, fixed: Setting
) -> AdaptivePick:
    """Among the adaptive arms (``settings``: label -> setting), the default unless another
    setting is faster beyond the noise (then the fastest); then that against ``fixed`` (the
    best fixed length): adaptive kept unless the fixed length is faster beyond the noise."""
    rows = {s.label: s for s in summary}
    adaptive = [rows[label] for label, s in settings.items() if s.adaptive and label in rows]
    fastest = max(adaptive, key=lambda s: s.tokens_per_second_median)
    best, notes = default, []
    if fastest.label != default.label:
        gain, noise = gain_and_noise(runs, fastest.label, default.label)
        if gain > noise:
            best = settings[fastest.label]
        else:
            notes.append(
                f"kept the default ({default.describe()}): {settings[fastest.label].describe()} is "
                f"{gain:+.1%} faster, within the noise (+-{noise:.1%})"
            )
    vs_fixed, _ = gain_and_noise(runs, default.label, fixed.label)
    gain, noise = gain_and_noise(runs, fixed.label, best.label)
    kept = best
    if gain > noise:
        kept = fixed
        notes.append(
            f"kept {fixed.describe()}: {gain:+.1%} faster than {best.describe()}, beyond the noise (+-{noise:.1%})"
        )
    return AdaptivePick(
        default,
        rows[default.label].tokens_per_second_median,
        1.0 + vs_fixed,
        best,
        rows[best.label].tokens_per_second_median,
        kept,
        tuple(notes),
    )


__all__ = [
    "AdaptivePick",
    "Pick",
    "Setting",
    "gain_and_noise",
    "pick_adaptive",
    "pick_setting",
    "too_noisy",
    "TOO_NOISY",
]
