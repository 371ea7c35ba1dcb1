"""Serving profiles: one TOML file per card in ``serve/`` (``rtx3050``, ``gtx1650ti``, ``cpu``).

A profile names the llama.cpp build it needs (``build = "cuda86"``, ``"vulkan"``) and two tables of
llama-server long options without their ``--``: ``[server]`` always, ``[draft]`` only
when a drafter is given. ``true`` is a bare flag, ``false`` leaves the flag out (where a knob
declares llama-server's opposite, ``kv-unified = false``, it gives that: ``--no-kv-unified``).
:meth:`Profile.with_overrides` applies ``KEY=VALUE`` pairs from the command line.
A GPU profile also says which cards it is for: ``cards`` (parts of the name
``nvidia-smi`` prints) and ``memory_mib`` (the card's memory), read by ``--profile
auto`` (:mod:`.profile_choice`) and by the memory plan's warning.

A profile is the file's form; what its options mean is :mod:`.knobs` (each value checked
against its knob as the file is read) and :mod:`.serving_config` (the only reader of its
tables, rendering them for llama-server, the Python engine and the memory plan).
"""

import difflib
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gguf_exact.builds.llama_build import BACKEND
from gguf_exact.constants import PROFILES_ENV, env_path
from gguf_exact.engines.shared.knobs import BY_KEY, Value
from gguf_exact.errors import ArgumentError, InputError, Message, Param
from gguf_exact.formats.bounded_json import read_side_file
from gguf_exact.resources import shipped_dir, user_config_dir

PROFILE_DIR = shipped_dir("serve")  # the project's serve/ (a wheel carries a copy)

# Options that gguf-exact sets itself, from its own arguments: what to use instead.
_API_KEY = Message(Param("api_key"), " or $GGUF_EXACT_API_KEY (kept out of the run folder)")
_GUARD = Message("nothing: the request guard's limits are fixed (README, Security)")
# In a profile, in --set and after `--` alike: llama-server takes an option's last value, so
# any of these after serve's own would override what serve checked (a --host 0.0.0.0 with no key).
RESERVED: dict[str, Message] = {
    "model": Message(Param("target")),
    "m": Message(Param("target")),
    "model-draft": Message(Param("draft")),
    "md": Message(Param("draft")),
    "spec-draft-model": Message(Param("draft")),
    "host": Message(Param("host")),
    "port": Message(Param("port")),
    "metrics": Message("(always on)"),
    "log-file": Message("(the run directory)"),
    "api-key": _API_KEY,
    "api-key-file": _API_KEY,
    "request-max-body": _GUARD,
    "request-max-depth": _GUARD,
    "grammar-max-depth": _GUARD,
    "grammar-max-bytes": _GUARD,
}
_KEY = re.compile(r"[a-z0-9][a-z0-9-]*")
@dataclass(frozen=True)
class Profile:
    name: str
    path: Path | None
    description: str = ""
    build: str = "cpu"
    server_table: dict[str, Value] = field(default_factory=dict)  # [server]: read by serving_config only
    draft_table: dict[str, Value] = field(default_factory=dict)  # [draft]: read by serving_config only
    cards: tuple[str, ...] = ()  # parts of nvidia-smi's GPU name this profile is for
    memory_mib: int | None = None  # the card's memory

    def with_overrides(self, pairs: list[str] | tuple[str, ...]) -> "Profile":
        """Apply ``KEY=VALUE`` pairs: a key (in any of its spellings, ``c`` for ``ctx-size``)
        replaces the value of the table that already has it, ``draft.KEY`` and a drafting knob go
        to [draft], anything else to [server]; ``build=...`` sets the build."""
        server, draft, build = dict(self.server_table), dict(self.draft_table), self.build
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            key = key.strip().removeprefix("--")
            if not sep or not key:
                raise ArgumentError(
                    Param("overrides"),
                    f" {pair}: expected KEY=VALUE, e.g. ",
                    Param("overrides", api=""),
                    " ctx-size=4096",
                )
            if key == "build":
                build = raw.strip()
                continue
            explicit, key = key.startswith("draft."), key.removeprefix("draft.")
            knob = BY_KEY.get(key)
            spellings = knob.keys if knob else (key,)  # ctx-size and c are one option: the new value replaces both
            in_draft = any(k in draft for k in spellings) and not any(k in server for k in spellings)
            table = draft if explicit or in_draft or (knob is not None and knob.draft and not any(k in server for k in spellings)) else server
            for k in spellings:
                server.pop(k, None), draft.pop(k, None)
            table[key] = parse_value(raw)
        return _checked(replace(self, build=build, server_table=server, draft_table=draft), Param("overrides"))

    def as_json(self) -> dict:
        """The profile as JSON (the run folder's settings.json): :meth:`from_json` rebuilds it."""
        return {
            "name": self.name, "path": str(self.path) if self.path else None, "description": self.description,
            "build": self.build, "server": self.server_table, "draft": self.draft_table,
            "cards": list(self.cards), "memory_mib": self.memory_mib,
        }  # fmt: skip

    @classmethod
    def from_json(cls, p: dict) -> "Profile":
        """The profile :meth:`as_json` wrote (not read from its file again)."""
        return cls(
            name=p["name"], path=Path(p["path"]) if p.get("path") else None, description=p.get("description", ""),
            build=p["build"], server_table=dict(p["server"]), draft_table=dict(p["draft"]),
            cards=tuple(p.get("cards", ())), memory_mib=p.get("memory_mib"),
        )  # fmt: skip


