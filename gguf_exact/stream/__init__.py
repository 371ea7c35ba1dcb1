"""Streaming GGUF writes shared by ``convert`` and ``repack``.

``jobs`` says how each output tensor is made (exact Q4_0 from the source, encoded,
copied from a donor, or bytes made here); ``source_rows`` reads safetensors rows with
``pread``; ``writer`` carries the jobs out in row chunks on both cores (``chunk_pool``);
``readback`` reads the written file back before it is renamed into place.
"""
