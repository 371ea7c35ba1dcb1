"""The serving configuration: each knob of a served model declared once, parsed once, rendered three ways.

A knob is a field of :class:`Options` whose :class:`Knob` says everything about it:
llama-server's long option and its aliases (also the profile key), the value's kind and
bounds, llama-server's default and the Python engine's where it differs, which engines
apply it, the table it belongs to and its help text. :func:`serving_config` parses a
profile's ``[server]`` and ``[draft]`` tables (``--set`` overrides and ``serve``'s own
options already applied: :meth:`~.profiles.Profile.with_overrides`) into a
:class:`ServingConfig`, refusing a bad value in one line naming the profile and the key.
Its renderings:

- :meth:`ServingConfig.server_args`: llama-server's command line (:meth:`ServingConfig.not_applied`
  names the knobs given that it leaves out);
- :meth:`ServingConfig.engine_options`: the Python engine's :class:`.EngineOptions`
  (and the options it does not apply, for a note);
- :meth:`ServingConfig.memory_inputs`: the memory plan's inputs, as either engine applies them.

A profile may name any other llama-server option: it passes through to llama-server's
command line as written (:attr:`ServingConfig.passthrough`), and the Python engine names
it as not applied. No other module reads a profile's tables (``tests/test_serving_config.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from gguf_exact.engines.shared.engine_options import EngineOptions
from gguf_exact.engines.shared.knobs import ALL_LAYERS, AUTO_LAYERS, BY_KEY, KNOB, LLAMA_SERVER, PYTHON, Options, Value
from gguf_exact.engines.shared.memory_plan import MemoryInputs, kv_caches
from gguf_exact.engines.shared.profiles import Profile
from gguf_exact.errors import InputError
from gguf_exact.pair.checks import ModelFile

# The fewest slots a drafter serves from one KV cache (ServingConfig.kv_unified): measured at 2 and 4
# users; 3 is not measured (from 3 slots on, a slot idle between two generating ones splits a batch too)
SHARED_CACHE_SLOTS = 3
# The most the shared cache may weigh against the target's weights (its bytes at the whole context over theirs)
# for the slots to share it. Measured at 4 users: E2B (0.011 at 4 x 512 cells) and E4B (0.023) ran 1.02-1.13x
# faster on one cache on the CPU; the tiny pairs (0.55) ran 0.88x with it on lavapipe, even the target alone
SHARED_CACHE_MAX_SHARE = 0.1


@dataclass(frozen=True)
class ServingConfig:
    """A profile's options parsed once, for a served pair with or without a drafter.

    ``given``: the knobs the profile gives, in its order (``[server]`` then ``[draft]``);
    ``passthrough``: its other llama-server options, as written."""

    profile: str
    build: str
    with_draft: bool
    options: Options
    given: tuple[str, ...] = ()
    passthrough: tuple[tuple[str, Value], ...] = ()
    target: ModelFile | None = field(default=None, repr=False, compare=False)  # the served target, where known

    def value(self, name: str, engine: str = LLAMA_SERVER) -> Any:
        """A knob's value: the profile's, else ``engine``'s default (None: the engine decides)."""
        given = getattr(self.options, name)
        return given if given is not None else KNOB[name].default_for(engine)

    # The values other modules ask for by name.
    @property
    def rpc(self) -> str | None:
        return self.options.rpc

    @property
    def threads(self) -> int | None:
        return self.options.threads

    @property
    def tensor_split(self) -> str | None:
        return self.options.tensor_split

    @property
    def draft_device(self) -> str | None:
        return self.options.draft_device

    @property
    def flash_attn(self) -> str:
        return str(self.value("flash_attn"))

    @property
    def n_max(self) -> int:
        return int(self.value("n_max"))

    @property
    def adaptive(self) -> bool:
        return bool(self.value("adaptive"))

    @property
    def p_min(self) -> float:
        return float(self.value("p_min"))

    @property
    def logprobs(self) -> bool:
        return bool(self.options.logprobs)

    @cached_property
    def kv_unified(self) -> bool:
        """One KV cache for every slot: as the profile says, else on where a drafter serves
        :data:`SHARED_CACHE_SLOTS` slots or more and the cache is small against the target's weights
        (:attr:`shared_cache_share` at most :data:`SHARED_CACHE_MAX_SHARE`; the target unknown: on). llama-server's
        own auto slots share one too. Why: with a cache per slot llama.cpp cuts a
        batch whose slots bring unequal rows into several passes (``llama_batch_allocr::split_equal``: a
        pass takes as many rows of each slot in a run), each reading every weight, so one slot's draft
        beside others' single rows costs a pass of its own. E2B on 2 CPU cores, 4 slots at context, rows per
        slot 4+2+1+1: 214 ms a cache per slot, 138 ms one cache. But one cache costs every row attention over
        every slot's cells (E4B at 400 tokens a slot: 4+4+4+4 rows 362 ms apart, 393 shared), and the target
        alone brings one row a slot, never split: without a drafter each slot keeps its own
        (``scripts/bench_batch_split.py``; docs/benchmarks.md). Under load with a drafter, one cache
        was 8-13% ahead at 4 users in 5 of 5 side-by-side runs and 1.4-3.9% behind at 2 users in 5 of
        6 (two slots' unequal rows make at most two passes): shared from :data:`SHARED_CACHE_SLOTS`. Where the
        cells weigh as much as the weights (the tiny pairs on lavapipe), the attention costs more than the
        splits save: 12% at 4 users, the target alone and the adaptive length alike."""
        if self.options.kv_unified is not None:
            return self.options.kv_unified
        parallel = int(self.value("parallel"))
        if parallel < 0:
            return True
        if not self.with_draft or parallel < SHARED_CACHE_SLOTS:
            return False
        share = self.shared_cache_share  # the header read only where the slots could share
        return share is None or share <= SHARED_CACHE_MAX_SHARE

    @cached_property
    def shared_cache_share(self) -> float | None:
        """The bytes of one KV cache for every slot at the whole context, over the target's weight bytes
        (None: the target is not known here)."""
        if self.target is None or self.target.header is None or self.target.weight_bytes <= 0:
            return None
        caches = kv_caches(self.target.geometry(), self._server_inputs(kv_unified=True))
        return sum(c.bytes for c in caches) / self.target.weight_bytes

    @property
    def kv_unified_per_slot(self) -> int:
        """A slot's most context in the shared cache: as given, else (the cache shared by this
        configuration's choice, ctx-size given) its share, ``ctx-size // parallel``, so that every slot
        keeps the room a cache of its own gave it and no slot's growth fails another's request; 0: no cap."""
        if self.options.kv_unified_per_slot is not None:
            return self.options.kv_unified_per_slot
        parallel, n_ctx = int(self.value("parallel")), int(self.value("ctx_size"))
        return n_ctx // parallel if self.implied_kv_unified and n_ctx > 0 else 0

    @property
    def implied_kv_unified(self) -> bool:
        """The shared cache is this configuration's choice, not the profile's: llama-server is told."""
        return self.options.kv_unified is None and self.kv_unified and int(self.value("parallel")) > 1

    def server_args(self) -> list[str]:
        """llama-server's arguments: the knobs given, in the profile's order, then the shared cache where
        :attr:`kv_unified` chose it, then the other options."""
        out: list[str] = []
        for name in self.given:
            if KNOB[name].engines & {LLAMA_SERVER}:
                out += KNOB[name].render(getattr(self.options, name))
        if self.implied_kv_unified:
            out += KNOB["kv_unified"].render(True)
            if self.kv_unified_per_slot and self.options.kv_unified_per_slot is None:
                out += KNOB["kv_unified_per_slot"].render(self.kv_unified_per_slot)
        for key, value in self.passthrough:
            out += [f"--{key}"] if value is True else [f"--{key}", str(value)]
        return out

    def engine_options(self) -> tuple[EngineOptions, list[str]]:
        """The Python engine's options, and the options given that it does not apply (for a note)."""
        if self.with_draft and self.options.spec_type not in (None, "draft-mtp"):
            raise InputError(
                f"profile {self.profile}: spec-type = {self.options.spec_type!r}; the Python engine drafts with the MTP drafter only (draft-mtp)"
            )
        if (self.options.parallel or 1) > 1:
            raise InputError(
                f"profile {self.profile}: parallel = {self.options.parallel}; the Python engine serves one request at a time (others queue), use parallel = 1"
            )
        ngl, ngld, threads = (self.value(n, PYTHON) for n in ("n_gpu_layers", "n_gpu_layers_draft", "threads"))
        given_ngld = self.options.n_gpu_layers_draft
        options = EngineOptions(
            n_ctx=self.value("ctx_size", PYTHON),
            n_max=self.value("n_max", PYTHON),
            adaptive=self.value("adaptive", PYTHON),
            adaptive_warmup=self.value("adaptive_warmup", PYTHON),
            shadow=bool(self.value("shadow", PYTHON)),
            p_min=self.value("p_min", PYTHON),
            rejection_sampling=bool(self.value("rejection_sampling", PYTHON)),
            n_gpu_layers=AUTO_LAYERS if ngl < 0 else ngl,  # llama.cpp: any negative count offloads every layer
            n_gpu_layers_draft=None if given_ngld is None else (AUTO_LAYERS if ngld < 0 else ngld),
            flash_attn=self.flash_attn != "off",  # auto: on, as llama-server turns it on for CPU and CUDA
            n_threads=threads,
            n_threads_batch=self.options.threads_batch or threads,  # as llama-server's --threads-batch default
            n_batch=self.value("batch_size", PYTHON),
            n_ubatch=self.value("ubatch_size", PYTHON),
        )
        return options, self.not_applied(PYTHON) + [key for key, _ in self.passthrough]

    def not_applied(self, engine: str) -> list[str]:
        """The knobs given that ``engine`` does not apply, for a note (silent ones left out)."""
        return [KNOB[n].flag for n in self.given if engine not in KNOB[n].engines and not KNOB[n].silent]

    def _server_inputs(self, kv_unified: bool) -> MemoryInputs:
        return MemoryInputs(
            n_ctx=self.value("ctx_size"),
            n_parallel=self.value("parallel"),
            kv_unified=kv_unified,
            n_batch=self.value("batch_size"),
            n_ubatch=self.value("ubatch_size"),
            type_k=self.value("cache_type_k"),
            type_v=self.value("cache_type_v"),
            flash_attn=self.flash_attn,
            swa_full=self.value("swa_full"),
            n_gpu_layers=self.value("n_gpu_layers"),
            n_gpu_layers_draft=self.value("n_gpu_layers_draft"),
            kv_offload=not self.value("no_kv_offload"),
            n_draft_max=self.n_max if self.with_draft else 0,
            gpu=self.build != "cpu",
        )

    def memory_inputs(self, engine: str = LLAMA_SERVER) -> MemoryInputs:
        """The memory plan's inputs as ``engine`` applies the profile: llama-server, or the Python
        engine, which serves one sequence, keeps the whole sliding-window cache (a rolled-back
        draft must not have lost cells) and runs with flash attention unless it is off."""
        if engine != PYTHON:
            return self._server_inputs(self.kv_unified)
        ngl = self.value("n_gpu_layers", PYTHON)
        ngld = ngl if self.options.n_gpu_layers_draft is None else self.options.n_gpu_layers_draft
        return replace(
            self.memory_inputs(LLAMA_SERVER),
            n_ctx=self.value("ctx_size", PYTHON),
            n_parallel=1,
            kv_unified=False,
            n_batch=self.value("batch_size", PYTHON),
            flash_attn="off" if self.flash_attn == "off" else "on",
            swa_full=True,
            n_gpu_layers=ALL_LAYERS if ngl < 0 else ngl,
            n_gpu_layers_draft=ALL_LAYERS if ngld < 0 else ngld,
        )


def serving_config(profile: Profile, with_draft: bool, target: ModelFile | None = None) -> ServingConfig:
    """``profile``'s options (overrides applied) parsed: ``[server]``, and ``[draft]`` when
    ``with_draft``; ``target``, the served target's header where read (the shared cache's rule weighs it). A knob given twice (``ctx-size`` and ``c``): the last, as llama-server takes it."""
    where = f"profile {profile.path or profile.name}"
    values: dict[str, Value] = {}
    order: list[str] = []
    passthrough: list[tuple[str, Value]] = []
    for table in (profile.server_table, profile.draft_table) if with_draft else (profile.server_table,):
        for key, raw in table.items():
            k = BY_KEY.get(key)
            if raw is False and not (k and k.negative):
                continue  # false leaves the option out: the engine's default
            if k is None:
                passthrough.append((key, raw))
                continue
            values[k.name] = k.parse(key, raw, where)
            order = [n for n in order if n != k.name] + [k.name]
    return ServingConfig(
        profile.name, profile.build, with_draft, Options(**values), tuple(order), tuple(passthrough), target  # type: ignore[arg-type]
    )


__all__ = ["SHARED_CACHE_MAX_SHARE", "SHARED_CACHE_SLOTS", "ServingConfig", "serving_config"]
