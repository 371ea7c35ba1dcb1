"""A target and its drafter from their GGUF headers: ``checks`` (``ModelFile``,
``read_model``, ``check_pair``, ``kv_mismatch``) and ``geometry`` (the text stack's
shape, which Gemma 4 size a file is); below both engines, above the hub's pins."""
