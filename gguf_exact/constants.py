"""Every environment variable gguf-exact reads, in one place (as huggingface_hub's ``constants.py``).

Each is read when asked for, not at import: a test or a caller may set one after the
package is loaded. Nothing else in the package reads ``os.environ`` for a ``GGUF_EXACT_*``
name; other modules call the functions here.

| variable | what it sets |
|---|---|
| ``GGUF_EXACT_CACHE`` | the build cache (default ``$XDG_CACHE_HOME/gguf-exact``, else ``~/.cache/gguf-exact``) |
| ``GGUF_EXACT_RUN_DIR`` | the root of the servers' run folders (default ``<cache>/run``) |
| ``GGUF_EXACT_LLAMA_SERVER`` | a llama-server executable to serve with instead of the cached build |
| ``GGUF_EXACT_LLAMA_PERPLEXITY`` | a llama-perplexity executable for ``quality`` instead of the cached build's |
| ``GGUF_EXACT_API_KEY`` | the API key of ``serve`` and ``status`` (kept out of command lines and run folders) |
| ``GGUF_EXACT_CPU_FEATURES`` | the CPU features builds compile for (``native`` or a comma list) |
| ``GGUF_EXACT_KERNELS`` | ``jit``: the packer's numba JIT kernels even where the ahead-of-time build is cached (default ``auto``) |
| ``GGUF_EXACT_PROFILES`` | a serving-profile folder searched first (where ``tune`` writes) |
| ``GGUF_EXACT_RECIPES`` | a recipes folder searched first |
| ``GGUF_EXACT_CHECKSUMS`` | the user's checksums folder (where ``pin`` writes for an installed package) |
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GGUF_EXACT_CACHE"
RUN_DIR_ENV = "GGUF_EXACT_RUN_DIR"
LLAMA_SERVER_ENV = "GGUF_EXACT_LLAMA_SERVER"
LLAMA_PERPLEXITY_ENV = "GGUF_EXACT_LLAMA_PERPLEXITY"
API_KEY_ENV = "GGUF_EXACT_API_KEY"
CPU_FEATURES_ENV = "GGUF_EXACT_CPU_FEATURES"
KERNELS_ENV = "GGUF_EXACT_KERNELS"
PROFILES_ENV = "GGUF_EXACT_PROFILES"
RECIPES_ENV = "GGUF_EXACT_RECIPES"
CHECKSUMS_ENV = "GGUF_EXACT_CHECKSUMS"
LLAMA_SERVER_KEY_ENV = "LLAMA_API_KEY"  # llama-server reads its --api-key from this one (set, never read, here)
VULKAN_VISIBLE_ENV = "GGML_VK_VISIBLE_DEVICES"  # llama.cpp's Vulkan devices by index (set, never read, here)


def env_text(name: str) -> str | None:
    """The variable's value, None when unset or empty."""
    return os.environ.get(name) or None


def env_path(name: str) -> Path | None:
    """The variable as a path (``~`` expanded), None when unset or empty."""
    value = env_text(name)
    return Path(value).expanduser() if value else None


def cache_root() -> Path:
    """``$GGUF_EXACT_CACHE``, else ``$XDG_CACHE_HOME/gguf-exact``, else ``~/.cache/gguf-exact``."""
    chosen = env_path(CACHE_ENV)
    if chosen is not None:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gguf-exact"


def run_root() -> Path:
    """``$GGUF_EXACT_RUN_DIR``, else ``<cache>/run``: where each server's run folder lies."""
    return env_path(RUN_DIR_ENV) or cache_root() / "run"


def user_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/gguf-exact``, else ``~/.config/gguf-exact``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "gguf-exact"


def api_key() -> str | None:
    """``$GGUF_EXACT_API_KEY`` (None when unset or empty)."""
    return env_text(API_KEY_ENV)


def llama_server_bin() -> str | None:
    """``$GGUF_EXACT_LLAMA_SERVER`` (None when unset or empty)."""
    return env_text(LLAMA_SERVER_ENV)


def llama_perplexity_bin() -> Path | None:
    """``$GGUF_EXACT_LLAMA_PERPLEXITY`` as a path (``~`` expanded; None when unset or empty)."""
    return env_path(LLAMA_PERPLEXITY_ENV)


def cpu_features() -> str | None:
    """``$GGUF_EXACT_CPU_FEATURES`` as written (None when unset or empty)."""
    return env_text(CPU_FEATURES_ENV)


def kernels_choice() -> str:
    """``$GGUF_EXACT_KERNELS``: ``auto`` (default: the ahead-of-time kernels where cached) or ``jit``."""
    return (env_text(KERNELS_ENV) or "auto").strip().lower()


__all__ = [
    "API_KEY_ENV",
    "CACHE_ENV",
    "CHECKSUMS_ENV",
    "CPU_FEATURES_ENV",
    "KERNELS_ENV",
    "LLAMA_PERPLEXITY_ENV",
    "LLAMA_SERVER_ENV",
    "LLAMA_SERVER_KEY_ENV",
    "PROFILES_ENV",
    "RECIPES_ENV",
    "RUN_DIR_ENV",
    "VULKAN_VISIBLE_ENV",
    "api_key",
    "cache_root",
    "cpu_features",
    "env_path",
    "env_text",
    "kernels_choice",
    "llama_perplexity_bin",
    "llama_server_bin",
    "run_root",
    "user_config_dir",
]
