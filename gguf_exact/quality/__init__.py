"""``quality``: what exactness buys, in the model's terms.

A main model's files against their bf16 reference (the same header over the source's own
bytes, :func:`gguf_exact.stream.jobs.reference_jobs`), through llama.cpp's
``llama-perplexity --kl-divergence`` (:mod:`.perplexity`, :mod:`.measure`); drafters by
their acceptance against one target on the same prompts through llama-server
(:mod:`.drafters`). :mod:`.report` holds the rows, the table and the plot.
"""
