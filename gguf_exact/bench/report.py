"""The one benchmark report model (arms, figures, JSON and Markdown) of bench, bench --engines, tune and bench-real.

- :class:`Arm`: one configuration measured (the target alone, or the drafter at an n-max;
  a server's URL when it runs elsewhere); :func:`alternating_order` visits arms forward,
  then backward each round (``A B B A``), so the machine's drift falls on every arm alike.
- :class:`Figures`: what a set of requests adds up to (tokens, seconds, target passes,
  drafts generated and accepted) and the rates every benchmark reports from them:
  tokens/s over the client's wall and over the generation phase, tokens per target pass,
  acceptance.
- :class:`Report`: ``meta`` (how it was measured), ``runs`` (one record per request) and
  ``rows`` (one per arm); writes ``<stem>.json`` and ``<stem>.md`` (and, where the report
  plots, ``<stem>.png``). Each benchmark's report is a subclass naming its table.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable

from gguf_exact.errors import GgufExactError
from gguf_exact.formats.paths import Inputs, check_not_input
from gguf_exact.formats.safe_write import output_folder, write_text

TARGET = "target"


@dataclass(frozen=True)
class Arm:
    """One configuration: the target alone (``n_max`` 0) or the drafter at ``n_max``."""

    label: str
    n_max: int | None  # None: a server whose n-max is not known
    url: str | None = None


def alternating_order(arms: list[Arm], rounds: int) -> list[tuple[int, Arm]]:
    """(round, arm) pairs: each round runs the arms forward, then backward."""
    order = []
    for r in range(rounds):
        order += [(r, a) for a in arms] + [(r, a) for a in reversed(arms)]
    return order


@dataclass
class Figures:
    """Totals over requests, and the rates derived from them."""

    tokens: int
    wall_seconds: float  # the client's: whole requests
    generation_seconds: float  # after the prompt
    target_passes: int
    drafts_generated: int
    drafts_accepted: int

    @classmethod
    def total(cls, runs: Iterable[Any]) -> Figures:
        """Sums over runs (anything with ``n_tokens``, ``wall_seconds``, ``generation_seconds``
        or ``prefill_seconds``, ``target_passes``, ``drafts_generated``, ``drafts_accepted``)."""
        runs = list(runs)

        def generation(r: Any) -> float:
            g = getattr(r, "generation_seconds", None)
            return r.wall_seconds - r.prefill_seconds if g is None else g

        return cls(
            tokens=sum(r.n_tokens for r in runs),
            wall_seconds=sum(r.wall_seconds for r in runs),
            generation_seconds=sum(generation(r) for r in runs),
            target_passes=sum(r.target_passes for r in runs),
            drafts_generated=sum(r.drafts_generated for r in runs),
            drafts_accepted=sum(r.drafts_accepted for r in runs),
        )

    @property
    def tokens_per_second(self) -> float:
        """Over the client's wall time."""
        return self.tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def generation_tokens_per_second(self) -> float:
        """Over the generation phase."""
        return self.tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.drafts_accepted / self.drafts_generated if self.drafts_generated else None


def cell(x: Any, fmt: str) -> str:
    """A Markdown table cell: ``-`` for no figure."""
    return "-" if x is None else format(x, fmt)


def yes_no(x: bool | None) -> str:
    return "-" if x is None else ("yes" if x else "**no**")


def cpu_model(cpuinfo: str) -> str:
    """``model name`` and ``cpu family`` of ``/proc/cpuinfo``'s first processor: ``AMD EPYC (family 26)``.

    The family tells a Zen 4 (25) from a Zen 5 (26) where a VM's model name says only "AMD EPYC"."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", platform.processor() or platform.machine())
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


def machine() -> dict:
    """Where it ran, for every report's ``meta``: the platform, the CPU, and the CPU features this
    environment's llama.cpp builds compile for (``GGUF_EXACT_CPU_FEATURES`` honoured, so a run on an
    AVX2-only build of an AVX-512 machine says so) and those of the installed bindings."""
    from gguf_exact.builds.bindings_build import installed_bindings
    from gguf_exact.builds.cpu_features import host_cpu

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    bindings = installed_bindings()
    return {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(cpuinfo),
        "build_cpu_features": host_cpu().tag,
        "bindings_cpu_features": bindings.info.get("cpu_features") if bindings else None,
    }


@dataclass
class Report:
    """``meta``, one row per arm, one run per request; see the module doc."""

    meta: dict
    runs: list
    rows: list

    STEM: ClassVar[str] = "bench"  # <stem>.json, <stem>.md, <stem>.png
    ROWS_KEY: ClassVar[str] = "rows"  # the rows' key in the JSON

    def table(self) -> list[str]:
        """The Markdown table's lines, header first."""
        raise NotImplementedError

    def note(self) -> str:
        """One line under the table: how it was measured."""
        return ""

    def as_dict(self) -> dict:
        return {
            "meta": self.meta,
            self.ROWS_KEY: [asdict(r) for r in self.rows],
            "runs": [asdict(r) for r in self.runs],
        }

    def markdown(self) -> str:
        return "\n".join(self.table()) + "\n" + self.note()

    def plot(self, path: Path) -> Path | None:
        """Write a PNG of the report, or None where it has none."""
        return None

    @classmethod
    def check_outputs(cls, out_dir: str | Path, inputs: Inputs | None = None) -> None:
        """Before anything is measured: none of the files :meth:`write` would write there is
        one of ``inputs`` or the command's recorded inputs (:func:`~gguf_exact.formats.paths.check_not_input`)."""
        for ext in ("json", "md", "png"):
            check_not_input(Path(out_dir) / f"{cls.STEM}.{ext}", inputs)

    def write(self, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
        """Write ``<stem>.json``, ``<stem>.md`` and, with ``plot`` where the report plots (and
        matplotlib is there), ``<stem>.png``; returns the paths written. A plot that could not
        be drawn is noted in the Markdown."""
        out = Path(out_dir)
        output_folder(out)
        paths = {"json": out / f"{self.STEM}.json", "markdown": out / f"{self.STEM}.md"}
        write_text(paths["json"], json.dumps(self.as_dict(), indent=2) + "\n")
        md = self.markdown()
        if plot:
            try:
                png = self.plot(out / f"{self.STEM}.png")
                if png is not None:
                    paths["png"] = png
                    md += f"\n![tokens/s and tokens per target pass against n-max]({png.name})\n"
            except GgufExactError as e:
                md += f"\n(no plot: {e})\n"
        write_text(paths["markdown"], md)
        return paths


__all__ = ["TARGET", "Arm", "Figures", "Report", "alternating_order", "cell", "cpu_model", "machine", "yes_no"]
