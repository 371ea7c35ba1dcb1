"""Which source tensor each donor tensor comes from, and what a re-pack does with it.

Pure bookkeeping over names and shapes (no tensor data): the donor's tensor list,
the checkpoint's tensor list and config, and one name table per architecture
(:mod:`gguf_exact.gemma4.names` for ``gemma4``, :mod:`gguf_exact.gemma4.assistant` for
``gemma4-assistant``). Every mismatch is one :class:`GgufExactError` line.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGMLQuantizationType

from gguf_exact.errors import GgufExactError, InputError
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.gemma4 import assistant as gemma4_assistant
from gguf_exact.gemma4 import names as gemma4_names
from gguf_exact.gemma4.names import COPY, PROBE, QAT
from gguf_exact.stream.jobs import GENERATED, UNMAPPED, TensorJob
from gguf_exact.stream.source_rows import RowSource, TensorLocation

Q4_0 = GGMLQuantizationType.Q4_0


@dataclass
class RepackMap:
    arch: str
    jobs: list[TensorJob]
    source_only: list[str] = field(default_factory=list)  # HF text-model tensors the donor lacks
    unmapped: list[str] = field(default_factory=list)  # donor tensors of no known name, copied


def _text(config: dict) -> dict:
    return config.get("text_config") or config


def check_same_model(donor_path: Path, header_value, arch: str, config: dict, config_path: Path) -> None:
    """Donor hyperparameters against the source's config.json."""
    gemma4_assistant.check_types(config, _text(config), str(config_path))
    archs = config.get("architectures") or []
    expected = (
        gemma4_names.SUPPORTED_ARCHITECTURES if arch == gemma4_names.ARCH else gemma4_assistant.SUPPORTED_ARCHITECTURES
    )
    if not any(a in expected for a in archs):
        raise InputError(
            f"{config_path}: architectures {archs} do not match the donor's {arch} ({donor_path}); "
            f"expected one of {', '.join(expected)}: donor and source are different models"
        )
    text = _text(config)
    pairs = [
        ("block_count", text.get("num_hidden_layers"), "num_hidden_layers"),
        ("embedding_length", text.get("hidden_size"), "hidden_size"),
    ]
    if arch == gemma4_names.ARCH:
        pairs.append(
            (
                "embedding_length_per_layer_input",
                text.get("hidden_size_per_layer_input") or 0,
                "hidden_size_per_layer_input",
            )
        )
    else:
        pairs.append(
            (
                "embedding_length_out",
                config.get("backbone_hidden_size", text.get("backbone_hidden_size")),
                "backbone_hidden_size",
            )
        )
    for key, want, hf_key in pairs:
        have = header_value(f"{arch}.{key}")
        if have is not None and want is not None and int(have) != int(want):
            raise InputError(
                f"{donor_path}: {arch}.{key} is {have} but {config_path} has {hf_key} {want}: donor and source are different models"
            )


def _by_gguf_name(arch: str, hf_names: list[str]) -> tuple[dict[str, tuple[str, str | None]], list[str]]:
    """GGUF name -> (HF name, role; None: from the shape) for every source tensor with a
    mapping, and the HF text-model tensors with none."""
    out: dict[str, tuple[str, str | None]] = {}
    unknown: list[str] = []
    for hf in sorted(hf_names):
        if arch == gemma4_names.ARCH:
            m = gemma4_names.gguf_tensor_name(hf)
            if m is None:
                if gemma4_names.text_name(hf) is not None:
                    unknown.append(hf)
                continue
            out[m.gguf_name] = (hf, m.role)
        else:
            try:
                name = gemma4_assistant.gguf_tensor_name(hf)
            except GgufExactError:
                unknown.append(hf)
                continue
            if name in (gemma4_assistant.CENTROIDS, gemma4_assistant.ORDERING):
                continue  # the optional ordered head: a donor's copy is kept as it is (unmapped), none is no loss
            out[name] = (hf, None)  # role from the shape below
    return out, unknown


def _shape_ok(donor_shape: tuple[int, ...], src_shape: tuple[int, ...], gguf_name: str) -> bool:
    if donor_shape == src_shape:
        return True
    if min(len(donor_shape), len(src_shape)) <= 1:  # vectors and scalars: [1] == []
        return math.prod(donor_shape) == math.prod(src_shape) and max(len(donor_shape), len(src_shape)) <= 1
    # upstream drops out-of-vocabulary rows of token_embd
    return gguf_name == "token_embd.weight" and donor_shape[1:] == src_shape[1:] and donor_shape[0] <= src_shape[0]


