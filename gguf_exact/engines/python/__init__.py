"""The Python engine: in-process draft-mtp on llama-cpp-python.

``engine`` (``Llama`` with the MTP drafter as its draft model, ``load_with_drafter``),
``bindings`` and ``drafter`` (the drafter's llama.cpp side), ``tokenizer`` (cached token
pieces), ``runner`` (token-level runs for ``generate``, ``bench``, the demo and the
tests), ``chat`` (``gguf-exact chat``), ``openai_server`` (``serve --engine python``).
"""
