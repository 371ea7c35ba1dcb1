"""The ``gguf-exact`` group: errors as one ``error:`` line naming the flags, and the executable.

Commands attach themselves with ``@main.command()`` in the group modules
(:mod:`gguf_exact.cli`), each imported when one of its commands runs (:data:`COMMANDS`);
this module holds what they share at the top: how a
:class:`~gguf_exact.errors.GgufExactError` reaches the user (one line, exit status 1,
the parameters it names spelled as the command's flags) and :func:`run`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import sys
from typing import Callable, Iterator, MutableMapping

import click

from gguf_exact.cli import console
from gguf_exact.errors import GgufExactError, Param, render
from gguf_exact.formats.paths import one_command
from gguf_exact.version import __version__

# API parameter names that no option of the command spells (the options take another name).
FLAGS = {
    "target": "--model",
    "draft": "--draft",
    "fetch": "--fetch-draft",
    "n_values": "--n-max",
    "roles": "--what",
    "extra_args": "llama-server arguments",
}


def flag(command: click.Command | None, name: str) -> str:
    """How ``command`` spells the API parameter ``name``: its option's long flag
    (``off_grid`` -> ``--off-grid``), else the usual spelling."""
    for p in command.params if command is not None else ():
        if p.name == name and isinstance(p, click.Option):
            return max(p.opts, key=len)
    return FLAGS.get(name) or "--" + name.replace("_", "-")


def flags(command: click.Command | None = None) -> Callable[[Param], str]:
    """How the CLI names a :class:`Param`: by ``command``'s flag (default: the current
    click context's command), to pass as ``name=`` wherever the API renders text."""
    if command is None:
        ctx = click.get_current_context(silent=True)
        command = ctx.command if ctx is not None else None
    return lambda p: p.spelled(flag(command, p.name))


def message(e: GgufExactError | str, command: click.Command | None = None) -> str:
    """``e`` (an error, a :class:`~gguf_exact.errors.Message` or plain text) as the CLI
    says it: parameters named by their flags. ``command``: the one running (default:
    the current click context's)."""
    name = flags(command)
    return e.render(name) if isinstance(e, GgufExactError) else render(e, name)


# Each command's group module (gguf_exact.cli.<module>), imported when the command runs:
# `convert` then loads what it uses and not what `serve`, `fetch` or `bench` import (rich's
# tables, huggingface_hub, the engines' settings), about a tenth of its whole process.
COMMANDS = {
    "inspect": "files", "convert": "files", "verify": "files", "compare": "files",
    "repack": "repack",
    "recipes": "hub", "fetch": "hub", "build": "hub", "pin": "hub",
    "build-llama": "builds", "build-bindings": "builds", "build-kernels": "builds", "doctor": "builds",
    "serve": "serving", "status": "serving", "stop": "serving", "tune": "tuning",
    "rpc-server": "rpc",
    "generate": "inprocess", "chat": "inprocess", "bench": "inprocess",
    "make-tiny": "tiny", "make-pair": "tiny", "demo": "tiny",
    "quality": "quality",
    "publish": "publish",
}  # fmt: skip
GROUPS = tuple(dict.fromkeys(COMMANDS.values()))
# Commands that read files, compute over them in bounded chunks and exit: the executable runs
# them with Python's cyclic garbage collector off (:func:`run`); every other command turns
# it back on when it is looked up (a server, a chat or a benchmark may run for hours).
WITHOUT_CYCLIC_GC = frozenset({"inspect", "convert", "verify", "compare"})