def build_map(
    donor_path: Path, arch: str, tensors: list[TensorEntry], locations: dict[str, TensorLocation], source_dir: Path
) -> RepackMap:
    """Resolve every donor tensor; raise on a shape mismatch or a known donor
    tensor whose source is missing."""
    by_gguf, unknown_hf = _by_gguf_name(arch, list(locations))
    jobs, unmapped, used = [], [], set()
    for entry in tensors:
        kind = gemma4_names.tensor_kind(entry.name, len(entry.ne))
        hit = by_gguf.get(entry.name)
        part = None
        if hit is None and arch == gemma4_names.ARCH:
            split = gemma4_names.split_expert_source(entry.name)
            if split and split[0] in by_gguf:
                hit, half = by_gguf[split[0]], split[1]
                fused = locations[hit[0]].shape
                if len(fused) != 3 or fused[1] % 2:
                    raise InputError(
                        f"{source_dir}: tensor {hit[0]} has shape {list(fused)}, not a fused (experts, 2 x rows, cols) bank"
                    )
                part = (half * fused[1] // 2, fused[1] // 2, fused[1])
                used.add(split[0])
        if hit is None:
            if entry.name in gemma4_names.GENERATED:
                jobs.append(TensorJob(entry, GENERATED, kind, note="generated from the config, kept"))
                continue
            expected = _expected_hf_name(arch, entry.name, locations)
            if expected is not None:
                raise InputError(
                    f"{source_dir}: no tensor {expected} for the donor's {entry.name}; "
                    f"is a shard missing, or is the source another model than {donor_path.name}?"
                )
            unmapped.append(entry.name)
            jobs.append(TensorJob(entry, UNMAPPED, kind, note="no source tensor known, kept"))
            continue
        hf_name, role = hit
        used.add(entry.name)
        source = RowSource(locations[hf_name], part)
        fused = locations[hf_name].shape
        src_shape = (fused[0], part[1], *fused[2:]) if part else fused
        if not _shape_ok(entry.shape, tuple(src_shape), entry.name):
            raise InputError(
                f"{donor_path}: tensor {entry.name} has shape {list(entry.shape)} but the source's {hf_name} "
                f"has {list(src_shape)}: donor and source are different models"
            )
        if role is None:  # gemma4-assistant: matrices are QAT, the rest copied
            role = QAT if len(entry.ne) >= 2 else COPY
        note = ""
        if role in (QAT, PROBE) and entry.cols % 32:
            role, note = COPY, f"row length {entry.cols} is not a multiple of 32, kept"
        if part:
            note = f"{'gate' if part[0] == 0 else 'up'} half of {hf_name}"
        elif entry.shape[0] < src_shape[0] and len(entry.shape) == 2:
            note = f"first {entry.shape[0]} of {src_shape[0]} rows"
        jobs.append(TensorJob(entry, role, kind, hf_name, source, note))
    source_only = sorted(hf for g, (hf, _) in by_gguf.items() if g not in used) + unknown_hf
    return RepackMap(arch, jobs, source_only, unmapped)


def _expected_hf_name(arch: str, gguf_name: str, locations: dict[str, TensorLocation]) -> str | None:
    """The HF name a known donor tensor would come from (for the error message)."""
    if arch == gemma4_names.ARCH:
        prefix = next((p for p in gemma4_names.TEXT_PREFIXES if any(n.startswith(p) for n in locations)), "model.")
        for hf, (g, _) in gemma4_names.GLOBAL_TENSORS.items():
            if g == gguf_name:
                return prefix + hf
        if gguf_name.startswith("blk."):
            layer, rest = gguf_name[4:].split(".", 1)
            for hf, (g, _) in gemma4_names.LAYER_TENSORS.items():
                if g == rest:
                    return f"{prefix}layers.{layer}.{hf}"
        return None
    for hf, g in gemma4_assistant.GLOBAL_TENSORS.items():
        if g == gguf_name:
            return hf
    if gguf_name.startswith("blk."):
        layer, rest = gguf_name[4:].split(".", 1)
        for hf, g in gemma4_assistant.LAYER_TENSORS.items():
            if f"{g}.weight" == rest:
                return f"model.layers.{layer}.{hf}"
    return None
