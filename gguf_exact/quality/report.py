"""What ``quality`` found: one row per file, as a table, as JSON, and as a plot.

:class:`QualityReport` (main models, against the bf16 reference through
llama-perplexity) and :class:`AcceptanceReport` (drafters, against one target through
llama-server). The plot needs matplotlib (the ``bench`` extra); without it
:func:`plot_quality` raises one line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.gguf_file import atomic_output
from gguf_exact.formats.paths import check_output_file

JSON_KEYS = ("file", "mean_kld", "p99_kld", "same_top", "ppl_ratio", "bytes")


@dataclass(frozen=True)
class QualityRow:
    """One file against the bf16 reference."""

    file: str
    mean_kld: float
    p99_kld: float
    same_top: float  # a fraction
    ppl_ratio: float
    bytes: int

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in JSON_KEYS}


def quality_table(rows: list[QualityRow]) -> tuple[list[str], list[list[str]]]:
    """Column names and rows, as the CLI and the model card print them."""
    head = ["file", "mean KLD", "99% KLD", "same top", "PPL ratio", "size"]
    cells = [
        [
            Path(r.file).name,
            f"{r.mean_kld:.6f}",
            f"{r.p99_kld:.6f}",
            f"{r.same_top:.2%}",
            f"{r.ppl_ratio:.4f}",
            f"{r.bytes:,}",
        ]
        for r in rows
    ]
    return head, cells


@dataclass
class QualityReport:
    reference: Path
    text: Path
    ctx: int
    chunks: int
    ppl_reference: float | None = None
    rows: list[QualityRow] = field(default_factory=list)

    def as_dict(self) -> dict:
        """Exactly ``{"files": [{"file", "mean_kld", "p99_kld", "same_top", "ppl_ratio", "bytes"}, ...]}``."""
        return {"files": [r.as_dict() for r in self.rows]}

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Column names and rows, as the CLI prints them."""
        return quality_table(self.rows)

    def note(self) -> str:
        ppl = f", PPL {self.ppl_reference:.4g}" if self.ppl_reference else ""
        return (
            f"against {self.reference.name} (bf16 reference{ppl}) with llama-perplexity --kl-divergence, "
            f"{self.chunks} chunks of {self.ctx} tokens of {self.text.name}"
        )


@dataclass(frozen=True)
class AcceptanceRow:
    """One drafter beside the target, on the prompts."""

    file: str
    bytes: int
    drafted: int
    accepted: int
    tokens: int
    same_output: bool  # the target's greedy tokens equal the first drafter's (speculation is lossless)
    acceptance_ratio: float | None  # acceptance over the reference drafter's

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict:
        return asdict(self) | {"acceptance": self.acceptance}


@dataclass
class AcceptanceReport:
    target: Path
    prompts: int
    n_predict: int
    reference: str | None  # the file acceptance ratios are against
    rows: list[AcceptanceRow] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"target": str(self.target), "reference": self.reference, "drafters": [r.as_dict() for r in self.rows]}

    def table(self) -> tuple[list[str], list[list[str]]]:
        head = ["drafter", "size", "drafted", "accepted", "acceptance", "vs reference", "same output"]
        rows = [
            [
                Path(r.file).name, f"{r.bytes:,}", f"{r.drafted:,}", f"{r.accepted:,}",
                f"{r.acceptance:.2%}" if r.acceptance is not None else "-",
                f"{r.acceptance_ratio:.3f}x" if r.acceptance_ratio is not None else "-",
                "yes" if r.same_output else "NO",
            ]
            for r in self.rows
        ]  # fmt: skip
        return head, rows

    def note(self) -> str:
        against = f", ratios against {Path(self.reference).name}" if self.reference else ""
        return (
            f"target {self.target.name}, {self.prompts} prompts, {self.n_predict} tokens each, greedy, "
            f"llama-server --spec-type draft-mtp{against}"
        )


def plot_quality(report: QualityReport | AcceptanceReport, path: str | Path) -> Path:
    """A bar chart of ``report`` at ``path`` (PNG): mean KLD and same top token per file,
    or each drafter's acceptance."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GgufExactError("matplotlib is not installed; pip install 'gguf-exact[bench]' to draw the plot") from None
    names = [Path(r.file).name for r in report.rows]
    if isinstance(report, QualityReport):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110)
        ax1.bar(names, [max(r.mean_kld, 1e-9) for r in report.rows], color="tab:blue")
        ax1.set_yscale("log")
        ax1.set_ylabel("mean KL divergence (log)")
        ax2.bar(names, [100 * r.same_top for r in report.rows], color="tab:green")
        ax2.set_ylabel("same top token (%)")
        ax2.set_ylim(0, 100)
        axes = [ax1, ax2]
    else:
        fig, ax = plt.subplots(figsize=(6, 3.8), dpi=110)
        ax.bar(names, [100 * (r.acceptance or 0) for r in report.rows], color="tab:orange")
        ax.set_ylabel("draft acceptance (%)")
        ax.set_ylim(0, 100)
        axes = [ax]
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    fig.suptitle(report.note(), fontsize=7)
    fig.tight_layout()
    path = check_output_file(path, "plot")
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
