"""The re-pack report: donor and output side by side, per tensor kind.

Pure functions over :class:`gguf_exact.repack.pipeline.RepackResult`. One row per kind
(``token_embd``, ``per_layer_token_embd``, ``per_layer_model_proj``, layer
matrices, expert banks, router, norms...): types and bytes in the donor and in the
output, and the bit-exact share against the source, the donor's beside ours. The
donor's figure is measured on a sample of chunks (every 32nd, see ``sampled``),
ours on every value.
"""

from collections import Counter

from gguf_exact.core.error_stats import sum_stats

KIND_ORDER = (
    "token_embd", "per_layer_token_embd", "per_layer_model_proj", "output", "layer matrices",
    "expert banks", "router", "drafter projections", "norms, scales, other",
)  # fmt: skip


def _mix(counter: Counter) -> str:
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def kind_rows(tensors) -> list[dict]:
    groups: dict[str, list] = {}
    for t in tensors:
        groups.setdefault(t.kind, []).append(t)
    rows = []
    for kind in sorted(groups, key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)):
        ts = groups[kind]
        ours, donor = sum_stats(t.ours for t in ts), sum_stats(t.donor for t in ts)
        rows.append(
            {
                "kind": kind,
                "tensors": len(ts),
                "values": sum(t.n_values for t in ts),
                "donor_types": _mix(Counter(t.donor_type for t in ts)),
                "donor_bytes": sum(t.donor_bytes for t in ts),
                "output_types": _mix(Counter(t.out_type for t in ts)),
                "output_bytes": sum(t.out_bytes for t in ts),
                "donor_exact_fraction": donor.exact_fraction if donor else None,
                "donor_rel_error": donor.rel_error if donor else None,
                "donor_sampled_values": donor.n_values if donor else 0,
                "exact_fraction": ours.exact_fraction if ours else None,
                "rel_error": ours.rel_error if ours else None,
                "max_ulps": ours.max_ulps if ours else None,
                "rewritten": sum(t.rewritten for t in ts),
            }
        )
    return rows


def build_report(result) -> dict:
    repacked = [t for t in result.tensors if t.rewritten and t.out_type == "Q4_0"]
    ours = sum_stats(t.ours for t in repacked)
    donor = sum_stats(t.donor for t in repacked)
    return {
        "output": str(result.path),
        "donor": str(result.donor_path),
        "source": str(result.source),
        "architecture": result.arch,
        "sha256": result.sha256,
        "bytes": result.size,
        "donor_bytes": result.donor_size,
        "file_type": {"donor": result.file_type[0], "output": result.file_type[1]},
        "repacked_tensors": len(repacked),
        "copied_tensors": sum(not t.rewritten for t in result.tensors),
        "repacked": ours.as_dict() if ours else None,
        "donor_on_repacked": (donor.as_dict() | {"sampled": True}) if donor else None,
        "seconds": result.seconds,
        "kinds": kind_rows(result.tensors),
        "source_only": result.source_only,
        "unmapped": result.unmapped,
        "off_grid": [{"name": t.name, "note": t.note} for t in result.tensors if t.note.startswith("off grid")],
        "tensors": [t.as_dict() for t in result.tensors],
    }
