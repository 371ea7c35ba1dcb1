"""The sampling defaults both serving engines use: llama-server's own.

llama.cpp 0c1e57098 (``common/common.h``, ``common_params_sampling``) samples a request
that names no setting at temperature 0.8 with top-k 40, top-p 0.95 and min-p 0.05, and
no repeat penalty (1.0); a completion without ``max_tokens`` runs until an
end-of-generation token or the end of the context. llama-cpp-python's server would
answer the same request with ``repeat_penalty`` 1.1, and ``/v1/completions`` with 16
tokens: ``serve --engine python`` fills in these values instead
(:mod:`gguf_exact.engines.python.openai_server`), so a client gets the same defaults from
either engine. ``gguf-exact generate`` and ``chat`` use the same top-k, top-p, min-p
and repeat penalty, but are greedy (temperature 0) unless ``--temperature`` says
otherwise.
"""

SERVER_SAMPLING: dict[str, float | int] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_penalty": 1.0,
}

__all__ = ["SERVER_SAMPLING"]
