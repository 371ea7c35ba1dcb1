"""Recipes (``convert/<name>.toml``): which Hub files make a model, and from which revision.

A recipe names up to three parts, each a Hub repository, a revision and its files:

- ``[source]``: the checkpoint to convert (Google's QAT bf16 weights);
- ``[exact]``: the published exact GGUF, what ``gguf-exact fetch`` gets by default and
  what ``gguf-exact build`` must reproduce;
- ``[target]``: the target model's GGUF whose ``tokenizer.*`` keys the drafter copies
  (``--vocab-from``).

A drafter recipe may say which Gemma 4 size it serves (``size = "E2B"``, a key of
:data:`gguf_exact.gemma4.sizes.SIZES`): ``gguf-exact serve`` then finds or fetches it for
a target of that size. File entries are names or ``fnmatch`` patterns (``model*.safetensors*``). The hashes
and the commit each revision resolved to live in the recipe's checksum file
(``checksums/<name>.sha256``, see :mod:`.checksums`), written by ``gguf-exact pin``.
:func:`parse_recipe` is pure; :func:`load_recipe` reads the file.
"""

import os
import re
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gguf_exact.constants import RECIPES_ENV, env_path
from gguf_exact.errors import HubError
from gguf_exact.hub.checksums import user_checksums_dir
from gguf_exact.hub.names import check_repo_id, check_revision, relative_path_problem
from gguf_exact.resources import is_installed_data, shipped_dir, user_config_dir

RECIPES_DIR = shipped_dir("convert")  # the project's convert/ (a wheel carries a copy)
ROLES = ("source", "exact", "target")
KINDS = ("drafter", "model")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # recipe names become checksums/<name>.sha256


@dataclass(frozen=True)
class RepoPart:
    """One part of a recipe: a Hub repository, the revision to pin, and its files."""

    role: str
    repo: str
    revision: str
    files: tuple[str, ...]  # names or fnmatch patterns, relative to the repo root

    def matches(self, filename: str) -> bool:
        return any(filename == f or (is_pattern(f) and fnmatchcase(filename, f)) for f in self.files)


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    kind: str  # "drafter" or "model"
    description: str
    output: str  # file name of the exact GGUF this recipe makes
    parts: dict[str, RepoPart]
    checksums: Path
    size: str | None = None  # the Gemma 4 size whose target this drafter serves

    @property
    def pin_destination(self) -> Path:
        """Where ``gguf-exact pin`` writes this recipe's checksum file: the file it reads
        when that can be written (a checkout, the user's own recipe), else the user's
        checksums folder (``$GGUF_EXACT_CHECKSUMS``, else ``~/.config/gguf-exact/checksums``),
        which :func:`load_recipe` reads first from then on. An installed package's data is never written."""
        if not is_installed_data(self.checksums) and _writable(self.checksums):
            return self.checksums
        return user_checksums_dir() / self.checksums.name

    def part(self, role: str) -> RepoPart:
        if role not in self.parts:
            have = ", ".join(self.parts) or "none"
            raise HubError(f"{self.path}: recipe {self.name} has no {role} section (it has: {have})")
        return self.parts[role]


def is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def parse_recipe(data: dict, path: Path) -> Recipe:
    """Check a recipe's TOML table and build the :class:`Recipe` (no I/O)."""
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise HubError(
            f'{path}: name = {name!r} must be letters, digits, ".", "_" and "-" (it names checksums/<name>.sha256)'
        )
    kind = data.get("kind", "drafter")
    if kind not in KINDS:
        raise HubError(f"{path}: kind = {kind!r}; expected one of {', '.join(KINDS)}")
    output = data.get("output")
    if not isinstance(output, str) or "/" in output or relative_path_problem(output) or not output.endswith(".gguf"):
        raise HubError(f'{path}: output must be a file name ending in .gguf, e.g. output = "{name}-q4_0-exact.gguf"')
    parts = {}
    for role in ROLES:
        if role in data:
            parts[role] = parse_part(role, data[role], path)
    if "source" not in parts:
        raise HubError(f"{path}: a recipe needs a source section with repo, revision and files")
    if "target" in parts and len(parts["target"].files) != 1:
        raise HubError(
            f"{path}: the target section names the one GGUF whose tokenizer the drafter copies; it lists {len(parts['target'].files)} files"
        )
    checksums = data.get("checksums", f"../checksums/{name}.sha256")
    if (
        not isinstance(checksums, str)
        or not checksums.endswith(".sha256")
        or relative_path_problem(checksums.removeprefix("../"))
    ):
        raise HubError(
            f'{path}: checksums = {checksums!r} must be a relative path to a .sha256 file, e.g. "../checksums/{name}.sha256"'
        )
    size = data.get("size")
    if size is not None:
        from gguf_exact.gemma4.sizes import SIZES

        if size not in SIZES:
            raise HubError(f"{path}: size = {size!r}; expected one of {', '.join(SIZES)}")
    declared = (path.parent / checksums).resolve()
    return Recipe(name, path, kind, str(data.get("description", "")), output, parts, _checksums_to_read(declared), size)


