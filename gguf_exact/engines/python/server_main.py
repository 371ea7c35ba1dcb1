"""The llama-cpp-python engine (``serve --engine python``): its command line, and the process it runs.

:func:`command` starts this module as the server process (``python -m`` of this module,
named by the module object, not a string): ``--settings RUN_DIR/settings.json``, the
resolved :class:`~.settings.ServeSettings` that :func:`~gguf_exact.engines.launch.plan_launch`
checked and wrote. :func:`main` reads them back (the profile is not parsed again, the pair
not checked again), loads :class:`~gguf_exact.engines.python.engine.MtpLlama` with the
options computed once, and serves :func:`gguf_exact.engines.python.openai_server.build_app`
with uvicorn; the API key comes in ``$GGUF_EXACT_API_KEY``, never on the command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gguf_exact import constants
from gguf_exact.engines.shared.settings import LOG_FILE, SETTINGS_FILE, ServeSettings, read_settings
from gguf_exact.errors import GgufExactError

NAME = "python"
log = logging.getLogger("gguf_exact.server")


def command(settings: ServeSettings, run_dir: Path) -> list[str]:
    """The Python engine's command line; its settings are read from ``run_dir/settings.json``."""
    return [sys.executable, "-m", __name__, "--settings", str(run_dir / SETTINGS_FILE)]


def _logging_to(log_file: Path) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr), logging.FileHandler(log_file)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", handlers=handlers)


def main(argv: list[str] | None = None) -> int:
    """The server process: settings from the run folder, the engine loaded once, uvicorn."""
    ap = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.splitlines()[0])
    ap.add_argument("--settings", required=True, type=Path, help="settings.json in the server's run folder")
    args = ap.parse_args(argv)
    _logging_to(args.settings.parent / LOG_FILE)
    try:
        import uvicorn

        from gguf_exact.engines.python.load import load_with_options
        from gguf_exact.engines.python.openai_server import build_app, served_name

        settings = read_settings(args.settings, constants.api_key())
        opts, prof = settings.engine_options, settings.loaded_profile
        if opts is None or not settings.pair_checked:
            raise GgufExactError(f"{args.settings}: settings not resolved by plan_launch; start the server again")
        if settings.ignored_keys:
            log.info("profile %s: not used by the Python engine: %s", prof.name, ", ".join(settings.ignored_keys))
        llm = load_with_options(
            settings.target_path, settings.drafter_path, opts, prof, logits_all=settings.logprobs, checked=True
        )
        alias = served_name(settings.target_path)
        drafter = f" + drafter {settings.drafter_path}" if settings.drafter_path else ""
        log.info(
            "engine python: %s%s, n_ctx %d, n-max %d, alias %s",
            settings.target_path,
            drafter,
            llm.n_ctx(),
            llm.n_max,
            alias,
        )
        app = build_app(llm, alias, settings.api_key)
    except GgufExactError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=True)
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C in the foreground: uvicorn has shut down and re-raises it
        pass
    finally:
        llm.close()
    return 0 if server.started else 1


__all__ = ["NAME", "command", "main"]

if __name__ == "__main__":
    sys.exit(main())
