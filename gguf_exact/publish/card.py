"""The model card of a release: Hugging Face front matter and the evidence, as Markdown.

Pure text from a :class:`Release`'s facts; nothing here reads a file. The front matter
holds what the Hub indexes (``license``, ``base_model`` with ``base_model_relation:
quantized``, ``tags``, ``quantized_by``, ``library_name``); the body what a reader checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gguf_exact.quality.report import QualityRow, quality_table


@dataclass(frozen=True)
class KindFigures:
    """One kind of tensor in the released file, as ``verify`` judged it."""

    kind: str
    tensors: int
    types: str  # "Q4_0 x64" or "Q4_0, BF16"
    values: int
    exact_fraction: float | None  # bit-exact against the source; None: no source
    max_ulps: int | None


@dataclass(frozen=True)
class CardFacts:
    repo: str
    file: str
    size: int
    sha256: str
    writer: str  # "repack", "convert", "repack --bf16", "convert --bf16"
    license: str
    base_model: str
    base_revision: str | None
    quantized_by: str
    inputs: list[tuple[str, str, int, str]]  # (role, file name, size, sha256): the donor or target
    kinds: list[KindFigures]
    verdict: str
    reproduce: list[str]
    check: list[str]
    use: list[str]
    tool: str  # "gguf-exact 0.1.0"
    quality: list[QualityRow] = field(default_factory=list)
    quality_note: str = ""


def _front_matter(f: CardFacts) -> list[str]:
    tags = ["gguf", "gemma4", "q4_0", "qat", "llama.cpp", "gguf-exact"]
    if "drafter" in f.writer or f.writer.startswith("convert"):
        tags.append("mtp-drafter")
    # json.dumps gives YAML-safe quoted scalars
    return [
        "---",
        f"license: {json.dumps(f.license)}",
        f"base_model: {json.dumps(f.base_model)}",
        "base_model_relation: quantized",
        "tags:",
        *(f"- {t}" for t in tags),
        f"quantized_by: {json.dumps(f.quantized_by)}",
        "library_name: gguf",
        "---",
    ]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _what(f: CardFacts) -> str:
    if f.writer.endswith("--bf16"):
        return "the bf16 reference: every weight matrix holds the source's own bf16 bits, under the same header as the exact Q4_0 file"
    if f.writer == "convert":
        return "an exact Q4_0 MTP drafter: every trained 4-bit level kept, scales chosen so values decode to the source's bf16 bits"
    return "an exact Q4_0 re-pack: the donor's header and metadata byte for byte, every QAT matrix re-packed keeping its trained levels"


def model_card(f: CardFacts) -> str:
    """README.md for the release (ends with a newline)."""
    at = f"{f.base_model}@{f.base_revision}" if f.base_revision else f.base_model
    lines = _front_matter(f) + [
        "",
        f"# {f.repo.split('/', 1)[1]}",
        "",
        f"`{f.file}` is {_what(f)}, made from [{f.base_model}](https://huggingface.co/{f.base_model}) "
        f"with {f.tool} (`{f.writer}`).",
        "",
        "## File",
        "",
        *_table(["file", "bytes", "sha256"], [[f"`{f.file}`", f"{f.size:,}", f"`{f.sha256}`"]]),
        "",
        "## Made from",
        "",
        f"- source checkpoint: `{at}`" + ("" if f.base_revision else " (revision not recorded)"),
        *(f"- {role}: `{name}`, {size:,} bytes, sha256 `{sha}`" for role, name, size, sha in f.inputs),
        "",
        "## Exactness, per kind of tensor",
        "",
        "Every tensor held to what the tool writes for the source (`gguf-exact verify`); bit-exact: the share "
        "of values that decode to the source's bf16 bits.",
        "",
        *_table(
            ["kind", "tensors", "type", "values", "bit-exact", "largest error (bf16 ULP)"],
            [
                [
                    k.kind,
                    str(k.tensors),
                    k.types,
                    f"{k.values:,}",
                    f"{k.exact_fraction:.4%}" if k.exact_fraction is not None else "-",
                    str(k.max_ulps) if k.max_ulps is not None and k.max_ulps >= 0 else "-",
                ]
                for k in f.kinds
            ],
        ),  # fmt: skip
        "",
        f"`{f.verdict}`",
        "",
    ]
    if f.quality:
        head, rows = quality_table(f.quality)
        lines += ["## Quality", "", f.quality_note + ".", "", *_table(head, rows), ""]
    lines += ["## Reproduce", "", "```sh", *f.reproduce, "```", "", "## Check", "", "```sh", *f.check, "```", ""]
    lines += ["## Use", "", "```sh", *f.use, "```", ""]
    return "\n".join(lines)
