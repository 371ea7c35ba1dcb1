"""Reading and writing files: Hugging Face folders, safetensors, GGUF.

- ``checkpoint``, ``safetensors_stream``: HF folders and row-slice reads
- ``vocab``: a target GGUF's tokenizer keys
- ``gguf_file``: whole-file GGUF writes (temp file, verify, rename) and tensor decoding
- ``gguf_layout``, ``gguf_stream``: GGUF headers parsed by hand and tensors streamed in chunks
"""
