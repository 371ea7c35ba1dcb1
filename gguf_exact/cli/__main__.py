"""``python -m gguf_exact.cli``: the same as the ``gguf-exact`` command."""

from gguf_exact.cli import main

main()
