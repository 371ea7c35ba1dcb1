"""Options and parameter types that several commands share, written once.

- :class:`CommaList`: ``--n-max 1,2,3,4``, ``--prompts code,prose``
- :func:`target_and_draft_options`: ``--model``, ``--draft``, ``--no-draft``, ``--fetch-draft``,
  ``--models-dir`` (serve, chat, generate, tune)
- :func:`sampling_options`: ``--temperature`` ... ``--seed`` (generate, chat)
- :func:`draft_length_options`: ``--n-max``, ``--adaptive/--no-adaptive`` (generate, chat)
- :func:`n_predict_option`: ``--n-predict`` (``--max-tokens`` hidden, its old name in chat)
- :data:`models_dir_option`, :func:`profile_option`, :data:`overrides_option`,
  :data:`server_bin_option`, :func:`out_dir_option`, :data:`prompts_option`
- :func:`settings_options`: options generated from a settings model's fields (serve's
  ``--host``, ``--port``, ``--api-key`` ... from :class:`~gguf_exact.engines.shared.settings.ServeSettings`)
- :func:`knob_options`: ``--ctx-size``, ``--threads``, ``--spec-draft-n-max`` ... generated
  from the serving knobs (:mod:`gguf_exact.engines.shared.knobs`), given to the profile as overrides
"""

from __future__ import annotations

import functools
from pathlib import Path

import click

from gguf_exact.engines.shared.settings import DEFAULT_PROFILE
from gguf_exact.errors import ArgumentError

MODELS_DIR_HELP = "Where files are placed, as MODELS_DIR/<repo>/<file> (the paths in checksums/RECIPE.sha256)."

PROFILE_HELP = (
    "auto (from nvidia-smi's GPU name and memory; cpu without one), rtx3050, gtx1650ti, gtx1650ti-vulkan, cpu, "
    "a name in ~/.config/gguf-exact/profiles (where `gguf-exact tune` writes, e.g. cpu-tuned), or a .toml file."
)


class CommaList(click.ParamType):
    """``a,b,c`` as a list of ``kind`` (int or str), each item stripped; empty items are
    dropped unless ``keep_empty`` (an empty name is then refused where it is used). A bad
    item is one ``error:`` line (exit 1), as every other bad value is:
    ``--n-max 1,x: expected comma-separated integers, e.g. 1,2,3,4``."""

    name = "list"

    def __init__(self, kind: type = str, example: str = "", keep_empty: bool = False) -> None:
        self.kind, self.example, self.keep_empty = kind, example, keep_empty

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):  # a default, or converted already
            return list(value)
        if not str(value).strip():
            return []
        items = [x.strip() for x in str(value).split(",")]
        items = items if self.keep_empty else [x for x in items if x]
        try:
            return [self.kind(x) for x in items]
        except ValueError:
            flag = max(param.opts, key=len) if param is not None else "value"
            raise ArgumentError(
                f"{flag} {value}: expected comma-separated integers, e.g. {self.example or value}"
            ) from None


def _apply(command, options):
    for opt in reversed(options):
        command = opt(command)
    return command


models_dir_option = click.option(
    "--models-dir", type=click.Path(path_type=Path), default=Path("models"), show_default=True, help=MODELS_DIR_HELP
)

overrides_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a profile value, e.g. --set ctx-size=4096 --set spec-draft-n-max=1.",
)

server_bin_option = click.option(
    "--server-bin", type=click.Path(path_type=Path), help="A llama-server to run instead of the cached build."
)

prompts_option = click.option(
    "--prompts",
    "prompt_names",
    type=CommaList(str, keep_empty=True),
    help="Comma-separated names from the shipped prompt set (default: all).",
)


