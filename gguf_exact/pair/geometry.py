"""A Gemma 4 text stack's shape from its GGUF header (:class:`Geometry`: layers, heads,
KV widths, sliding pattern, as llama.cpp sizes its cache and graph), and which Gemma 4
size a target is (:func:`identify_size`).

Model facts below both engines: the pair check (:mod:`.checks`) compares the drafter's
KV widths with its target's, the memory plan sizes caches, the drafter lookup picks
recipes by size.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf_exact.errors import InputError
from gguf_exact.gemma4.assistant import ARCH as DRAFTER_ARCH
from gguf_exact.gemma4.hparams import TextHparams
from gguf_exact.gemma4.sizes import SIZES


@dataclass(frozen=True)
class Geometry:
    """A Gemma 4 text stack as llama.cpp sizes its cache and graph (per layer where it varies)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k_full: int
    head_v_full: int
    head_k_swa: int
    head_v_swa: int
    swa: tuple[bool, ...]
    n_swa: int
    n_kv_shared: int
    n_ff: tuple[int, ...]
    n_embd_per_layer: int
    n_vocab: int
    n_ctx_train: int
    n_head_candidates: int = 0  # tokens a drafter's ordered head scores per step (0: a full head)

    @classmethod
    def from_gguf(cls, gguf) -> Geometry:
        """From an open :class:`~gguf_exact.formats.gguf_reader.GgufFile` (gemma4 or gemma4-assistant)."""
        arch = gguf.architecture
        where = f"{gguf.path}"

        def num(key: str, default: int | None = None) -> int:
            v = gguf.numbers(f"{arch}.{key}")
            if v is None:
                if default is None:
                    raise InputError(f"{where}: no {arch}.{key}; cannot plan memory for it")
                return default
            return int(v[0])

        n_layer = num("block_count")

        def per_layer(key: str, default: int | None = None) -> tuple[int, ...]:
            v = gguf.numbers(f"{arch}.{key}")
            if v is None:
                return (num(key, default),) * n_layer
            if len(v) == 1:
                return (int(v[0]),) * n_layer
            if len(v) != n_layer:
                raise InputError(f"{where}: {arch}.{key} has {len(v)} entries for {n_layer} layers")
            return tuple(int(x) for x in v)

        swa = gguf.numbers(f"{arch}.attention.sliding_window_pattern")
        if swa is None or len(swa) != n_layer:
            raise InputError(f"{where}: {arch}.attention.sliding_window_pattern must have one entry per layer")
        n_embd = num("embedding_length")
        n_head = per_layer("attention.head_count")
        head_k = num("attention.key_length", n_embd // n_head[0])
        head_v = num("attention.value_length", head_k)
        return cls(
            arch=arch,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=per_layer("attention.head_count_kv", n_head[0]),
            head_k_full=head_k,
            head_v_full=head_v,
            head_k_swa=num("attention.key_length_swa", head_k),
            head_v_swa=num("attention.value_length_swa", head_v),
            swa=tuple(bool(s) for s in swa),
            n_swa=num("attention.sliding_window", 0),
            n_kv_shared=num("attention.shared_kv_layers", 0),
            n_ff=per_layer("feed_forward_length", 0),
            n_embd_per_layer=num("embedding_length_per_layer_input", 0),
            n_vocab=gguf.array_length("tokenizer.ggml.tokens") or 0,
            n_ctx_train=num("context_length", 0),
            n_head_candidates=head_candidates(gguf),
        )

    @property
    def ordered_head(self) -> bool:
        return self.n_head_candidates > 0

    def has_own_kv(self, il: int) -> bool:
        """Whether layer ``il`` allocates cache rows (``llama_hparams::has_kv``; a
        drafter's layers all read its target's cache)."""
        return self.arch != DRAFTER_ARCH and il < self.n_layer - self.n_kv_shared

    def k_width(self, il: int) -> int:
        return self.n_head_kv[il] * (self.head_k_swa if self.swa[il] else self.head_k_full)

    def v_width(self, il: int) -> int:
        return self.n_head_kv[il] * (self.head_v_swa if self.swa[il] else self.head_v_full)


def head_candidates(gguf) -> int:
    """Tokens per step the ordered-embedding head of a drafter scores (patch #24): the top-k
    clusters of ``vocab / num_centroids`` tokens; 0 when the file has no such head."""
    arch = gguf.architecture
    n_c, k = gguf.numbers(f"{arch}.num_centroids"), gguf.numbers(f"{arch}.centroid_intermediate_top_k")
    n_vocab = gguf.array_length("tokenizer.ggml.tokens") or 0
    has = any(t.name == "masked_embd_centroids.weight" for t in gguf.tensors)
    if not has or n_c is None or int(n_c[0]) <= 0:
        return 0
    return n_vocab // int(n_c[0]) * (int(k[0]) if k is not None else 32)


@dataclass(frozen=True)
class SizeMatch:
    """Which Gemma 4 size a target is, if any."""

    name: str | None
    summary: str  # "35 layers, width 1536"
    differences: tuple[str, ...] = ()  # widths that differ from the real size's

    @property
    def exact(self) -> bool:
        return self.name is not None and not self.differences

    @property
    def label(self) -> str:
        if self.name is None:
            return f"no Gemma 4 size ({self.summary})"
        if self.exact:
            return f"Gemma 4 {self.name}"
        more = f"; {len(self.differences) - 1} more widths differ" if len(self.differences) > 1 else ""
        return f"Gemma 4 {self.name} in structure at other widths: {self.differences[0]}{more}"


def _expected(size_name: str) -> TextHparams:
    return TextHparams.from_hf(SIZES[size_name].target.text_config())


def identify_size(geom: Geometry) -> SizeMatch:
    """The size whose structure ``geom`` (a gemma4 target's) has; see the module doc."""
    summary = f"{geom.n_layer} layers, width {geom.n_embd}"
    for name in SIZES:
        hp = _expected(name)
        structure = (
            geom.n_layer == hp.n_layer
            and geom.swa == hp.swa_layers
            and geom.n_kv_shared == hp.n_kv_shared
            and geom.n_head == (hp.n_head,) * hp.n_layer
            and geom.n_head_kv == hp.n_head_kv
        )
        if not structure:
            continue
        widths = (
            ("embedding_length", geom.n_embd, hp.n_embd),
            ("key_length", geom.head_k_full, hp.head_dim_full),
            ("key_length_swa", geom.head_k_swa, hp.head_dim_swa),
            ("feed_forward_length", geom.n_ff[0], hp.n_ff[0]),
            ("vocabulary", geom.n_vocab, SIZES[name].target.vocab_size),
        )
        return SizeMatch(name, summary, tuple(f"{k} {got}, not {want}" for k, got, want in widths if got != want))
    return SizeMatch(None, summary)


__all__ = ["Geometry", "SizeMatch", "identify_size"]
