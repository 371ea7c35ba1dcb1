"""What llama-server reports about speculation, parsed (pure functions, no I/O).

- ``/metrics`` (with ``--metrics``): ``llamacpp:spec_decode_num_drafts_total``,
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``.
- the per-request log line ``draft acceptance = 0.84656 (  160 accepted /   189
  generated), mean len =  2.68``: accepted / generated draft tokens of one request, and
  the mean tokens kept per target step (1 + accepted / verification steps).
"""

import re
from dataclasses import dataclass

METRIC_PREFIX = "llamacpp:"
DRAFT_METRICS = {
    "drafts": "spec_decode_num_drafts_total",
    "draft_tokens": "spec_decode_num_draft_tokens_total",
    "accepted_tokens": "spec_decode_num_accepted_tokens_total",
}
_ACCEPT = re.compile(
    r"draft acceptance = (?P<rate>[0-9.]+) \(\s*(?P<accepted>\d+) accepted /\s*(?P<generated>\d+) generated\), mean len =\s*(?P<mean>[0-9.]+)"
)
_METRIC = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class DraftCounters:
    """Totals since the server started."""

    drafts: int  # verification steps that carried a draft
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...] = ()  # accepted tokens at draft position 0, 1, ...

    @property
    def rate(self) -> float | None:
        """Accepted share of drafted tokens; None before any draft."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def position_rates(self) -> tuple[float, ...]:
        """Per draft position, the share of drafts whose token there was accepted: the
        figure that says whether one more draft token (a higher n-max) pays."""
        return tuple(n / self.drafts for n in self.accepted_per_position) if self.drafts else ()


@dataclass(frozen=True)
class Acceptance:
    """One request's ``draft acceptance`` log line."""

    rate: float
    accepted: int
    generated: int
    mean_len: float
    line: str


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value}; a labelled series appears both as
    ``name{labels}`` and summed under its bare name."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        values[m["name"]] = values.get(m["name"], 0.0) + value
        if m["labels"] is not None:
            values[f"{m['name']}{{{m['labels']}}}"] = value
    return values


def draft_counters(metrics: dict[str, float]) -> DraftCounters | None:
    """The three draft counters, or None when the server does not export them."""
    names = {k: METRIC_PREFIX + v for k, v in DRAFT_METRICS.items()}
    if not any(n in metrics for n in names.values()):
        return None
    per_pos: list[int] = []
    while f'{METRIC_PREFIX}{PER_POSITION}{{position="{len(per_pos)}"}}' in metrics:
        per_pos.append(int(metrics[f'{METRIC_PREFIX}{PER_POSITION}{{position="{len(per_pos)}"}}']))
    return DraftCounters(**{k: int(metrics.get(n, 0)) for k, n in names.items()}, accepted_per_position=tuple(per_pos))


def parse_acceptance(log_text: str, last: int | None = None) -> list[Acceptance]:
    """Every ``draft acceptance`` line in a llama-server log, oldest first (the last ``last``)."""
    found = []
    for line in log_text.splitlines():
        m = _ACCEPT.search(line)
        if m:
            found.append(
                Acceptance(float(m["rate"]), int(m["accepted"]), int(m["generated"]), float(m["mean"]), line.strip())
            )
    return found[-last:] if last else found
