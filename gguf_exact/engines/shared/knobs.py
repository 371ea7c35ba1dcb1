"""The knobs of a served model, each declared once: llama-server's option and its aliases (the
profile key too), the value's kind and bounds, the defaults, the engines that apply it, its table
and its help text. :class:`Options` is the table; :mod:`.serving_config` parses a profile with it
and renders it for each engine; the profile loader refuses a bad value with it
(:func:`~.profiles.load_profile`), and ``serve``'s own options are generated from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gguf_exact.errors import InputError, Param

Value = str | int | float | bool  # a profile value, as TOML types it
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # common/arg.cpp

LLAMA_SERVER, PYTHON = "llama-server", "python"
BOTH = frozenset({LLAMA_SERVER, PYTHON})
AUTO_LAYERS, ALL_LAYERS = -1, -2  # llama.cpp: -1 as many as fit ("auto"), <= -2 every layer ("all")
SWITCH = {"on": "on", "enabled": "on", "1": "on", "off": "off", "disabled": "off", "0": "off", "auto": "auto"}


@dataclass(frozen=True)
class Knob:
    """One option of a served model. ``default``: what llama-server does without it (None: it
    decides, e.g. from the model); ``python``: the Python engine's default where it differs;
    ``engines``: the engines that apply it (an engine names the others it is given as not
    applied, unless ``silent``: an option with nothing to do there, e.g. in one in-process
    engine serving one request at a time); ``draft``: a ``[draft]`` option, applied only with a drafter."""

    name: str
    flag: str
    aliases: tuple[str, ...]
    kind: str  # int, float, bool, str, layers (a count, auto or all), switch (on, off, auto), choice
    help: str
    default: Value | None = None
    python: Value | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    engines: frozenset[str] = BOTH
    silent: bool = False
    draft: bool = False
    cli: bool = False  # an option of `serve` too (--ctx-size 8192), given as an override
    negative: str = ""  # llama-server's option that turns it off: then ``false`` is a value, not "left out"

    @property
    def help_text(self) -> str:
        """The help of its `serve` option: the text, and the default where llama-server has one."""
        if self.default is None or isinstance(self.default, bool):
            return f"{self.help} [profile key {self.flag}]"
        shown: Value = self.default
        if self.kind == "layers" and isinstance(shown, int) and shown < 0:
            shown = "auto" if shown == AUTO_LAYERS else "all"
        return f"{self.help} [profile key {self.flag}; llama-server's default: {shown}]"

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)

    def default_for(self, engine: str) -> Value | None:
        return self.python if engine == PYTHON and self.python is not None else self.default

    def parse(self, key: str, value: Value, where: str | Param) -> Value:
        """``value`` as this knob's kind, within its bounds; one line naming ``where`` and ``key`` when not."""

        def bad(expected: str) -> InputError:
            return InputError(where, f": {key} = {value!r}: expected {expected}")

        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad("true or false")
            return value
        if self.kind == "layers":
            text = str(value).lower()
            if text in ("auto", "all"):
                return AUTO_LAYERS if text == "auto" else ALL_LAYERS
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad("a number of layers, auto or all")
            return value
        if self.kind == "switch":
            text = "on" if value is True else str(value).lower()
            if text not in SWITCH:
                raise bad("on, off or auto")
            return SWITCH[text]
        if self.kind in ("int", "float"):
            ok = isinstance(value, int) or (self.kind == "float" and isinstance(value, float))
            if isinstance(value, bool) or not ok:
                raise bad("a whole number" if self.kind == "int" else "a number")
            low = -float("inf") if self.minimum is None else self.minimum
            high = float("inf") if self.maximum is None else self.maximum
            if not low <= value <= high:  # type: ignore[operator]  # an int or float here
                span = f"at least {self.minimum:g}" if self.maximum is None else f"{self.minimum:g} to {self.maximum:g}"
                raise bad(f"a number {span}")
            return float(value) if self.kind == "float" else value
        if self.kind == "choice" and str(value) not in self.choices:
            raise bad(f"one of {', '.join(self.choices)}")
        return str(value)

    def render(self, value: Value) -> list[str]:
        """llama-server's arguments for ``value`` (a bool knob is a bare flag)."""
        if value is True:
            return [f"--{self.flag}"]
        if value is False:
            return [f"--{self.negative}"] if self.negative else []
        if self.kind == "layers" and isinstance(value, int) and value < 0:
            return [f"--{self.flag}", "auto" if value == AUTO_LAYERS else "all"]
        return [f"--{self.flag}", f"{value:g}" if isinstance(value, float) else str(value)]


