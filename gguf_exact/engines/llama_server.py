"""The llama-server engine: llama.cpp's own server with ``--spec-type draft-mtp``.

:func:`command` turns resolved :class:`~.settings.ServeSettings` into llama-server's
command line: the executable (``server_bin``, ``$GGUF_EXACT_LLAMA_SERVER`` or the cached
build the profile names, :mod:`gguf_exact.builds.llama_build`), the pair, ``--metrics``
and ``--log-file``, the profile's arguments and the caller's extra ones. The API key is
not on it: :func:`gguf_exact.engines.launch.server_env` gives it in ``LLAMA_API_KEY``.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf_exact import constants
from gguf_exact.builds.llama_build import build_command, find_build, install_dir, make_command
from gguf_exact.engines.shared.profiles import RESERVED, Profile, refuse_no_mmap
from gguf_exact.engines.shared.request_guard import llama_server_args
from gguf_exact.engines.shared.settings import LOG_FILE, ServeSettings
from gguf_exact.errors import ArgumentError, BuildError, GgufExactError, Param, ServerError

NAME = "llama-server"


def resolve_server_binary(profile: Profile, server_bin: str | Path | None = None) -> Path:
    """``server_bin``, else ``$GGUF_EXACT_LLAMA_SERVER``, else the cached build the profile names."""
    chosen = server_bin or constants.llama_server_bin()
    if chosen:
        path = Path(chosen).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BuildError(
                f"llama-server {path}: no such executable; build it with `gguf-exact build-llama` or fix ",
                Param("server_bin"),
            )
        return path
    build = find_build(profile.build)
    if build is None:
        raise ServerError(
            f"llama-server for build {profile.build!r} (profile {profile.name}) not found; run `{build_command(profile.build)}` (or `{make_command(profile.build)}`) first"
        )
    return build.binary("llama-server")


def check_extra_args(extra: list[str] | tuple[str, ...]) -> None:
    """Arguments after the profile's (after ``--``): the same rules as a profile's keys and
    ``--set``. No option serve sets itself (:data:`~gguf_exact.engines.shared.profiles.RESERVED`:
    llama-server takes an option's last value, so ``-- --host 0.0.0.0`` would bind every
    interface past the key check), and no mmap switch."""
    extra = list(extra)
    for i, arg in enumerate(extra):
        if not arg.startswith("-") or arg.lstrip("-").replace(".", "", 1).isdigit():
            continue  # a value (negative numbers too), not an option
        key, eq, inline = arg.lstrip("-").partition("=")
        value = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("-") else True
        if key in RESERVED:
            raise ArgumentError(
                Param("extra_args"),
                f": {arg.partition('=')[0]} is set by gguf-exact serve; use ",
                RESERVED[key],
                " instead",
            )
        refuse_no_mmap(key, inline if eq else value, Param("extra_args"))


def command(settings: ServeSettings, run_dir: Path, require_build: bool = True) -> tuple[list[str], str | None]:
    """llama-server's command line for resolved ``settings``, and a note when the build
    is not there yet (``require_build=False``, a dry run: the path it will have)."""
    prof = settings.loaded_profile
    note = None
    try:
        binary = resolve_server_binary(prof, settings.server_bin)
    except GgufExactError as e:
        if require_build or settings.server_bin or constants.llama_server_bin():
            raise
        binary, note = install_dir(prof.build) / "bin" / "llama-server", str(e)
    cmd = [str(binary), "--model", str(settings.target_path.resolve())]
    if settings.drafter_path is not None:
        cmd += ["--model-draft", str(settings.drafter_path.resolve())]
    cmd += ["--host", settings.host, "--port", str(settings.port), "--metrics", "--log-file", str(run_dir / LOG_FILE)]
    cmd += llama_server_args()
    cmd += settings.config.server_args() + list(settings.extra_args)
    return cmd, note


__all__ = ["NAME", "check_extra_args", "command", "resolve_server_binary"]