def settings_options(model: type, *names: str):
    """click options for the fields ``names`` of the dataclass ``model``, generated from each
    field's declaration (its type, default and ``help``/``choices``/``metavar``/``envvar``
    metadata), as llama-cpp-python's server generates its flags from its settings model: the
    field is declared once. A tuple field takes a comma-separated list."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(model)
    declared = {f.name: f for f in dataclasses.fields(model)}
    options = []
    for name in names:
        f, hint = declared[name], hints[name]
        meta = dict(f.metadata)
        kwargs: dict = {"help": meta.pop("help"), "default": f.default}
        if "choices" in meta:
            kwargs["type"] = click.Choice(list(meta.pop("choices")))
        elif hint is bool:
            kwargs["is_flag"] = True
        elif hint is int:
            kwargs["type"] = int
        elif Path in typing.get_args(hint):
            kwargs["type"] = click.Path(path_type=Path)
        elif typing.get_origin(hint) is tuple:
            kwargs["type"] = CommaList(str)
        kwargs["show_default"] = f.default not in (None, (), False)
        options.append(click.option(f"--{name.replace('_', '-')}", name, **kwargs, **meta))
    return lambda command: _apply(command, options)


def knob_options(command):
    """``--ctx-size``, ``--threads``, ``--spec-draft-n-max`` ...: an option for each serving knob
    marked ``cli`` (:data:`gguf_exact.engines.shared.knobs.KNOBS`), generated from its declaration.
    Those given are added to ``overrides`` as ``KEY=VALUE`` after ``--set``'s, so they win
    over the profile and ``--set`` alike; the knob's own parser checks them."""
    from gguf_exact.engines.shared.knobs import KNOBS

    knobs = [k for k in KNOBS if k.cli]

    @functools.wraps(command)
    def with_knobs(*args, **kwargs):
        given = [(k, kwargs.pop(k.name)) for k in knobs]
        kwargs["overrides"] = tuple(kwargs.get("overrides", ())) + tuple(
            f"{k.flag}={str(v).lower() if isinstance(v, bool) else v}" for k, v in given if v is not None
        )
        return command(*args, **kwargs)

    options = []
    for k in knobs:
        if k.kind == "bool":
            decl, kind = f"--{k.flag}/--no-{k.flag}", None
        else:
            decl = f"--{k.flag}"
            low, high = (None if v is None else int(v) for v in (k.minimum, k.maximum))
            kind = {"int": click.IntRange(min=low, max=high), "float": click.FloatRange(min=k.minimum, max=k.maximum),
                    "switch": click.Choice(["on", "off", "auto"])}.get(k.kind, str)  # fmt: skip
        options.append(click.option(decl, k.name, type=kind, default=None, help=k.help_text))
    return _apply(with_knobs, options)


def profile_option(default: str | None = DEFAULT_PROFILE, lead: str = "", tail: str = ""):
    """``--profile NAME|auto|FILE``."""
    return click.option("--profile", default=default, show_default=default is not None, help=lead + PROFILE_HELP + tail)


def n_max_list_option(help: str, example: str):
    """``--n-max 1,2,3,4``: draft lengths to measure."""
    return click.option(
        "--n-max", "n_values", type=CommaList(int, example), default="1,2,3,4", show_default=True, help=help
    )


def out_dir_option(kind: str, files: str):
    """``--out DIR``: where a measurement's files go (default: a new folder under the cache)."""
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(path_type=Path),
        help=f"Where {files} go (default: a new folder ~/.cache/gguf-exact/{kind}/DATE-TIME, named at the end).",
    )


def target_and_draft_options(auto: bool, no_draft: bool = True):
    """``--model TARGET.gguf [--draft DRAFTER.gguf|auto] [--no-draft] [--fetch-draft]
    [--models-dir DIR]``, shared by serve, chat, generate and tune. With ``auto`` no
    ``--draft`` means ``--draft auto`` (serve, chat); else the target alone (generate).
    ``no_draft=False`` leaves ``--no-draft`` out (tune: nothing to tune without a drafter)."""
    default = " (the default)" if auto else ""
    draft_help = (
        "The gemma4-assistant MTP drafter GGUF, or auto" + default + ": the target's size is read from its "
        "header and its exact drafter looked for in --models-dir (where `gguf-exact fetch` puts it) and beside the target."
    )
    options = [
        click.option(
            "--model", "target", required=True, type=click.Path(path_type=Path), help="The gemma4 target GGUF."
        ),
        click.option("--draft", "drafter", metavar="FILE|auto", help=draft_help),
    ]
    if no_draft:
        options.append(click.option("--no-draft", is_flag=True, help="The target alone: no drafter, no speculation."))
    options += [
        click.option(
            "--fetch-draft",
            is_flag=True,
            help="When no drafter is found, fetch the exact one a recipe (`gguf-exact recipes`) names for the "
            "target's size into --models-dir (size and sha256 checked; the published drafters: sha256 pinned, commit not pinned); with --dry-run, only say where.",
        ),
        click.option(
            "--models-dir",
            type=click.Path(path_type=Path),
            default=Path("models"),
            show_default=True,
            help=MODELS_DIR_HELP + " Searched for the drafter.",
        ),
    ]
    return lambda command: _apply(command, options)


