"""Drafter commands: ``inspect``, ``convert``, ``verify``."""
