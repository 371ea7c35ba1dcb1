"""Drafter commands: ``inspect``, ``convert``, ``verify``, ``compare``."""
