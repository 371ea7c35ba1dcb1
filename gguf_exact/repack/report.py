"""The re-pack report: donor and output side by side, per tensor kind.

Pure functions over :class:`gguf_exact.repack.pipeline.RepackResult`. One row per kind
(``token_embd``, ``per_layer_token_embd``, ``per_layer_model_proj``, layer
matrices, expert banks, router, norms...): types and bytes in the donor and in the
output, and the bit-exact share against the source, the donor's beside ours. The
donor's figure is measured on a sample of chunks (every 32nd, see ``sampled``),
ours on every value.
"""

from collections import Counter
from dataclasses import asdict, dataclass

from gguf_exact.core.error_stats import sum_stats

KIND_ORDER = (
    "token_embd", "per_layer_token_embd", "per_layer_model_proj", "output", "layer matrices",
    "expert banks", "router", "drafter projections", "norms, scales, other",
)  # fmt: skip


def _mix(counter: Counter) -> str:
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(frozen=True)
class KindRow:
    """One kind of tensor (``token_embd``, layer matrices, norms...) in the donor and in the output."""

    kind: str
    tensors: int
    values: int
    donor_types: str  # "Q4_0 x60, Q6_K"
    donor_bytes: int
    output_types: str
    output_bytes: int
    donor_exact_fraction: float | None  # over the sampled chunks
    donor_rel_error: float | None
    donor_sampled_values: int
    exact_fraction: float | None
    rel_error: float | None
    max_ulps: int | None
    rewritten: int

    def as_dict(self) -> dict:
        return asdict(self)


def kind_rows(tensors) -> list[KindRow]:
    groups: dict[str, list] = {}
    for t in tensors:
        groups.setdefault(t.kind, []).append(t)
    rows = []
    for kind in sorted(groups, key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)):
        ts = groups[kind]
        ours, donor = sum_stats(t.ours for t in ts), sum_stats(t.donor for t in ts)
        rows.append(
            KindRow(
                kind=kind,
                tensors=len(ts),
                values=sum(t.n_values for t in ts),
                donor_types=_mix(Counter(t.donor_type for t in ts)),
                donor_bytes=sum(t.donor_bytes for t in ts),
                output_types=_mix(Counter(t.out_type for t in ts)),
                output_bytes=sum(t.out_bytes for t in ts),
                donor_exact_fraction=donor.exact_fraction if donor else None,
                donor_rel_error=donor.rel_error if donor else None,
                donor_sampled_values=donor.n_values if donor else 0,
                exact_fraction=ours.exact_fraction if ours else None,
                rel_error=ours.rel_error if ours else None,
                max_ulps=ours.max_ulps if ours else None,
                rewritten=sum(t.rewritten for t in ts),
            )
        )
    return rows


def repacked(tensors) -> list:
    """The tensors re-packed as exact Q4_0 (not copied from the donor)."""
    return [t for t in tensors if t.rewritten and t.out_type == "Q4_0"]


def build_report(result) -> dict:
    ours, donor = result.repacked_stats, result.donor_stats
    return {
        "output": str(result.path),
        "donor": str(result.donor_path),
        "source": str(result.source),
        "architecture": result.arch,
        "sha256": result.sha256,
        "bytes": result.size,
        "donor_bytes": result.donor_size,
        "file_type": {"donor": result.file_type[0], "output": result.file_type[1]},
        "repacked_tensors": result.repacked_tensors,
        "copied_tensors": result.copied_tensors,
        "repacked": ours.as_dict() if ours else None,
        "donor_on_repacked": (donor.as_dict() | {"sampled": True}) if donor else None,
        "seconds": result.seconds,
        "kinds": [k.as_dict() for k in result.kinds],
        "source_only": result.source_only,
        "unmapped": result.unmapped,
        "off_grid": [{"name": name, "note": note} for name, note in result.off_grid],
        "tensors": [t.as_dict() for t in result.tensors],
    }
