"""Where llama.cpp puts each weight of a Gemma 4 model: which layer and device, what a
device refuses, what the CPU backend repacks (llama.cpp 0c1e57098). Part of the memory
plan (:mod:`.memory_plan`) and of its split over devices (:mod:`.device_plan`).

- **Layers** (``llama_model::load_tensors``): layer ``il`` is on the GPU when
  ``il >= block_count + 1 - n_gpu_layers``, the output layer (index ``block_count``)
  too; ``token_embd`` and ``per_layer_token_embd`` are input-layer tensors and stay in
  host memory (memory-mapped; Gemma 4 pages ``per_layer_token_embd`` in lazily). A tied
  output head is a second copy of ``token_embd`` on the output layer's device.
- **What a device refuses** (``weight_buft_supported`` in ``src/llama-model-loader.cpp``):
  llama.cpp asks the device whether it can run the op the weight is used in, built
  against 512 columns (a matmul ``w x F32[ne0, 512]`` for a matrix, a ``get_rows`` of 512
  ids for an embedding or the ordered head's ``token_ordering``); if not, the weight takes
  the next buffer type of its layer's list: the CPU. Vulkan refuses an op any of whose
  tensors is larger than the device's ``maxStorageBufferRange`` (``tensor_size_supported``
  in ``ggml-vulkan.cpp``; no limit with ``VK_EXT_shader_64bit_indexing``). A 262,144-token
  head's probe result is 262,144 x 512 F32 values, 512 MiB: over Mesa's lavapipe's
  128 MiB, within the 4 GiB an NVIDIA card reports. On such a device the tied head (and
  ``token_ordering``) stays in RAM and its matmul runs on the CPU.
- **The CPU** (``ggml-cpu/repack.cpp``): every Q4_0 matrix that a matmul reads there is
  copied into an interleaved layout (``CPU_REPACK``: 8 rows at a time with AVX2, 4 on ARM
  with dot-product instructions), the tied Q4_0 head of a drafter included; what stays
  memory-mapped (``CPU_Mapped``) is the span of the file from the first to the last tensor
  not repacked (:func:`cpu_weight_buffers`). A CPU serving a full-size E2B holds its ~1 GB
  of layer matrices twice: mapped, and repacked.

Pure: the tensor table and numbers in, bytes out.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType

from gguf_exact.formats.gguf_layout import TensorEntry

INPUT_TENSORS = ("token_embd.weight", "per_layer_token_embd.weight")  # LLM_TENSOR_LAYER_INPUT: host memory
OUTPUT_LAYER_PREFIXES = ("output", "masked_embd_")  # LLM_TENSOR_LAYER_OUTPUT (the ordered head: patch #24)
PROBE_COLUMNS = 512  # llama.cpp's probe op: 512 tokens
F32 = 4
GET_ROWS_TENSORS = (*INPUT_TENSORS, "masked_embd_ordering")


def probe_bytes(t: TensorEntry, as_head: bool = False) -> int:
    """The largest tensor of the op llama.cpp probes the device with for ``t``: the
    weight itself, its F32 operand or its result (``get_rows``: a row of ``ne0`` per id;
    a matrix: ``ne1`` outputs per column; a vector (norms, scales): its own F32 size).
    ``as_head``: ``t`` is ``token_embd``'s copy as the tied output head (a matrix)."""
    if t.name in GET_ROWS_TENSORS and not as_head:
        return max(t.nbytes, F32 * t.ne[0] * PROBE_COLUMNS)
    if len(t.ne) >= 2:
        return max(t.nbytes, F32 * t.ne[0] * PROBE_COLUMNS, F32 * t.ne[1] * PROBE_COLUMNS)
    return max(t.nbytes, F32 * t.ne[0])


def refused(t: TensorEntry, tensor_limit: int | None, as_head: bool = False) -> bool:
    """Whether a device whose largest tensor is ``tensor_limit`` bytes (None: no limit)
    refuses ``t``, which llama.cpp then keeps in host memory."""
    return tensor_limit is not None and probe_bytes(t, as_head) > tensor_limit


def _layer_of(name: str) -> int | None:
    parts = name.split(".", 2)
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() else None


def placed_weights(tensors: list[TensorEntry], n_layer: int) -> list[tuple[TensorEntry, int | None, bool]]:
    """(tensor, layer, is a copy) of each weight as llama.cpp places it: layer None for the
    input tensors (host memory), ``n_layer`` for the output layer; a tied output head adds a
    copy of ``token_embd`` on the output layer (used where that layer is offloaded)."""
    names = {t.name for t in tensors}
    out: list[tuple[TensorEntry, int | None, bool]] = []
    for t in tensors:
        if t.name in INPUT_TENSORS:
            out.append((t, None, False))
            if t.name == "token_embd.weight" and "output.weight" not in names:
                out.append((t, n_layer, True))
            continue
        il = _layer_of(t.name)
        if il is None:  # output norm, head, ordered head: the output layer; rope_freqs, per_layer_*: with layer 0
            il = n_layer if t.name.startswith(OUTPUT_LAYER_PREFIXES) else 0
        out.append((t, il, False))
    return out