def _checksums_to_read(declared: Path) -> Path:
    """The user's copy of a project checksum file (written by ``pin`` where the project's
    is read-only) when there is one, else the declared file."""
    if declared.parent == shipped_dir("checksums").resolve():
        user = user_checksums_dir() / declared.name
        if user.is_file():
            return user
    return declared


def _writable(path: Path) -> bool:
    """``path`` can be (re)written: the file is writable, or its nearest existing folder is."""
    if path.exists():
        return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def parse_part(role: str, table: object, path: Path) -> RepoPart:
    where = f"{path}: {role} section"
    if not isinstance(table, dict):
        raise HubError(f"{where} must be a table with repo, revision and files")
    repo, revision, files = table.get("repo"), table.get("revision"), table.get("files")
    repo, revision = check_repo_id(repo, where), check_revision(revision, where)
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
        raise HubError(f"{where}: files must be a non-empty list of file names or patterns")
    for f in files:
        problem = relative_path_problem(f) or ("a space" if any(c.isspace() for c in f) else None)
        if problem:
            raise HubError(
                f'{where}: file {f[:120]!r} has {problem}; name a path inside the repo, e.g. "model.safetensors"'
            )
    return RepoPart(role, repo, revision, tuple(files))


def recipe_dirs() -> list[Path]:
    """Where recipes are looked up by name, first match wins: ``$GGUF_EXACT_RECIPES``,
    ``~/.config/gguf-exact/recipes``, then the project's ``convert/``."""
    dirs = [chosen] if (chosen := env_path(RECIPES_ENV)) is not None else []
    return dirs + [user_config_dir() / "recipes", RECIPES_DIR]


def recipe_path(name_or_path: str | Path, directory: Path | None = None) -> Path:
    """``<folder>/<name>.toml`` for a name (the first of :func:`recipe_dirs` that has it, or
    ``directory``); a path to a ``.toml`` file as it is."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text:
        return Path(text)
    dirs = [Path(directory)] if directory is not None else recipe_dirs()
    return next((d / f"{text}.toml" for d in dirs if (d / f"{text}.toml").is_file()), dirs[-1] / f"{text}.toml")


def load_recipe(name_or_path: str | Path, directory: Path | None = None) -> Recipe:
    """Load a recipe by name (``e2b-assistant``) or path (``convert/e2b-assistant.toml``)."""
    path = recipe_path(name_or_path, directory)
    if not path.is_file():
        known = ", ".join(recipe_names(directory)) or "none"
        raise HubError(
            f"recipe {name_or_path}: no file {path}; known recipes: {known} (`gguf-exact recipes` lists them)"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise HubError(f"{path}: not valid TOML ({err})") from None
    return parse_recipe(data, path)


def recipe_names(directory: Path | None = None) -> list[str]:
    """Names of the recipes in ``directory``, or in every folder of :func:`recipe_dirs`."""
    dirs = [Path(directory)] if directory is not None else recipe_dirs()
    return sorted({p.stem for d in dirs for p in d.glob("*.toml")})


def all_recipes(directory: Path | None = None) -> list[Recipe]:
    """Every recipe, the first folder of :func:`recipe_dirs` first (a user's recipe
    shadows the project's of the same name)."""
    dirs = [Path(directory)] if directory is not None else recipe_dirs()
    names: list[str] = []
    for d in dirs:
        names += [s for s in sorted(p.stem for p in d.glob("*.toml")) if s not in names]
    return [load_recipe(n, directory) for n in names]
