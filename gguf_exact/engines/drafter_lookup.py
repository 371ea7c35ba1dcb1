"""Find the MTP drafter for a target: ``serve``, ``chat``, ``generate`` and ``bench``
without ``--draft`` (or with ``--draft auto``).

1. The target's size, from its header (:func:`identify_size`): its structure (layer
   count, sliding/full pattern, KV-shared layers, query and per-layer KV heads) is
   compared with every size in :data:`gguf_exact.gemma4.sizes.SIZES`, then its widths.
   A file with a size's structure at other widths (the tiny structural fixtures) is
   that size "in structure"; llama.cpp itself tells the sizes apart by layer count.
2. The drafter recipes for that size (``convert/*.toml`` with ``size = "E2B"``): the drafter
   ``gguf-exact fetch`` converted with its ordered-embedding head,
   ``MODELS_DIR/converted/<output>``, first; then their published exact file where
   ``fetch --what exact`` puts it, ``MODELS_DIR/<repo>/<file>``, checked against the
   recipe's pinned sha256.
3. Any other ``gemma4-assistant`` GGUF under ``MODELS_DIR`` or beside the target.
4. With ``fetch``: as ``gguf-exact fetch`` does, the checkpoint converted here with its head
   where the recipe pins it (:func:`gguf_exact.rebuild.with_head.fetch_drafter_with_head`),
   else the recipe's exact file, fetched pinned and hash-checked
   (:func:`gguf_exact.hub.fetch.fetch_recipe`).

Every candidate must pass the serving checks against the target
(:func:`gguf_exact.pair.checks.check_pair`: width, vocabulary). When none does,
one line says why and what to do: fetch it, pass ``--draft FILE``, or serve the
target alone with ``--no-draft``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gguf_exact.errors import ArgumentError, GgufExactError, InputError, Message, PairError, Param
from gguf_exact.formats.gguf_file import sha256_file
from gguf_exact.hub.recipes import RECIPES_ENV  # a recipes folder searched first (tests: a loopback Hub's)
from gguf_exact.pair.checks import DRAFTER_ARCH, ModelFile, ServePair, check_pair, read_model
from gguf_exact.pair.geometry import SizeMatch, identify_size

AUTO = "auto"


def drafter_recipes(size: str | None, recipes_dir: Path | None = None) -> list:
    """The drafter recipes whose ``size`` is ``size``, by name."""
    from gguf_exact.hub.recipes import all_recipes

    if size is None:
        return []
    recipes = all_recipes(Path(recipes_dir) if recipes_dir else None)
    return [r for r in recipes if r.kind == "drafter" and r.size == size]


@dataclass(frozen=True)
class DrafterFound:
    path: Path | None  # None: the target alone (--no-draft), or not fetched yet (a dry run)
    how: str  # one phrase: where it was found, or why there is none (a Message where it names a parameter)
    size: SizeMatch | None = None
    would_fetch: Path | None = None  # a dry run: where fetching would place it (nothing downloaded)
    given: bool = False  # the caller named the file: nothing was looked for
    pair: ServePair | None = None  # the target and drafter as read and checked by the search (read once)


def _published_path(recipe, models_dir: Path) -> tuple[Path, str | None]:
    """Where ``gguf-exact fetch RECIPE`` places the exact file, and its pinned sha256."""
    from gguf_exact.hub import checksums

    part = recipe.part("exact")
    pins = checksums.read(recipe.checksums) if recipe.checksums.is_file() else None
    name = part.files[0]
    sha = pins.sha256(f"{part.repo}/{name}") if pins else None
    return Path(models_dir) / part.repo / name, sha


def _pair(target: ModelFile, candidate: "ModelFile | Path") -> "ServePair | GgufExactError":
    """The checked pair when ``candidate`` serves beside ``target``, else why not."""
    try:
        return check_pair(target, candidate)
    except GgufExactError as e:
        return e


def _local_candidates(target: Path, models_dir: Path, width: int) -> list[ModelFile]:
    """``gemma4-assistant`` GGUFs of the target's width under ``models_dir`` and beside the
    target, each header read once."""
    found: list[ModelFile] = []
    places = sorted(Path(models_dir).rglob("*.gguf")) if Path(models_dir).is_dir() else []
    places += sorted(target.parent.glob("*.gguf"))
    seen = set()
    for p in places:
        key = p.resolve()
        if key in seen or key == target.resolve() or not p.is_file():
            continue
        seen.add(key)
        try:
            m = read_model(p, "drafter")
        except GgufExactError:
            continue  # not a GGUF we can read: not a candidate
        if m.architecture == DRAFTER_ARCH and m.embedding_length_out == width:
            found.append(m)
    return found


def find_drafter(
    target: "str | Path | ModelFile",
    models_dir: str | Path = "models",
    fetch: bool = False,
    recipes_dir: str | Path | None = None,
    config=None,
    progress: bool = True,
    dry_run: bool = False,
) -> DrafterFound:
    """The drafter for ``target`` (see the module doc); raises one line when there is none.
    ``dry_run``: where ``fetch`` would download it, say so and download nothing
    (:attr:`DrafterFound.would_fetch`). Each header is read once and each file hashed at
    most once; the pair found comes back checked (:attr:`DrafterFound.pair`)."""
    models_dir = Path(models_dir)
    t = check_pair(target).target  # a target at all: one line for a drafter or other file passed as --model
    target = t.path
    geom = t.geometry()
    size = identify_size(geom)
    recipes = drafter_recipes(size.name, Path(recipes_dir) if recipes_dir else None)
    from gguf_exact.rebuild.with_head import can_convert, converted_path, fetch_drafter_with_head

    for r in recipes:
        path = converted_path(r, models_dir)
        if path.is_file():
            try:
                pair = _pair(t, read_model(path, "drafter"))
            except GgufExactError:
                continue
            if isinstance(pair, ServePair):
                how = f"recipe {r.name}'s drafter, converted with its ordered-embedding head, in {path.parent}/"
                return DrafterFound(path, how, size, pair=pair)
    for r in recipes:
        path, sha = _published_path(r, models_dir)
        if path.is_file():
            digest = sha256_file(path) if sha is not None else None
            if sha is not None and digest != sha:
                continue  # not the pinned file: `fetch` replaces it
            try:
                candidate = replace(read_model(path, "drafter"), digest=digest)
            except GgufExactError:
                continue
            pair = _pair(t, candidate)
            if isinstance(pair, ServePair):
                pinned = ", sha256 as pinned" if sha else ""
                return DrafterFound(path, f"recipe {r.name}'s exact drafter in {models_dir}/{pinned}", size, pair=pair)
    for candidate in _local_candidates(target, models_dir, geom.n_embd):
        pair = _pair(t, candidate)
        if isinstance(pair, ServePair):
            where = candidate.path.parent
            return DrafterFound(
                candidate.path, f"a gemma4-assistant GGUF for this target, found in {where}/", size, pair=pair
            )
    if fetch and recipes and dry_run:
        r = recipes[0]
        if can_convert(r):
            path = converted_path(r, models_dir)
            how = (
                f"recipe {r.name}: its checkpoint would be fetched (pinned, sha256 checked) and converted to {path} "
                "with its ordered-embedding head; a dry run downloads nothing"
            )
        else:
            path, _ = _published_path(r, models_dir)
            how = f"recipe {r.name}: would be fetched to {path} (pinned, sha256 checked); a dry run downloads nothing"
        return DrafterFound(None, how, size, would_fetch=path, pair=ServePair(t, None))
    if fetch and recipes:
        from gguf_exact.hub.fetch import fetch_recipe

        for r in recipes:
            if can_convert(r):  # as `gguf-exact fetch` does: the checkpoint, converted with its head
                done = fetch_drafter_with_head(r, models_dir, config, download_progress=progress)
                path, digest = done.path, done.convert.sha256
                how = f"recipe {r.name}: its checkpoint fetched (size and sha256 checked) and converted here, "
                how += "with its ordered-embedding head" if done.has_head else "without a head (its config has none)"
            else:
                got = fetch_recipe(r, "exact", models_dir, config, progress)
                path, digest = got[0].path, got[0].file.sha256
                how = f"recipe {r.name}: {got[0].how}, size and sha256 checked; {got[0].file.pinned}"
            try:
                fetched: ModelFile | Path = replace(read_model(path, "drafter"), digest=digest)  # hashed: not again
            except GgufExactError:
                fetched = path  # check_pair names what is wrong with it
            pair = _pair(t, fetched)
            if not isinstance(pair, ServePair):
                raise PairError(
                    f"recipe {r.name}: fetched {path}, but it does not serve beside {target}: ", *pair.parts
                )
            return DrafterFound(path, how, size, pair=pair)
    raise InputError(*no_drafter_message(target, size, recipes, models_dir, fetch))


def no_drafter_message(target: Path, size: SizeMatch, recipes: list, models_dir: Path, fetched: bool) -> tuple:
    """The one line said when no drafter is found, why and the ways on, as
    :class:`~gguf_exact.errors.GgufExactError` parts."""
    where = f"no MTP drafter for {target} ({size.label}) in {models_dir}/ or beside it"
    draft = ("pass ", Param("draft"), " FILE")
    alone = (", or serve the target alone with ", Param("no_draft", api="no_draft=True"))
    if recipes:
        names = ", ".join(r.name for r in recipes)
        return (
            f"{where}; fetch it with ",
            Param("fetch", api="fetch=True"),
            f" (recipe {names}, pinned and hash-checked) or `gguf-exact fetch {recipes[0].name}`, ",
            *draft,
            *alone,
        )
    if size.name is not None:
        return (
            f"{where}; no recipe in convert/ makes one for {size.name}: convert one with `gguf-exact convert` and ",
            *draft,
            *alone,
        )
    return (f"{where}; no recipe can fetch one for it: ", *draft, *alone)


def resolve_drafter(
    target: str | Path | ModelFile,
    draft: str | Path | ModelFile | None,
    no_draft: bool = False,
    models_dir: str | Path = "models",
    fetch: bool = False,
    default_auto: bool = True,
    config=None,
    dry_run: bool = False,
) -> DrafterFound:
    """What ``--draft``/``--no-draft``/``--fetch-draft`` mean, for every command: a path
    is used as given; ``auto`` (or nothing, where ``default_auto``) searches; ``--no-draft``
    serves the target alone. The target is checked (:func:`check_pair`) by the search, by
    ``serve``'s plan and by the engine before anything loads."""
    if no_draft:
        if draft is not None and str(draft) != AUTO:
            raise ArgumentError("give ", Param("draft"), " FILE or ", Param("no_draft"), ", not both")
        return DrafterFound(None, Message(Param("no_draft", api="no_draft=True"), ": the target alone"))
    if draft is not None and str(draft) != AUTO:
        if fetch:
            raise ArgumentError(
                Param("fetch", api="fetch=True"),
                " looks for the drafter itself: give it without ",
                Param("draft"),
                " FILE",
            )
        return DrafterFound(draft.path if isinstance(draft, ModelFile) else Path(draft), "given as a file", given=True)
    if draft is None and not default_auto and not fetch:
        return DrafterFound(None, Message("no ", Param("draft"), ": the target alone"))
    return find_drafter(target, models_dir, fetch, config=config, dry_run=dry_run)


__all__ = [
    "AUTO",
    "DrafterFound",
    "RECIPES_ENV",
    "SizeMatch",
    "drafter_recipes",
    "find_drafter",
    "identify_size",
    "no_drafter_message",
    "resolve_drafter",
]