def weight_layers(tensors: list[TensorEntry], n_layer: int) -> list[tuple[int | None, int, bool]]:
    """(layer, bytes, is a copy) of each weight: :func:`placed_weights` without the tensors."""
    return [(il, t.nbytes, copy) for t, il, copy in placed_weights(tensors, n_layer)]


def weight_split(
    tensors: list[TensorEntry],
    n_layer: int,
    gpu_layers: int,
    tensor_limit: int | None = None,
    repack_rows: int | None = None,
) -> tuple[int, int]:
    """(bytes on the GPU, bytes in host memory) of a model's weights with ``gpu_layers``
    of its ``n_layer + 1`` layers offloaded (the output layer is the last). A weight the
    device refuses (its largest tensor ``tensor_limit`` bytes: :func:`refused`)
    stays in host memory: repacked there when it is a Q4_0 matrix the CPU repacks (rows a
    multiple of ``repack_rows``), else memory-mapped (the tied head's copy maps the bytes
    ``token_embd`` already maps: nothing more)."""
    gpu_from = n_layer + 1 - gpu_layers
    device = host = 0
    for t, il, copy in placed_weights(tensors, n_layer):
        if il is None or il < gpu_from:
            host += 0 if copy else t.nbytes
        elif refused(t, tensor_limit, as_head=copy):
            host += t.nbytes if repacks(t, repack_rows) or not copy else 0
        else:
            device += t.nbytes
    return device, host


def output_head(tensors: list[TensorEntry]) -> TensorEntry | None:
    """The matrix the output head multiplies by: ``output.weight``, else the tied ``token_embd``."""
    by_name = {t.name: t for t in tensors}
    return by_name.get("output.weight", by_name.get("token_embd.weight"))


def head_in_host(tensors: list[TensorEntry], n_layer: int, gpu_layers: int, tensor_limit: int | None = None) -> bool:
    """Whether the output head's matmul runs on the CPU with ``gpu_layers`` of the ``n_layer + 1``
    layers offloaded: its layer (the output layer) stays on the CPU, or the device refuses it."""
    head = output_head(tensors)
    if head is None or gpu_layers < 1:
        return True
    return refused(head, tensor_limit, as_head=head.name == "token_embd.weight")


def repacks(t: TensorEntry, repack_rows: int | None) -> bool:
    """Whether llama.cpp's CPU backend repacks ``t`` (a 2-D Q4_0 matrix whose rows are a
    multiple of ``repack_rows``; None: this CPU repacks nothing)."""
    return (
        repack_rows is not None
        and t.type == GGMLQuantizationType.Q4_0
        and len(t.ne) == 2
        and t.ne[1] % repack_rows == 0
    )


def q4_0_repack_rows(cpu) -> int | None:
    """Row multiple of the Q4_0 matrices llama.cpp's CPU backend repacks on ``cpu`` (a
    :class:`~gguf_exact.builds.cpu_features.CpuTarget`), None when it repacks none
    (``ggml_repack_get_optimal_repack_type``: AVX2 -> 8x8, ARM dot product -> 4x4 / 4x8)."""
    if "avx2" in cpu.features:
        return 8
    if cpu.native and ({"asimddp", "i8mm"} & set(cpu.features)):
        return 4
    return None


def cpu_weight_buffers(tensors: list[TensorEntry], repack_rows: int | None) -> tuple[int, int]:
    """(``CPU_Mapped`` bytes, ``CPU_REPACK`` bytes) llama.cpp logs for a model whose weights
    all stay on the CPU, repacking Q4_0 matrices with rows a multiple of ``repack_rows``.

    Repacked: each 2-D Q4_0 matmul weight (not the input embeddings, which are read a
    row at a time), and a second copy of a Q4_0 ``token_embd`` when it is also the tied
    output head. Mapped: the file from the first to the last tensor not repacked."""
    names = {t.name for t in tensors}
    repacked = sum(t.nbytes for t in tensors if t.name not in INPUT_TENSORS and repacks(t, repack_rows))
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embd is not None and "output.weight" not in names and repacks(embd, repack_rows):
        repacked += embd.nbytes  # the tied head's copy
    kept = sorted(
        (t for t in tensors if t.name in INPUT_TENSORS or not repacks(t, repack_rows)), key=lambda t: t.offset
    )
    mapped = kept[-1].offset + kept[-1].nbytes - kept[0].offset if kept else 0
    return mapped, repacked


__all__ = [
    "cpu_weight_buffers",
    "head_in_host",
    "output_head",
    "placed_weights",
    "probe_bytes",
    "q4_0_repack_rows",
    "refused",
    "repacks",
    "weight_layers",
    "weight_split",
]
