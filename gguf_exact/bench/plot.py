"""The benchmarks' PNGs: ``bench``'s tokens/s and tokens per target pass against n-max (n-max 0
is the target alone); ``bench-load``'s tokens/s against users, one line per draft arm. Needs matplotlib (the ``bench`` extra:
``pip install 'gguf-exact[bench]'``); without it :func:`plot_report` raises a
one-line :class:`GgufExactError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.safe_write import atomic_output

if TYPE_CHECKING:
    from gguf_exact.bench.run import BenchReport


def plot_report(report: BenchReport, path: str | Path) -> Path:
    """Write the two-panel plot of ``report`` to ``path`` (PNG)."""
    plt = _pyplot()
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


def _pyplot() -> Any:  # matplotlib.pyplot, imported only when a plot is drawn
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GgufExactError("matplotlib is not installed; pip install 'gguf-exact[bench]'") from None
    return plt


def plot_load(results: list[dict], path: str | Path) -> Path:
    """``bench-load``'s results (:meth:`gguf_exact.bench.load.LoadResult.as_dict`): one panel per
    pair kind and sampler, total tokens/s against users, a line per arm; written to ``path``."""
    plt = _pyplot()
    groups = sorted({(r["kind"], r["sampler"]) for r in results})
    if not groups:
        raise GgufExactError("no bench-load results to plot")
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.4), dpi=110, squeeze=False)
    for ax, (kind, sampler) in zip(axes[0], groups):
        rows = [r for r in results if (r["kind"], r["sampler"]) == (kind, sampler)]
        for arm in dict.fromkeys(r["arm"] for r in rows):
            pts = sorted((r["users"], r["tokens_per_second"]) for r in rows if r["arm"] == arm)
            ax.plot([p for p, _ in pts], [t for _, t in pts], "o-", label=arm)
        ax.set_title(f"{kind}, {sampler}", fontsize=9)
        ax.set_xlabel("users (= slots)")
        ax.set_xticks(sorted({r["users"] for r in rows}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("total tokens/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


__all__ = ["plot_load", "plot_report"]
