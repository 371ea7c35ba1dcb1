"""The memory plan split over devices, as llama.cpp 0c1e57098 splits a model over RPC workers
and local GPUs (``serve --rpc``), and where the MTP drafter goes.

How llama.cpp places a model (``src/llama.cpp`` ``llama_model_load`` default device
selection; ``llama_model_base::load_tensors``):

- **Devices**, in order: every RPC worker's devices in ``--rpc`` order (named ``RPC0``,
  ``RPC1``, ... across workers: "at the front of the list to minimize network transfers"),
  then the local GPUs. The local CPU is not one of them: it holds what is not offloaded.
- **Layers**: the last ``n_gpu_layers`` of the ``n_layer + 1`` layers (the output layer
  last) are offloaded; offloaded layer ``il`` goes to the first device whose cumulative
  share exceeds ``(il - first offloaded) / offloaded`` (``std::upper_bound``). The shares
  are ``--tensor-split`` when given, else each device's free memory at load time. The
  input layer (``token_embd``, ``per_layer_token_embd``) always stays on the CPU; a tied
  output head is copied to the output layer's device.
- **KV cache**: each layer's cache rows live on that layer's device (``--no-kv-offload``:
  on the CPU).
- **Compute buffers**: one per device that runs part of the graph, each sized by its part;
  estimated here per device with :func:`~.compute_estimate.compute_estimate` (the logits
  on the output layer's device, the token and per-layer embeddings on the CPU).
- **--fit** (on by default) changes nothing when every device keeps 1 GiB free
  (``common/fit.cpp``: ``fit_params_target``); otherwise it lowers the context or moves
  layers to the CPU. The plan shows the split as asked and warns per device instead.

**The drafter** (``gemma4-assistant``) allocates no KV cache: its layers attend to the
target's last sliding and last full layer that own cache rows. Every draft step reads
those two layers' whole caches; on another device than the drafter, the scheduler copies
them over (for an RPC device: over the network) at every step. Its other inputs are one
hidden-state row and one token embedding per step. So the drafter goes on the device that
holds those caches (``--spec-draft-device``): at the pinned commit its devices otherwise
follow the target's list, and its layers would be spread over every worker.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from gguf_exact.engines.shared.compute_estimate import compute_estimate
from gguf_exact.engines.shared.memory_plan import MIB, MemoryInputs, cache_cells, layer_kv, mib, weight_layers
from gguf_exact.errors import ArgumentError, Message, Param
from gguf_exact.pair.geometry import Geometry

CPU = "CPU"
FIT_MARGIN = 1024 * MIB  # common_params::fit_params_target: what --fit keeps free per device


@dataclass(frozen=True)
class Device:
    """One device of the split: ``name`` as llama.cpp names it (``RPC0``, ``CUDA0``),
    ``where`` (a worker's ``HOST:PORT``, or ``local``), its free and total memory in bytes
    (None: not known, e.g. a worker not reachable during a dry run)."""

    name: str
    where: str
    free: int | None = None
    total: int | None = None


@dataclass
class DeviceShare:
    """What the plan puts on one device (or the CPU, :data:`CPU`)."""

    device: Device
    layers: list[int] = field(default_factory=list)  # target layers (n_layer: the output layer)
    weights: int = 0
    kv: int = 0
    compute: int = 0
    drafter_weights: int = 0
    drafter_compute: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.drafter_weights + self.drafter_compute


@dataclass
class DevicePlan:
    """The target (and drafter) over the devices; :attr:`draft_device` is where the drafter runs."""

    shares: list[DeviceShare]  # the devices in llama.cpp's order, the CPU last
    draft_device: str | None
    draft_reason: str
    split_from: str  # "tensor-split", "free memory" or "equal shares"
    kv_layers: tuple[int, ...] = ()  # the target layers whose caches the drafter reads
    shared_kv_moves: list[tuple[str, str, int]] = field(default_factory=list)  # (from, to, bytes per pass)

    def share(self, name: str) -> DeviceShare:
        return next(s for s in self.shares if s.device.name == name)

    def lines(self) -> list[str]:
        out = []
        for s in self.shares:
            span = _span(s.layers)
            drafter = f" + drafter {mib(s.drafter_weights + s.drafter_compute)}" if s.drafter_weights else ""
            where = f"{s.device.name} ({s.device.where})"
            free = f" of {s.device.free / MIB:,.0f} MiB free" if s.device.free else ""
            out.append(
                f"  {where:<26} layers {span:<9} weights {mib(s.weights)}, KV {mib(s.kv)}, "
                f"compute {mib(s.compute)}{drafter} = {mib(s.total)}{free}"
            )
        if self.draft_device:
            out.append(f"  drafter on {self.draft_device}: {self.draft_reason}")
        for src, dst, nbytes in self.shared_kv_moves:
            out.append(
                f"  note: layers on {dst} reuse caches held on {src}: {mib(nbytes)} copied to {dst} at every "
                "target pass (through the head: out of one worker and into the other); a tensor-split that starts the next device at or before "
                "the last layer with a cache of its own avoids it"
            )
        return out

    def warnings(self) -> list[Message]:
        """One line per device whose share leaves less than --fit's 1 GiB margin of its free memory."""
        out = []
        for s in self.shares:
            free = s.device.free
            if s.device.name == CPU or free is None or s.total + FIT_MARGIN <= free:
                continue
            out.append(
                Message(
                    f"{s.device.name} ({s.device.where}) gets {mib(s.total)} of {free / MIB:,.0f} MiB free "
                    "(llama.cpp keeps 1 GiB free: its --fit will shrink the context or keep layers on the CPU); "
                    "move layers with tensor-split",
                    Param("overrides", aside=" ({} tensor-split=A,B,...)"),
                    ", keep some on the CPU with n-gpu-layers, or lower ctx-size",
                )
            )
        return out


def _span(layers: list[int]) -> str:
    return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else (str(layers[0]) if layers else "-")


def parse_split(value, n_devices: int) -> list[float] | None:
    """``--tensor-split A,B,...`` as llama.cpp reads it (``,`` or ``/``; missing entries 0);
    None when absent or all zero (then the split is by free memory)."""
    if value in (None, False, ""):
        return None
    parts = [p for p in str(value).replace("/", ",").split(",") if p.strip()]
    try:
        shares = [float(p) for p in parts]
    except ValueError:
        raise ArgumentError(Param("overrides"), f" tensor-split={value}: expected numbers such as 3,1") from None
    if len(shares) > n_devices or any(x < 0 for x in shares):
        raise ArgumentError(
            Param("overrides"), f" tensor-split={value}: expected at most {n_devices} shares of 0 or more, one per device"
        )
    shares += [0.0] * (n_devices - len(shares))
    return shares if any(shares) else None


def layer_devices(n_layer: int, n_gpu_layers: int, shares: list[float]) -> list[int | None]:
    """The device index of each of the ``n_layer + 1`` layers (None: the CPU), as ``load_tensors``."""
    n_dev = len(shares)
    ngl = n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
    first, act = max(n_layer + 1 - ngl, 0), min(ngl, n_layer + 1) if n_dev else 0
    total = sum(shares)
    cumulative = [sum(shares[: i + 1]) / total for i in range(n_dev)]
    out: list[int | None] = []
    for il in range(n_layer + 1):
        if il < first or il - first >= act:
            out.append(None)
        else:
            out.append(min(bisect_right(cumulative, (il - first) / act), n_dev - 1))
    return out


def drafter_kv_layers(geom: Geometry) -> tuple[int, ...]:
    """The target's last sliding and last full layer that own cache rows: what the MTP drafter reads."""
    own = [il for il in range(geom.n_layer) if geom.has_own_kv(il)]
    found = [max((il for il in own if geom.swa[il] == swa), default=None) for swa in (True, False)]
    return tuple(il for il in found if il is not None)


def plan_devices(
    target,
    drafter,
    s: MemoryInputs,
    devices: list[Device],
    tensor_split=None,
    draft_device: str | None = None,
) -> DevicePlan:
    """Weights, KV cache and compute buffers per device for ``target`` (and ``drafter``:
    :class:`~gguf_exact.pair.checks.ModelFile` s, headers read) served with ``s`` over
    ``devices`` (llama.cpp's order); ``tensor_split``: the profile's value, if any;
    ``draft_device``: the profile's ``spec-draft-device``, else chosen (see the module doc)."""
    if not devices:
        raise ArgumentError("plan_devices: no devices to split over")
    tgeom: Geometry = target.geometry()
    n = tgeom.n_layer
    given = parse_split(tensor_split, len(devices))
    known = all(d.free for d in devices)
    shares = given or ([float(d.free or 0) for d in devices] if known else [1.0] * len(devices))
    split_from = "tensor-split" if given else ("free memory" if known else "equal shares (free memory unknown)")
    where = layer_devices(n, s.n_gpu_layers, shares)
    rows = [DeviceShare(d) for d in devices] + [DeviceShare(Device(CPU, "this machine"))]

    def row(idx: int | None) -> DeviceShare:
        return rows[-1] if idx is None else rows[idx]

    for layer, idx in enumerate(where):
        row(idx).layers.append(layer)
    for il, nbytes, copy in weight_layers(target.header.tensors, n):
        if il is None:
            rows[-1].weights += nbytes
        elif not copy or where[il] is not None:  # the tied head's copy only where the output layer is offloaded
            row(where[il]).weights += nbytes
    for il, _, k, v in layer_kv(tgeom, s):
        row(where[il] if s.kv_offload else None).kv += k + v
    cells = list(cache_cells(tgeom, s).values())
    n_outputs = max(1, min(s.n_batch, s.n_seq * (1 + s.n_draft_max)))
    for i, r in enumerate(rows[:-1]):
        if r.layers:
            r.compute = compute_estimate(tgeom, s, cells, n_outputs if where[n] == i else 0)
    t = s.ubatch(tgeom)
    rows[-1].compute = 4 * t * (tgeom.n_embd + tgeom.n_embd_per_layer * n)  # the input rows, gathered on the CPU
    if rows[-1].layers:
        rows[-1].compute += compute_estimate(tgeom, s, cells, n_outputs if where[n] is None else 0)

    kv_layers = drafter_kv_layers(tgeom)
    moves = shared_kv_moves(tgeom, s, where, rows) if s.kv_offload else []
    chosen, reason = draft_device, "as the profile's spec-draft-device says"
    if drafter is not None and chosen is None:
        holders = [row(where[il]) for il in kv_layers] if s.kv_offload else [rows[-1]]
        home = max(holders, key=lambda r: r.kv)
        chosen = home.device.name
        reason = (
            f"it reads the caches of target layers {', '.join(map(str, kv_layers))} at every draft step, and "
            f"{chosen} holds them: elsewhere they would be copied {'over the network ' if home.device.where != 'local' and chosen != CPU else ''}"
            "to it each step; from the target it needs only one hidden-state row and one token per step"
        )
    if drafter is not None:
        names = [r.device.name for r in rows]
        if chosen not in names:
            raise ArgumentError(
                Param("overrides"), f" spec-draft-device={chosen}: expected one of {', '.join(names)}"
            )  # fmt: skip
        home = rows[names.index(chosen)]
        dgeom: Geometry = drafter.geometry()
        on_device = home.device.name != CPU and s.n_gpu_layers_draft != 0
        for il, nbytes, copy in weight_layers(drafter.header.tensors, dgeom.n_layer):
            if il is None:
                rows[-1].drafter_weights += nbytes
            elif not copy or on_device:
                (home if on_device else rows[-1]).drafter_weights += nbytes
        (home if on_device else rows[-1]).drafter_compute = compute_estimate(dgeom, s, cells, s.n_seq)
    return DevicePlan(rows, chosen if drafter is not None else None, reason, split_from, kv_layers, moves)


def shared_kv_moves(geom: Geometry, s: MemoryInputs, where: list[int | None], rows: list[DeviceShare]) -> list[tuple[str, str, int]]:
    """Caches that travel each pass: a layer past ``n_layer - shared_kv_layers`` attends to the last
    earlier layer of its kind (sliding or full) that owns cache rows (E2B: 13 and 14); where the
    two sit on different devices the scheduler copies that whole cache to the reader's device."""
    kv = {il: k + v for il, _, k, v in layer_kv(geom, s)}
    own = [il for il in range(geom.n_layer) if geom.has_own_kv(il)]
    moved: dict[tuple[int | None, int | None], set[int]] = {}
    for il in range(geom.n_layer):
        if geom.has_own_kv(il):
            continue
        src = max((o for o in own if geom.swa[o] == geom.swa[il]), default=None)
        if src is not None and where[src] != where[il]:
            moved.setdefault((where[src], where[il]), set()).add(src)

    def name(idx: int | None) -> str:
        return (rows[-1] if idx is None else rows[idx]).device.name

    return [(name(a), name(b), sum(kv[il] for il in srcs)) for (a, b), srcs in moved.items()]


__all__ = [
    "CPU",
    "Device",
    "DevicePlan",
    "DeviceShare",
    "drafter_kv_layers",
    "layer_devices",
    "parse_split",
    "plan_devices",
    "shared_kv_moves",
]