# Commands that write files through the safe writer (gguf_exact.formats.safe_write): SIGTERM
# and SIGHUP stop them as Ctrl-C does, every temp file removed on the way out. Python's default
# for those signals is to die on the spot, leaving a full-size ``.part`` beside the output until
# the next run to that path. Servers keep their own handling (uvicorn's, the foreground serve's).
STOP_CLEANLY = frozenset({
    "convert", "repack", "fetch", "build", "pin", "publish", "tune", "bench", "quality",
    "make-tiny", "make-pair",
})  # fmt: skip
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A stop signal, raised where Ctrl-C's KeyboardInterrupt would be: every ``with`` and
    ``finally`` on the way out runs (temp files removed, worker threads and servers stopped)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP raise :class:`Stopped` in the main thread; restored after."""

    def stop(signum, frame):
        raise Stopped(signum)

    try:
        previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    except ValueError:  # not the main thread: signals are the main thread's to handle
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def load_groups() -> MutableMapping[str, click.Command]:
    """Every command, its group module imported: ``main.commands`` whole (``--help``, an
    unknown name's suggestions, code that walks every command)."""
    for group in GROUPS:
        importlib.import_module(f"gguf_exact.cli.{group}")
    return main.commands


class UsageLine(click.ClickException):
    """A usage error of click's (an unknown option or command, a missing argument, a bad
    choice or value) as every other failure reads: one ``error:`` line with click's hint,
    exit status 1."""

    exit_code = 1

    def __init__(self, e: click.UsageError) -> None:
        message = " ".join(e.format_message().split()).removesuffix(".")
        ctx = e.ctx
        if ctx is not None and ctx.command.get_help_option(ctx) is not None:
            help_flag = max(ctx.command.get_help_option_names(ctx), key=len)
            message += f" (see `{ctx.command_path} {help_flag}`)"
        super().__init__(message)

    def show(self, file=None) -> None:
        console.error(self.message)


class Group(click.Group):
    """Turns :class:`GgufExactError` into one ``error:`` line and exit status 1; each
    command records what it reads, which none of its outputs may be (:func:`one_command`).
    A command's module is imported when it is looked up (:data:`COMMANDS`)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:  # the group's own options (`gguf-exact --bogus`)
            raise UsageLine(e) from e

    def get_command(self, ctx, cmd_name: str) -> click.Command | None:
        if cmd_name not in WITHOUT_CYCLIC_GC:
            gc.enable()
        if cmd_name not in self.commands:
            if cmd_name in COMMANDS:
                importlib.import_module(f"gguf_exact.cli.{COMMANDS[cmd_name]}")
            else:  # a misspelling: click suggests the closest of self.commands
                load_groups()
        return self.commands.get(cmd_name)

    def list_commands(self, ctx) -> list[str]:
        return sorted(load_groups())

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        if name in STOP_CLEANLY:
            ctx.with_resource(stop_signals_raise())  # until the command's context closes
        return name, command, rest

    def invoke(self, ctx):
        try:
            with one_command():
                return super().invoke(ctx)
        except GgufExactError as e:
            name = ctx.invoked_subcommand
            command = self.commands.get(name) if name else None
            console.error(message(e, command))
            ctx.exit(1)
        except click.UsageError as e:  # a command's name, options or arguments
            raise UsageLine(e) from e
        except Stopped as e:
            name = signal.Signals(e.signum).name
            console.error(f"stopped by {name}; no partial file was left at any output: run the command again to finish")
            ctx.exit(128 + e.signum)  # the status of a process the signal ended, as shells report it


@click.group(cls=Group)
@click.version_option(__version__, prog_name="gguf-exact")
def main() -> None:
    """Lossless Q4_0 GGUF for Gemma 4 QAT drafters and models.

    Google trains Gemma 4 and its MTP drafters onto Q4_0's 4-bit grid but ships
    bf16. gguf-exact finds that grid and writes Q4_0 that keeps every trained
    level, with scales chosen so values decode to the source bits.

    \b
    Try it offline on tiny models:
      gguf-exact make-tiny build/tiny
      gguf-exact convert build/tiny/drafter-hf build/tiny/drafter.gguf --vocab-from build/tiny/target.gguf
      gguf-exact repack --donor build/tiny/main-q4_0.gguf --source build/tiny/main-hf build/tiny/main-exact.gguf
    Real models:
      gguf-exact recipes                      what fetch, pin and build know
      gguf-exact fetch e2b-assistant          the published exact E2B drafter
      gguf-exact serve --model gemma-4-E2B_q4_0-it.gguf --fetch-draft
    """


def run() -> None:
    """The ``gguf-exact`` executable: :func:`main`, then an exit without the interpreter's
    teardown. Unloading numba and llvmlite takes about 0.2 s after every command, a sixth
    of a whole drafter conversion (measured: ``convert`` ends at 0.97 s, its process at
    1.2 s). By then every output file has been written, fsynced and renamed, pools and
    servers are shut down, and stdout and stderr are flushed here: the teardown has
    nothing left to do. ``python -m gguf_exact`` and ``main()`` itself exit normally.

    It also starts with the cyclic garbage collector off, on for every command but those
    in :data:`WITHOUT_CYCLIC_GC` (:meth:`Group.get_command`). Loading numba and its cached
    kernels leaves about 108,000 objects for the collector to track (its typing and
    lowering registries), and it ran 250 times while ``convert`` started, freeing about
    1,200 objects in all: 0.10-0.12 s of CPU inside the collector (``gc.callbacks``), a
    tenth of the start-up. Those commands make few reference cycles (chunks are arrays,
    freed by their reference counts), and what they leave goes with the process."""
    gc.disable()
    try:
        main()
        code: int | str | None = 0
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):  # as the interpreter does with SystemExit("message")
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
