"""In-process draft-mtp on llama-cpp-python.

``engine`` (the one engine: ``Llama`` with the MTP drafter as its draft model,
``load_with_drafter``), ``bindings`` and ``drafter`` (the drafter's llama.cpp side),
``tokenizer`` (cached token pieces), ``generation`` (the counters every engine
reports), ``runner`` (token-level runs for ``generate``, ``bench``, the demo and the
tests), ``chat`` (``gguf-exact chat``), ``bench``, ``bench_engines`` and ``bench_plot``,
``prompt_set`` (``prompts/``).
"""