def sampling_options(command):
    """--temperature --top-k --top-p --min-p --repeat-penalty --seed (llama-cpp-python's sampler),
    defaulting to llama-server's values except the temperature (greedy here)."""
    from gguf_exact.engines.shared.sampling_defaults import SERVER_SAMPLING as d

    return _apply(
        command,
        [
            click.option(
                "--temperature",
                default=0.0,
                show_default=True,
                help=f"0 is greedy; above 0 samples (both servers default to {d['temperature']}).",
            ),
            click.option("--top-k", default=d["top_k"], show_default=True),
            click.option("--top-p", default=d["top_p"], show_default=True),
            click.option("--min-p", default=d["min_p"], show_default=True),
            click.option("--repeat-penalty", default=d["repeat_penalty"], show_default=True, help="1.0 is off."),
            click.option(
                "--seed",
                type=int,
                help="Sampler seed: the same seed and settings repeat a run. The drafter keeps the target's "
                "distribution, not the text per seed (greedy: the same text but at rare near-ties).",
            ),
        ],
    )


def sampling(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float, seed: int | None):
    """The sampler the :func:`sampling_options` give."""
    from gguf_exact.engines.python.runner import Sampling

    return Sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed)


def drafter_from_options(
    target: Path,
    drafter: str | None,
    no_draft: bool,
    fetch_draft: bool,
    models_dir: Path,
    auto: bool,
    dry_run: bool = False,
):
    """What the :func:`target_and_draft_options` name:
    :func:`gguf_exact.engines.drafter_lookup.resolve_drafter`'s :class:`DrafterFound`."""
    from gguf_exact.engines.drafter_lookup import resolve_drafter

    return resolve_drafter(target, drafter, no_draft, models_dir, fetch_draft, default_auto=auto, dry_run=dry_run)


def draft_length_options(command):
    """``--n-max N`` and ``--adaptive/--no-adaptive``, both defaulting (None) to the shipped
    profiles' drafting: the length chosen before each pass, up to n-max 4."""
    return _apply(
        command,
        [
            click.option(
                "--n-max",
                type=click.IntRange(min=0),
                default=None,
                help="Most draft tokens per target pass; 0 runs the target alone (default: the profile's; "
                "without one 4, as every shipped profile).",
            ),
            click.option(
                "--adaptive/--no-adaptive",
                default=None,
                help="Choose the draft length before each pass, up to --n-max, from what passes cost here and what "
                "the drafter gets right (default: the profile's spec-draft-adaptive; without one, on); "
                "--no-adaptive --n-max N drafts N every pass.",
            ),
        ],
    )


def n_predict_option(default: int, help: str):
    """``--n-predict N`` (at least 1), the token limit of generate, chat, bench and tune alike;
    ``--max-tokens`` is kept, hidden, for scripts written when chat spelled it so."""

    def decorate(command):
        @functools.wraps(command)
        def with_alias(*args, max_tokens: int | None = None, **kwargs):
            if max_tokens is not None:
                kwargs["n_predict"] = max_tokens
            return command(*args, **kwargs)

        with_alias = click.option("--max-tokens", type=click.IntRange(min=1), hidden=True)(with_alias)
        return click.option("--n-predict", type=click.IntRange(min=1), default=default, show_default=True, help=help)(
            with_alias
        )

    return decorate


def draft_length_words(n_max: int, adaptive: bool) -> str:
    """How serve, chat and generate say the draft length: ``adaptive, up to n-max 4``."""
    if n_max <= 0:
        return "none (n-max 0: the target alone)"
    return f"adaptive, up to n-max {n_max}" if adaptive else f"fixed, n-max {n_max}"


def profile_line(prof, choice) -> str:
    """``profile  NAME (description), build B`` and, for ``--profile auto``, why that one."""
    from gguf_exact.engines.shared.profiles import PROFILE_DIR

    why = f"; --profile auto: {choice.reason}" if choice is not None else ""
    where = f", from {prof.path}" if prof.path and prof.path.parent.resolve() != PROFILE_DIR.resolve() else ""
    return f"profile  {prof.name} ({prof.description}), build {prof.build}{where}{why}"


def results_dir(kind: str) -> Path:
    """``<cache>/<kind>/<date-time>``: where ``bench`` and ``tune`` write without ``--out``
    (not the folder the command happens to run in)."""
    import time

    from gguf_exact.builds.llama_build import cache_root

    return cache_root() / kind / time.strftime("%Y%m%d-%H%M%S")
