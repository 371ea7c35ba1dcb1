"""The memory llama-server says it allocated, read from its log (``--log-verbosity 4``),
beside the memory plan (:mod:`.memory_plan`).

llama-server loads the target, then the drafter, and logs for each: its weight buffers
(``load_tensors: CPU_Mapped model buffer size = ... MiB``, ``CPU_REPACK ...``, a
``CUDA0`` one on a GPU build), its KV caches (``llama_kv_cache: size = ...``; the
drafter's are views of the target's and allocate nothing, ``CPU KV buffer size`` is
logged only for the target's) and its compute buffer (``sched_reserve: ... compute
buffer size``, reserved again with the same size when the server sets up the draft
context: the first per model counts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gguf_exact.engines.shared.memory_plan import MIB, MemoryPlan

WEIGHTS = re.compile(r"load_tensors: +(\S+) model buffer size = +([0-9.]+) MiB")
KV_BUFFER = re.compile(r"llama_kv_cache: +(\S+) KV buffer size = +([0-9.]+) MiB")
COMPUTE = re.compile(r"sched_reserve: +(\S+) compute buffer size = +([0-9.]+) MiB")
OUTPUT = re.compile(r"llama_context: +(\S+) +output buffer size = +([0-9.]+) MiB")
MODEL_START = re.compile(r"llama_model_load|load_tensors: loading model tensors")


@dataclass
class ModelBuffers:
    """One model's buffers as logged, in MiB, by buffer name (``CPU_Mapped``, ``CUDA0``...)."""

    weights: dict[str, float] = field(default_factory=dict)
    kv: dict[str, float] = field(default_factory=dict)
    compute: dict[str, float] = field(default_factory=dict)
    output: dict[str, float] = field(default_factory=dict)

    def total(self, what: str) -> float:
        return sum(getattr(self, what).values())


def logged_buffers(log: str) -> list[ModelBuffers]:
    """The buffers of each model in load order (target first), from a llama-server log."""
    models: list[ModelBuffers] = []
    for line in log.splitlines():
        if m := WEIGHTS.search(line):
            if not models or models[-1].kv or models[-1].compute:
                models.append(ModelBuffers())
            models[-1].weights[m.group(1)] = models[-1].weights.get(m.group(1), 0.0) + float(m.group(2))
            continue
        if not models:
            continue
        cur = models[-1]
        if m := KV_BUFFER.search(line):
            cur.kv[m.group(1)] = cur.kv.get(m.group(1), 0.0) + float(m.group(2))
        elif (m := COMPUTE.search(line)) and m.group(1) not in cur.compute:
            cur.compute[m.group(1)] = float(m.group(2))
        elif (m := OUTPUT.search(line)) and m.group(1) not in cur.output:
            cur.output[m.group(1)] = float(m.group(2))
    return models


@dataclass(frozen=True)
class Comparison:
    what: str  # weights, KV cache, compute
    planned_mib: float
    logged_mib: float

    @property
    def ratio(self) -> float:
        return self.planned_mib / self.logged_mib if self.logged_mib else float("inf")


def compare(plan: MemoryPlan, models: list[ModelBuffers]) -> list[Comparison]:
    """The plan's items against the logged buffers: target weights, drafter weights (when
    there is a drafter), KV cache, and compute buffers (target and drafter together)."""
    item = {i.what: (i.device_bytes + i.host_bytes) / MIB for i in plan.items}
    target = models[0]
    out = [Comparison("target weights", item["target weights"], target.total("weights"))]
    if "drafter weights" in item and len(models) > 1:
        out.append(Comparison("drafter weights", item["drafter weights"], models[1].total("weights")))
    out.append(Comparison("KV cache", item["KV cache"], target.total("kv")))
    compute = sum(m.total("compute") for m in models[:2])
    out.append(Comparison("compute buffers", item["compute buffers"], compute))
    return out


__all__ = ["Comparison", "ModelBuffers", "compare", "logged_buffers"]
