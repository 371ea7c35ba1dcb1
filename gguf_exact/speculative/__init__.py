"""In-process draft-mtp on the llama-cpp-python bindings.

``bindings`` (the llama.cpp call sequence and shared helpers), ``target`` and ``drafter``
(the two llama.cpp sides), ``loop`` (the speculative loop, pure Python), ``runner``
(the public API), ``bench`` and ``bench_plot``, ``prompt_set`` (``prompts/``).
"""
