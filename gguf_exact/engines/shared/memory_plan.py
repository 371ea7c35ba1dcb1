"""How much memory llama-server will take for a Gemma 4 pair, from the GGUF headers alone.

llama.cpp's ``--fit`` (``common/fit.cpp``) asks each device for three figures (model
weights, the context's KV cache, the compute buffers) by loading the model without
allocating; that needs llama.cpp and the whole file. This module reasons the same way
from the header (hyperparameters and the tensor table) and the profile's options,
following llama.cpp 0c1e57098:

- **KV cache** (``src/llama-kv-cache*.cpp``, ``llama_model::create_memory``): Gemma 4 has
  two caches, ``non-SWA`` for the full-attention layers with ``n_ctx_seq`` cells and
  ``SWA`` for the sliding layers with ``pad256(min(n_ctx_seq, n_swa * (unified ?
  n_seq : 1) + n_ubatch))`` cells (all ``n_ctx_seq`` with ``--swa-full``). Layers past
  ``block_count - shared_kv_layers`` reuse an earlier layer's cache and have none. Each
  layer's K row is ``head_count_kv[il] * key_length(il)`` wide (``key_length_swa`` on
  sliding layers), V likewise, except that without flash attention V is stored
  transposed and every layer's V row is the widest layer's. ``n_ctx`` is padded to 256;
  one stream per slot unless the cache is unified. The MTP drafter
  (``gemma4-assistant``) reads the target's cache (its layers share the target's last
  sliding and last full layer) and allocates none.
- **Weights**: where llama.cpp puts each one (layers, the tied head's copy, what a
  device refuses, the CPU's repacking): :mod:`.weight_placement`.
- **Compute buffers**: llama.cpp measures them by building the worst-case graph
  (``n_ubatch`` tokens against a full cache); here they are estimated from the graph's
  largest live tensors (:func:`compute_estimate`): an upper-end guess, not a
  measurement. Beside a GPU the CPU keeps a compute buffer of its own in host memory
  (``Vulkan_Host``, ``CUDA_Host``: the graph's inputs, the embeddings' rows, a head the
  device refused; :func:`~.compute_estimate.host_compute_estimate`), which competes with
  RAM. The formulas are in the functions' docs.

Every function here is pure: header data and numbers in, bytes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGMLQuantizationType

from gguf_exact.engines.shared.compute_estimate import compute_estimate, host_compute_estimate
from gguf_exact.engines.shared.knobs import KV_CACHE_TYPES
from gguf_exact.engines.shared.weight_placement import (
    cpu_weight_buffers,
    head_in_host,
    output_head,
    q4_0_repack_rows,
    weight_layers,
    weight_split,
)
from gguf_exact.errors import ArgumentError, Message, Param
from gguf_exact.formats.gguf_layout import TensorEntry
from gguf_exact.formats.gguf_layout import row_bytes as gguf_row_bytes
from gguf_exact.pair.geometry import Geometry

MIB = 1024 * 1024
KV_PAD = 256  # llama.cpp pads n_ctx and the SWA cache to 256 cells


def pad(n: int, to: int = KV_PAD) -> int:
    return -(-n // to) * to


def row_bytes(type_name: str, n: int) -> int:
    """``ggml_row_size``: bytes of ``n`` values of a cache type (``f16``, ``q8_0``, ...)."""
    if type_name not in KV_CACHE_TYPES:
        raise ArgumentError(f"cache type {type_name!r}: expected one of {', '.join(KV_CACHE_TYPES)}")
    return gguf_row_bytes(GGMLQuantizationType[type_name.upper()], n)


@dataclass(frozen=True)
class MemoryInputs:
    """The llama-server options memory depends on, resolved as llama.cpp resolves them
    (:meth:`~.serving_config.ServingConfig.memory_inputs` makes them from a profile, as
    either engine applies it)."""

    n_ctx: int = 0  # --ctx-size; 0: the model's context_length
    n_parallel: int = -1  # --parallel; -1: auto (4 slots, unified cache)
    kv_unified: bool = False
    n_batch: int = 2048
    n_ubatch: int = 512
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"  # on / off / auto (auto starts on; only a device without it turns it off)
    swa_full: bool = False
    n_gpu_layers: int = -1  # -1: auto (as many as fit: all, for the plan); <= -2: all
    n_gpu_layers_draft: int = -1
    kv_offload: bool = True
    n_draft_max: int = 3  # --spec-draft-n-max
    gpu: bool = False  # a GPU build (the profile's build is not cpu)

    @property
    def n_seq(self) -> int:
        return 4 if self.n_parallel < 0 else self.n_parallel

    @property
    def unified(self) -> bool:
        return self.kv_unified or self.n_parallel < 0  # llama-server's auto slots share one cache

    def context(self, geom: Geometry) -> tuple[int, int]:
        """(n_ctx, n_ctx_seq) as ``llama_context`` sets them: padded to 256, split per slot."""
        n_ctx = pad(self.n_ctx or geom.n_ctx_train)
        if self.unified:
            return n_ctx, n_ctx
        per_seq = pad(n_ctx // self.n_seq)
        return per_seq * self.n_seq, per_seq

    def ubatch(self, geom: Geometry) -> int:
        n_ctx, _ = self.context(geom)
        return min(min(n_ctx, self.n_batch), self.n_ubatch)

    @property
    def v_transposed(self) -> bool:
        """llama.cpp stores V transposed when flash attention is off (decided when the cache is made)."""
        return self.flash_attn == "off"

    def layers_on_gpu(self, n_layer: int, draft: bool = False) -> int:
        """How many of the ``n_layer + 1`` layers (the output layer last) go to the GPU."""
        if not self.gpu:
            return 0
        ngl = self.n_gpu_layers_draft if draft else self.n_gpu_layers
        return n_layer + 1 if ngl < 0 else min(ngl, n_layer + 1)


@dataclass(frozen=True)
class KvCache:
    """One of llama.cpp's KV caches as it logs it: ``size = ... (N cells, L layers, ...)``."""

    name: str  # "non-SWA" or "SWA"
    cells: int
    layers: int
    streams: int
    k_bytes: int
    v_bytes: int
    device_bytes: int  # the part on the GPU

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes


def cache_cells(geom: Geometry, s: MemoryInputs) -> dict[str, int]:
    """Cells per cache and stream: non-SWA ``n_ctx_seq``; SWA as the module doc says."""
    _, n_ctx_seq = s.context(geom)
    swa = n_ctx_seq if s.swa_full else pad(min(n_ctx_seq, geom.n_swa * (s.n_seq if s.unified else 1) + s.ubatch(geom)))
    return {"non-SWA": n_ctx_seq, "SWA": swa}


def layer_kv(geom: Geometry, s: MemoryInputs) -> list[tuple[int, str, int, int]]:
    """(layer, cache name, K bytes, V bytes) of each layer that allocates cache rows."""
    cells, streams = cache_cells(geom, s), 1 if s.unified else s.n_seq
    v_max = max(geom.v_width(il) for il in range(geom.n_layer))
    out = []
    for il in (il for il in range(geom.n_layer) if geom.has_own_kv(il)):
        name = "SWA" if geom.swa[il] else "non-SWA"
        k = row_bytes(s.type_k, geom.k_width(il)) * cells[name] * streams
        v = row_bytes(s.type_v, v_max if s.v_transposed else geom.v_width(il)) * cells[name] * streams
        out.append((il, name, k, v))
    return out


def kv_caches(geom: Geometry, s: MemoryInputs) -> list[KvCache]:
    """The non-SWA and SWA caches a context for ``geom`` allocates (none for a drafter)."""
    rows, streams = layer_kv(geom, s), 1 if s.unified else s.n_seq
    gpu_from = geom.n_layer + 1 - s.layers_on_gpu(geom.n_layer)
    out = []
    for name, cells in cache_cells(geom, s).items():
        mine = [r for r in rows if r[1] == name]
        dev = sum(k + v for il, _, k, v in mine if s.kv_offload and il >= gpu_from)
        out.append(KvCache(name, cells, len(mine), streams, sum(r[2] for r in mine), sum(r[3] for r in mine), dev))
    return out


@dataclass(frozen=True)
class PlanItem:
    what: str
    device_bytes: int
    host_bytes: int
    note: str = ""


@dataclass
class MemoryPlan:
    """What llama-server will hold, per item, on the GPU and in host memory."""

    items: list[PlanItem]
    gpu: bool
    n_ctx: int
    kv: list[KvCache] = field(default_factory=list)

    @property
    def device_bytes(self) -> int:
        return sum(i.device_bytes for i in self.items)

    @property
    def host_bytes(self) -> int:
        return sum(i.host_bytes for i in self.items)

    def lines(self) -> list[str]:
        where = "GPU" if self.gpu else "RAM"
        out = []
        for i in self.items:
            host = f" + {mib(i.host_bytes)} in RAM" if self.gpu and i.host_bytes else ""
            fig = mib(i.device_bytes if self.gpu else i.host_bytes)
            out.append(f"  {i.what:<18} {fig:>12} {where}{host}" + (f"  ({i.note})" if i.note else ""))
        total = self.device_bytes if self.gpu else self.host_bytes
        host = f" + {mib(self.host_bytes)} in RAM" if self.gpu and self.host_bytes else ""
        out.append(f"  {'total':<18} {mib(total):>12} {where}{host}")
        return out

    def warning(self, card_mib: int | None, card: str = "the card") -> Message | None:
        """One line when the GPU part exceeds ``card_mib``; None when it fits or there is no card.
        A front end adds how it sets ctx-size (the CLI: ``(--set ctx-size=N)``)."""
        if not self.gpu or not card_mib or self.device_bytes <= card_mib * MIB:
            return None
        return Message(
            f"the plan needs {mib(self.device_bytes)} on the GPU but {card} has {card_mib:,} MiB: llama-server "
            "may fail to load or run out of memory; lower ctx-size",
            Param("overrides", aside=" ({} ctx-size=N)"),
            " or n-gpu-layers",
        )