def parse_value(raw: str) -> Value:
    """A command-line value as TOML would type it: true/false, int, float, else string."""
    raw = raw.strip()
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw.strip("\"'")


def _checked(profile: Profile, where: str | Param) -> Profile:
    """``where``: the profile's file, or the parameter that gave the overrides."""
    for table_name, table in (("server", profile.server_table), ("draft", profile.draft_table)):
        for key, value in table.items():
            if not _KEY.fullmatch(key):
                raise InputError(
                    where,
                    f": [{table_name}] key {key!r} is not a llama-server long option name (lower case, '-')",
                )
            if key in RESERVED:
                raise InputError(
                    where, f": [{table_name}] {key} is set by gguf-exact serve; use ", RESERVED[key], " instead"
                )
            if not isinstance(value, (str, int, float, bool)):
                raise InputError(
                    where, f": [{table_name}] {key} = {value!r}: values must be strings, numbers or true/false"
                )
            if key in BY_KEY and value is not False:  # false leaves the option out
                BY_KEY[key].parse(key, value, where)  # its kind and bounds (engines/shared/knobs.py)
            refuse_no_mmap(key, value, where)
    if not BACKEND.fullmatch(profile.build):
        raise InputError(where, f": build = {profile.build!r}: expected 'cpu', 'vulkan' or 'cudaNN' (cuda75, cuda86)")
    return profile


def refuse_no_mmap(key: str, value: Value, where: str | Param) -> None:
    """Gemma 4 reads ``per_layer_token_embd`` lazily from the memory map: keep mmap on."""
    off = (
        (key == "no-mmap" and value is not False)
        or (key == "mmap" and value is False)
        or (key in ("load-mode", "lm") and str(value) in ("none", "dio"))
    )
    if off:
        raise InputError(
            where,
            f": {key} = {value!r} turns mmap off; Gemma 4 reads per_layer_token_embd lazily from the memory map, so remove it",
        )


def profile_dirs() -> list[Path]:
    """Where profiles are looked up by name: ``$GGUF_EXACT_PROFILES``, the user's
    ``~/.config/gguf-exact/profiles``, then the project's ``serve/``."""
    dirs = []
    if (chosen := env_path(PROFILES_ENV)) is not None:
        dirs.append(chosen)
    dirs += [user_config_dir() / "profiles", PROFILE_DIR]
    return dirs


def user_profile_dir() -> Path:
    """Where ``gguf-exact tune`` writes its copies: the first of :func:`profile_dirs`,
    which ``--profile NAME`` reads before the project's ``serve/``."""
    return profile_dirs()[0]


def available_profiles() -> list[str]:
    names = {p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.toml")}
    return sorted(names)


def find_profile(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise InputError(f"profile {path}: no such file")
        return path
    for d in profile_dirs():
        if (d / f"{text}.toml").is_file():
            return d / f"{text}.toml"
    raise InputError(not_found_line(text))


def not_found_line(name: str) -> str:
    """The one line for a profile name found in none of :func:`profile_dirs`: the nearest
    name, and what each folder holds, naming the one ``tune`` writes to."""
    dirs = profile_dirs()
    near = difflib.get_close_matches(name, available_profiles(), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    parts = []
    for i, d in enumerate(dirs):
        names = sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []
        label = " (where tune writes)" if i == 0 else (" (shipped)" if d == PROFILE_DIR else "")
        if names or i == 0:
            parts.append(f"in {d}{label}: {', '.join(names) or 'none yet'}")
    return f"profile {name!r} not found{hint}; profiles {'; '.join(parts)}; or pass a .toml file"


def load_profile(name_or_path: str | Path) -> Profile:
    """Read a profile by name (``rtx3050``) or path (``my-card.toml``)."""
    path = find_profile(name_or_path)
    raw = read_side_file(path, "profile", "a profile is a few lines of TOML")  # bounded: never read whole
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"profile {path}: not valid TOML ({e})") from None
    except RecursionError:  # tomllib is pure Python: a deep array unwinds cleanly to here
        raise InputError(f"profile {path}: not a profile (values nested too deep for TOML's parser)") from None
    except ValueError:  # only an integer past Python's limit on digits gets here
        digits = sys.get_int_max_str_digits()
        raise InputError(f"profile {path}: not a profile (an integer of more than {digits:,} digits)") from None
    unknown = set(data) - {"description", "build", "cards", "memory_mib", "server", "draft"}
    if unknown:
        raise InputError(
            f"profile {path}: unknown top-level key {sorted(unknown)[0]!r}; expected description, build, cards, memory_mib, [server], [draft]"
        )
    cards, memory = data.get("cards", []), data.get("memory_mib")
    if not isinstance(cards, list) or not all(isinstance(c, str) and c.strip() for c in cards):
        raise InputError(f'profile {path}: cards must be a list of GPU names, e.g. cards = ["RTX 3050"]')
    if memory is not None and (not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0):
        raise InputError(f"profile {path}: memory_mib = {memory!r}: expected the card's memory in MiB, e.g. 8192")
    for table in ("server", "draft"):
        if not isinstance(data.get(table, {}), dict):
            raise InputError(f"profile {path}: {table} must be a [{table}] table")
    profile = Profile(
        name=path.stem,
        path=path,
        description=str(data.get("description", "")),
        build=str(data.get("build", "cpu")),
        server_table=dict(data.get("server", {})),
        draft_table=dict(data.get("draft", {})),
        cards=tuple(cards),
        memory_mib=memory,
    )
    return _checked(profile, f"profile {path}")
