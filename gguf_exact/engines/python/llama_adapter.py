"""The one module that touches llama-cpp-python's private attributes; written against llama-cpp-python 0.3.36.

:class:`~.engine.MtpLlama` changes what ``Llama`` does per batch (logits on every row only
for verification passes, the hidden-state row kept) and so needs ``Llama``'s internals:
its context, batch and model wrappers (``_ctx``, ``_batch``, ``_model``), sizes
(``_n_ctx``, ``_n_vocab``), its exit stack (``_stack``), ``_requires_eval`` and the
``_input_ids`` its sampler reads; the server needs ``llama_cpp.server.app``'s module
global ``_llama_proxy`` (its routes read the model from it). Those names are not
llama-cpp-python's API and may change in any release: :class:`LlamaAdapter` gives each a
public name here, and nothing else in gguf-exact spells them (``tests/test_layers.py``
checks). :data:`WRITTEN_FOR` is the version this was read against;
:func:`check_version` says when the installed one differs (``tests/test_adapter.py``
fails then, which is the moment to read upstream's ``llama.py`` again).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from importlib import metadata
from typing import Any, Callable, Sequence

import llama_cpp
import numpy as np

from gguf_exact.errors import BuildError

WRITTEN_FOR = "0.3.36"
# The private names used below, for the test that checks upstream still has them.
PRIVATE_ATTRIBUTES = ("_ctx", "_batch", "_model", "_n_ctx", "_n_vocab", "_stack", "_requires_eval", "_input_ids")


def greedy_token(row: np.ndarray) -> int | None:
    """The token llama.cpp's greedy sampler picks from ``row`` (the first of equal maxima), or None
    where the row holds a NaN (``argmax`` stops at the first, the sampler's scan passes them by).

    Why not the sampler: ``llama_sampler_sample`` first copies all 262,144 logits into its
    candidate array, 0.6-0.8 ms a row on a 2-core Zen 3 (1% of an E2B token there, more for
    the rows of a verification pass), where ``argmax`` over the row llama.cpp holds takes 0.02 ms."""
    best = int(np.argmax(row))
    return None if np.isnan(row[best]) else best


def installed_version() -> str:
    return metadata.version("llama_cpp_python")


def check_version(installed: str | None = None) -> None:
    """Raise unless llama-cpp-python is the version this adapter was written against."""
    installed = installed or installed_version()
    if installed != WRITTEN_FOR:
        raise BuildError(
            f"llama-cpp-python {installed} is installed; gguf_exact/engines/python/llama_adapter.py was written against "
            f"{WRITTEN_FOR}: install {WRITTEN_FOR} (`gguf-exact build-bindings --install`) or check the adapter against the new llama.py"
        )


class LlamaAdapter(llama_cpp.Llama):
    """``llama_cpp.Llama`` with public names for the internals :class:`~.engine.MtpLlama` uses."""

    _n_ctx: int  # upstream's sizes, typed here (mypy does not read llama_cpp: see pyproject.toml)
    _n_vocab: int
    greedy_alone = False  # set per generate call by the engine (.rejection.greedy_alone): rows take greedy_token

    # --- sizes and the model ---

    @property
    def context_size(self) -> int:
        """Tokens the context holds (``n_ctx()``, without a call)."""
        return self._n_ctx

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def vocab_handle(self) -> Any:
        """The ``llama_vocab *`` of the model (low-level calls)."""
        return self._model.vocab

    def bound_context_to_token_buffer(self) -> None:
        """llama.cpp pads a small context up (64 -> 256), but llama-cpp-python sizes its token
        buffer as asked: the smaller is what a request may fill, and what its checks name."""
        self._n_ctx = min(self._n_ctx, len(self.input_ids))

    def grammar_parses(self, grammar: str, root: str = "root") -> bool:
        """Whether llama.cpp's GBNF parser takes ``grammar`` (parsed by llama.cpp itself; the
        sampler it makes is freed at once)."""
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab_handle, grammar.encode(), root.encode())
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    def _init_sampler(self, *args: Any, grammar: Any = None, **kwargs: Any) -> Any:
        """``Llama._init_sampler``, but a grammar llama.cpp refuses is a ValueError: 0.3.36 adds
        whatever ``llama_sampler_init_grammar`` returns to the chain, NULL too, and the process
        then dies (SIGSEGV) on the first token. The request's own ``grammar`` is refused with a
        400 before this (:mod:`.request`); this catches the grammars llama-cpp-python makes from
        a ``response_format`` schema or tools."""
        if grammar is not None and not self.grammar_parses(grammar._grammar, grammar._root):
            raise ValueError("the grammar made for this request does not parse as GBNF (llama.cpp's parser refused it)")
        return super()._init_sampler(*args, grammar=grammar, **kwargs)

    def token_text(self, token: int) -> str:
        return self._model.token_get_text(token)

    def adds_bos(self) -> bool:
        return bool(self._model.add_bos_token())

    # --- lifetime: everything freed when the Llama closes ---

    @property
    def is_open(self) -> bool:
        """False when the constructor stopped before ``Llama``'s (nothing to free)."""
        return hasattr(self, "_stack")

    def on_close(self, callback: Callable[[], None]) -> None:
        self._stack.callback(callback)

    def close_with(self, manager: AbstractContextManager | Any) -> None:
        """Exit ``manager`` (an ExitStack, a context manager) when the Llama closes, after what it holds now."""
        self._stack.push(manager)

    @property
    def resources(self) -> Any:
        """The Llama's own exit stack, for objects (a drafter) freed before it."""
        return self._stack

    # --- decoding ---

    def drop_cache_from(self, position: int) -> None:
        """Remove every cached position from ``position`` on (every sequence)."""
        self._ctx.kv_cache_seq_rm(-1, position, -1)

    def decode_batch(self, tokens: Sequence[int], n_past: int, logits_all: bool) -> None:
        """Decode ``tokens`` at ``n_past`` with the Llama's own batch; logits on every row or the last."""
        self._batch.set_batch(batch=tokens, n_past=n_past, logits_all=logits_all)
        self._ctx.decode(self._batch)

    def batch_logits(self, n_rows: int) -> np.ndarray:
        """The last decode's logits, ``n_rows`` rows, flat (a view on llama.cpp's buffer)."""
        return np.ctypeslib.as_array(self._ctx.get_logits(), shape=(n_rows * self._n_vocab,))

    def row_logits(self, idx: int) -> np.ndarray:
        """The logits of position ``idx``'s row of the last decode (a view on llama.cpp's buffer)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, idx - self.n_tokens)  # negative: from the batch's end
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))

    def sample(self, *args: Any, idx: int | None = None, **kwargs: Any) -> int:
        """``Llama.sample``, but where :attr:`greedy_alone` (the running call's chain is llama.cpp's
        greedy sampler and nothing that changes the row) the row's :func:`greedy_token`."""
        if self.greedy_alone and idx is not None and (token := greedy_token(self.row_logits(idx))) is not None:
            return token
        return super().sample(*args, idx=idx, **kwargs)

    def mark_evaluated(self) -> None:
        self._requires_eval = False

    def visible_input_ids(self) -> np.ndarray:
        """The tokens the sampler's logits processors see (upstream: every decoded one)."""
        return self.input_ids[: self.n_tokens]

    @property
    def _input_ids(self) -> np.ndarray:  # what upstream's sampler reads
        return self.visible_input_ids()


def serve_one_model(proxy: Any) -> None:
    """Make ``llama_cpp.server.app``'s routes answer with ``proxy`` (they read the module global)."""
    from llama_cpp.server import app as upstream

    upstream._llama_proxy = proxy


__all__ = [
    "PRIVATE_ATTRIBUTES",
    "WRITTEN_FOR",
    "LlamaAdapter",
    "check_version",
    "installed_version",
    "serve_one_model",
]