def knob(flag: str, *aliases: str, kind: str, help: str, **declared: Any) -> Any:
    """A field of :class:`Options` (None: not given) carrying its :class:`Knob`."""
    return field(default=None, metadata={"knob": dict(flag=flag, aliases=aliases, kind=kind, help=help, **declared)})


ONLY_SERVER = frozenset({LLAMA_SERVER})


@dataclass(frozen=True)
class Options:
    """A profile's options, typed; None where it does not give one. The table of every knob."""

    ctx_size: int | None = knob("ctx-size", "c", cli=True, kind="int", minimum=0, default=0, python=4096,
                                help="Context tokens (0: the model's own; the Python engine: 4096)")  # fmt: skip
    parallel: int | None = knob("parallel", "np", cli=True, kind="int", minimum=-1, default=-1, silent=True,
                                help="Server slots (-1: auto, 4 sharing one cache); the Python engine serves one request at a time")  # fmt: skip
    # not given: on where a drafter serves 3 slots or more and the cache is small beside the target's weights
    # (serving_config.ServingConfig.kv_unified says why)
    kv_unified: bool | None = knob("kv-unified", "kvu", kind="bool", negative="no-kv-unified", engines=ONLY_SERVER,
                                   help="One KV cache shared by every slot (default: on where a drafter serves 3 slots or more "
                                        "and the cache is at most a tenth of the target's weights)")  # fmt: skip
    kv_unified_per_slot: int | None = knob("kv-unified-per-slot", kind="int", minimum=0, engines=ONLY_SERVER,
                                           help="A slot's most context in a shared cache (0: all of it; "
                                                "default: ctx-size / parallel)")  # fmt: skip
    batch_size: int | None = knob("batch-size", "b", kind="int", minimum=1, default=2048, python=512,
                                  help="Logical batch (prompt tokens per decode call)")  # fmt: skip
    ubatch_size: int | None = knob("ubatch-size", "ub", kind="int", minimum=1, default=512,
                                   help="Physical batch (tokens per compute graph)")  # fmt: skip
    cache_type_k: str | None = knob("cache-type-k", "ctk", kind="choice", choices=KV_CACHE_TYPES, default="f16",
                                    engines=ONLY_SERVER, help="The KV cache's K type")  # fmt: skip
    cache_type_v: str | None = knob("cache-type-v", "ctv", kind="choice", choices=KV_CACHE_TYPES, default="f16",
                                    engines=ONLY_SERVER, help="The KV cache's V type")  # fmt: skip
    flash_attn: str | None = knob("flash-attn", "fa", cli=True, kind="switch", default="auto",
                                  help="Flash attention: on, off or auto (on where the backend has it)")  # fmt: skip
    swa_full: bool | None = knob("swa-full", kind="bool", default=False, engines=ONLY_SERVER,
                                 help="A full-size sliding-window cache (the Python engine always keeps one)")  # fmt: skip
    n_gpu_layers: int | None = knob("n-gpu-layers", "ngl", "gpu-layers", cli=True, kind="layers", default=AUTO_LAYERS,
                                    python=0, help="Target layers on the GPU: a number, auto or all")  # fmt: skip
    n_gpu_layers_draft: int | None = knob("n-gpu-layers-draft", "ngld", "gpu-layers-draft", kind="layers",
                                          default=AUTO_LAYERS, draft=True,
                                          help="Drafter layers on the GPU (the Python engine: as the target)")  # fmt: skip
    no_kv_offload: bool | None = knob("no-kv-offload", "nkvo", kind="bool", default=False, engines=ONLY_SERVER,
                                      help="Keep the KV cache in RAM")  # fmt: skip
    threads: int | None = knob("threads", "t", cli=True, kind="int", minimum=1,
                               help="CPU threads for generation (default: llama.cpp's, the physical cores)")  # fmt: skip
    threads_batch: int | None = knob("threads-batch", "tb", kind="int", minimum=1,
                                     help="CPU threads for prompts (default: as threads)")  # fmt: skip
    rpc: str | None = knob("rpc", kind="str", engines=ONLY_SERVER, help="RPC workers, HOST:PORT[,HOST:PORT...]")
    tensor_split: str | None = knob("tensor-split", "ts", kind="str", engines=ONLY_SERVER,
                                    help="How the layers split over the devices, e.g. 3,1")  # fmt: skip
    # silent: llama-server always returns logprobs on request, nothing to name there
    logprobs: bool | None = knob("logprobs", kind="bool", default=False, engines=frozenset({PYTHON}), silent=True,
                                 help="The Python engine keeps every row's logits (requests may ask for logprobs)")  # fmt: skip
    spec_type: str | None = knob("spec-type", kind="str", draft=True,
                                 help="The speculative decoder; draft-mtp runs the gemma4-assistant drafter")  # fmt: skip
    n_max: int | None = knob("spec-draft-n-max", "draft-max", cli=True, kind="int", minimum=0, default=3, draft=True,
                             help="Most tokens drafted per pass (the bound of the adaptive length)")  # fmt: skip
    n_min: int | None = knob("spec-draft-n-min", "draft-min", kind="int", minimum=0, default=0, draft=True,
                             engines=ONLY_SERVER, help="Fewest tokens drafted per pass")  # fmt: skip
    p_min: float | None = knob("spec-draft-p-min", "draft-p-min", cli=True, kind="float", minimum=0, maximum=1, default=0.0,
                               draft=True, help="A draft stops below this drafter confidence")  # fmt: skip
    adaptive: bool | None = knob("spec-draft-adaptive", cli=True, kind="bool", default=False, draft=True,
                                 help="The draft length chosen before each pass from measured costs and acceptance")  # fmt: skip
    adaptive_warmup: bool | None = knob("spec-draft-adaptive-warmup", kind="bool", default=False, draft=True,
                                        help="The adaptive length's pass costs timed at start-up")  # fmt: skip
    # llama-server's option comes with patch 39u (0022-39u-shadow-probes.patch)
    shadow: bool | None = knob("spec-draft-shadow", kind="bool", default=False, draft=True,
                               help="Where the adaptive length drafts nothing, its probes are drafted and not verified: "
                                    "compared with the target's next tokens (drafter steps only)")  # fmt: skip
    # llama-server's option comes with patch 38 (0013-38-rejection-sampling.patch)
    rejection_sampling: bool | None = knob("spec-rejection-sampling", kind="bool", default=False, draft=True,
                                           help="Sampled requests keep a draft with probability min(1, p/q) "
                                                "(speculative sampling) instead of on exact match")  # fmt: skip
    draft_device: str | None = knob("spec-draft-device", "devd", kind="str", draft=True, engines=ONLY_SERVER,
                                    help="The device the drafter runs on (RPC0, CUDA0, ...)")  # fmt: skip
    draft_threads: int | None = knob("spec-draft-threads", kind="int", minimum=1, draft=True, silent=True,
                                     engines=ONLY_SERVER, help="CPU threads of the drafter")  # fmt: skip
    # llama-server switches with nothing to do in the in-process engine
    no_warmup: bool | None = knob("no-warmup", kind="bool", silent=True, engines=ONLY_SERVER,
                                    help="Skip llama-server's warm-up decode")  # fmt: skip
    cont_batching: bool | None = knob("cont-batching", "cb", kind="bool", silent=True, engines=ONLY_SERVER,
                                      help="Continuous batching (llama-server's default)")  # fmt: skip
    jinja: bool | None = knob("jinja", kind="bool", silent=True, engines=ONLY_SERVER,
                              help="llama-server's Jinja chat templates")  # fmt: skip


KNOBS: tuple[Knob, ...] = tuple(Knob(name=f.name, **f.metadata["knob"]) for f in fields(Options))
BY_KEY: dict[str, Knob] = {key: k for k in KNOBS for key in k.keys}
KNOB: dict[str, Knob] = {k.name: k for k in KNOBS}

__all__ = ["BY_KEY", "KNOB", "KNOBS", "KV_CACHE_TYPES", "Knob", "Options", "Value"]
