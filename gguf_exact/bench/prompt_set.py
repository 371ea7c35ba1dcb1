"""The shipped prompt set (``gguf_exact/bench/prompts/*.txt``): code, prose, repetitive
and structured text, for the lossless tests, ``gguf-exact bench`` and the demo.

A prompt is its file's text without the one final newline.
"""

from __future__ import annotations

from importlib import resources

from gguf_exact.errors import ArgumentError


def prompt_names() -> list[str]:
    """Names of the shipped prompts, sorted (``code``, ``prose``, ...)."""
    folder = resources.files(__package__) / "prompts"
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".txt"))


def load_prompts(names: list[str] | None = None) -> dict[str, str]:
    """``{name: text}`` for ``names`` (default: all), in the order given."""
    available = prompt_names()
    names = available if names is None else names
    folder = resources.files(__package__) / "prompts"
    out = {}
    for name in names:
        if name not in available:
            raise ArgumentError(f"no shipped prompt named {name!r}; available: {', '.join(available)}")
        text = (folder / f"{name}.txt").read_text(encoding="utf-8")
        out[name] = text.removesuffix("\n")
    return out


__all__ = ["load_prompts", "prompt_names"]
