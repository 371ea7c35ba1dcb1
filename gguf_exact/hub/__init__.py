"""Pinned files from Hugging Face: recipes (``convert/``), checksums (``checksums/``),
``fetch``, ``pin`` and ``build`` (rebuild a published drafter and compare hashes)."""
