"""The benchmark's PNG: tokens/s and tokens per target pass against n-max.

n-max 0 is the target alone. Needs matplotlib (the ``bench`` extra:
``pip install 'gguf-exact[bench]'``); without it :func:`plot_report` raises a
one-line :class:`GgufExactError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.safe_write import atomic_output

if TYPE_CHECKING:
    from gguf_exact.bench.run import BenchReport


def plot_report(report: BenchReport, path: str | Path) -> Path:
    """Write the two-panel plot of ``report`` to ``path`` (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GgufExactError("matplotlib is not installed; pip install 'gguf-exact[bench]'") from None
    points = sorted((s.n_max, s) for s in report.rows if s.n_max is not None)
    if not points:
        raise GgufExactError("no arm has a known n-max to plot")
    xs = [n for n, _ in points]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=110)
    ax1.plot(xs, [s.tokens_per_second for _, s in points], "o-", label="all runs")
    ax1.plot(xs, [s.tokens_per_second_median for _, s in points], "s--", alpha=0.6, label="median run")
    ax1.set_xlabel("n-max (0 = target alone)")
    ax1.set_ylabel("tokens/s (generation)")
    ax1.legend(fontsize=8)
    ax2.plot(xs, [s.tokens_per_target_pass for _, s in points], "o-", color="tab:green")
    ax2.set_xlabel("n-max (0 = target alone)")
    ax2.set_ylabel("tokens per target pass")
    for ax in (ax1, ax2):
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.suptitle(
        f"{report.meta.get('backend')}: {report.meta.get('n_predict')} tokens x {len(report.meta.get('prompts', []))} prompts",
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


__all__ = ["plot_report"]
