"""``repack``: exact Q4_0 re-pack of a main model from a donor GGUF, streamed in row chunks.

``pipeline`` runs it; ``tensor_map`` decides per donor tensor; ``donor`` and
``source_rows`` read; ``core.exact.plan_rows`` plans each chunk, ``chunk_pool`` spreads them over
two cores; ``verify`` and ``report`` check and describe the result; ``check`` is the
``verify`` command for a main-model GGUF.
"""