def mib(n: int) -> str:
    return f"{n / MIB:,.2f} MiB"


def plan_memory(target, drafter, s: MemoryInputs, cpu=None, tensor_limit: int | None = None) -> MemoryPlan:
    """The memory plan for serving ``target`` (and ``drafter``) with settings ``s``
    (:meth:`~.serving_config.ServingConfig.memory_inputs`: a profile as an engine applies it).
    ``target`` and ``drafter``: paths, or :class:`~gguf_exact.pair.checks.ModelFile`
    as read before (the header is not read again). ``cpu`` (a
    :class:`~gguf_exact.builds.cpu_features.CpuTarget`, default this machine's) says which
    Q4_0 matrices the CPU backend repacks. ``tensor_limit``: the largest tensor the GPU
    takes (:func:`gguf_exact.builds.devices.tensor_limit`; None: no limit), over which a
    weight stays in host memory (:func:`~.weight_placement.refused`)."""
    from gguf_exact.pair.checks import read_model

    if cpu is None:
        from gguf_exact.builds.cpu_features import host_cpu

        cpu = host_cpu()
    repack_rows = q4_0_repack_rows(cpu)

    def split(tensors: list[TensorEntry], n_layer: int, draft: bool) -> tuple[int, int, str]:
        if s.layers_on_gpu(n_layer, draft):
            on_gpu = s.layers_on_gpu(n_layer, draft)
            return (*weight_split(tensors, n_layer, on_gpu, tensor_limit, repack_rows), "")
        mapped, repacked = cpu_weight_buffers(tensors, repack_rows)
        note = f"{mib(mapped)} memory-mapped + {mib(repacked)} of Q4_0 matrices repacked" if repacked else ""
        return 0, mapped + repacked, note

    t = read_model(target, "target")
    tgeom, ttensors = t.geometry(), t.tensors
    tdev, thost, tnote = split(ttensors, tgeom.n_layer, False)
    n_ctx, _ = s.context(tgeom)
    caches = kv_caches(tgeom, s)
    kv_total = sum(c.bytes for c in caches)
    kv_dev = sum(c.device_bytes for c in caches)
    layout = ", ".join(f"{c.name} {c.cells:,} cells x {c.layers} layer{'' if c.layers == 1 else 's'}" for c in caches)
    n_outputs = max(1, min(s.n_batch, s.n_seq * (1 + s.n_draft_max)))  # llama-server's output rows
    cells = [c.cells for c in caches]
    items = [
        PlanItem("target weights", tdev, thost, "token embeddings stay in RAM" if s.gpu else tnote),
        PlanItem("KV cache", kv_dev, kv_total - kv_dev, f"context {n_ctx:,}: {layout}"),
    ]
    comp = compute_estimate(tgeom, s, cells, n_outputs)
    in_ram = head_in_host(ttensors, tgeom.n_layer, s.layers_on_gpu(tgeom.n_layer), tensor_limit)
    host_comp = host_compute_estimate(tgeom, s, cells, n_outputs, head_in_ram=in_ram)
    if drafter is not None:
        d = read_model(drafter, "drafter")
        dgeom, dtensors = d.geometry(), d.tensors
        ddev, dhost, dnote = split(dtensors, dgeom.n_layer, True)
        items.append(PlanItem("drafter weights", ddev, dhost, dnote))
        items.append(PlanItem("drafter KV cache", 0, 0, "none: it reads the target's"))
        comp += compute_estimate(dgeom, s, cells, s.n_seq)  # the MTP context: one output per slot
        head = output_head(dtensors)
        in_ram = head_in_host(dtensors, dgeom.n_layer, s.layers_on_gpu(dgeom.n_layer, True), tensor_limit)
        host_comp += host_compute_estimate(
            dgeom, s, cells, s.n_seq, backbone=tgeom.n_embd, head_in_ram=in_ram,
            head_row_bytes=head.nbytes // head.ne[1] if head is not None and len(head.ne) > 1 else 0,
        )  # fmt: skip
    on_gpu = s.gpu and s.layers_on_gpu(tgeom.n_layer) > 0
    # beside a GPU the CPU's own compute buffer is host memory (Vulkan_Host, CUDA_Host); without one it is all of it
    items.append(PlanItem("compute buffers", comp if on_gpu else 0, host_comp if on_gpu else comp, "estimate"))
    return MemoryPlan(items, s.gpu, n_ctx, caches)


__all__ = [
    "Geometry",
    "KvCache",
    "MemoryPlan",
    "PlanItem",
    "MemoryInputs",
    "compute_estimate",
    "cpu_weight_buffers",
    "host_compute_estimate",
    "cache_cells",
    "kv_caches",
    "layer_kv",
    "mib",
    "plan_memory",
    "q4_0_repack_rows",
    "weight_layers",
    "weight_split",
]
