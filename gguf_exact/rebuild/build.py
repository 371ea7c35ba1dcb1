"""``gguf-exact build``: rebuild a recipe's exact drafter from its pinned source and tell
how it compares with the published file: ``reproduced``, ``same levels`` or ``differs``
(:mod:`.outcome`).

Steps: fetch the ``[source]`` files at their pinned commit (verified), fetch the
``[target]`` GGUF for the vocabulary unless a path is given, convert with
:func:`gguf_exact.convert_drafter` (which verifies the written file against the
source; without the ordered-embedding head, as the published files are made), then compare the output's sha256 with the ``[exact]`` file's pinned sha256.
When they differ, the published file is fetched (verified against its pin) and
compared block by block. The output is kept either way, so it can be inspected.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gguf_exact.drafter.convert import ConvertResult, convert_drafter
from gguf_exact.errors import ArgumentError, HubError, Param
from gguf_exact.formats.paths import check_not_input, one_command, reads, same_file
from gguf_exact.formats.safe_write import output_folder
from gguf_exact.hub import checksums
from gguf_exact.hub.fetch import Fetched, fetch_recipe, part_dir, pinned_files
from gguf_exact.hub.recipes import Recipe
from gguf_exact.hub.session import HubConfig
from gguf_exact.rebuild.outcome import REPRODUCED, Outcome, compare_with_published


@dataclass
class BuildResult:
    recipe: Recipe
    output: Path
    sha256: str
    published: str | None  # the [exact] file's path in the checksum file
    published_sha256: str | None
    sources: list[Fetched]
    vocab_from: Path
    convert: ConvertResult
    outcome: Outcome | None  # None when the recipe pins no published file to compare with


@one_command()
def build_recipe(
    recipe: Recipe,
    models_dir: str | Path,
    out_dir: str | Path,
    vocab_from: str | Path | None = None,
    config: HubConfig | None = None,
    progress: Callable[[str], None] | None = None,
    download_progress: bool = True,
) -> BuildResult:
    """Fetch, convert and verify ``recipe``'s drafter into ``out_dir/<output>``, and
    compare its sha256 with the published exact file's."""
    if recipe.kind != "drafter":
        raise HubError(
            f'{recipe.path}: recipe {recipe.name} is a {recipe.kind}; `build` makes drafters (kind = "drafter") only'
        )
    config = config or HubConfig.from_env()
    reads(recipe.path, "recipe")
    pins = checksums.read(recipe.checksums)
    out = Path(out_dir) / recipe.output
    check_not_input(out, {Param("vocab_from"): vocab_from})  # before anything is downloaded
    published = None
    if "exact" in recipe.parts:
        files = pinned_files(recipe, "exact", pins)
        if len(files) != 1:
            raise HubError(
                f"{recipe.path}: the exact section must name one GGUF to compare the build with; it names {len(files)}"
            )
        published = files[0]
        fetched_at = part_dir(models_dir, recipe.part("exact")) / published.filename
        if same_file(out, fetched_at):
            raise ArgumentError(
                Param("out_dir"),
                f" {out_dir}: the build would be written at {out}, where the published file it is compared with "
                "is fetched; build into another folder",
            )
    pinned_files(recipe, "source", pins)  # every pin is checked before anything is downloaded
    if vocab_from is None:
        if "target" not in recipe.parts:
            raise HubError(
                f"{recipe.path}: no target section names the target GGUF; pass ", Param("vocab_from"), " TARGET.gguf"
            )
        pinned_files(recipe, "target", pins)
    sources = fetch_recipe(recipe, "source", models_dir, config, download_progress)
    if vocab_from is None:
        vocab_from = fetch_recipe(recipe, "target", models_dir, config, download_progress)[0].path
    out_dir = Path(out_dir)
    output_folder(out_dir)
    source_dir = part_dir(models_dir, recipe.part("source"))
    # the published exact drafters carry no ordered-embedding head (made as upstream's converter
    # makes them): the rebuild drops it too, or it could never reproduce them
    result = convert_drafter(source_dir, out_dir / recipe.output, vocab_from, progress=progress, ordered_head=False)
    outcome = None
    if published is not None and result.sha256 == published.sha256:
        outcome = Outcome(REPRODUCED, result.path, part_dir(models_dir, recipe.part("exact")) / published.filename)
    elif published is not None:
        fetched = fetch_recipe(recipe, "exact", models_dir, config, download_progress)[0]
        outcome = compare_with_published(result.path, fetched.path, source_dir)
    return BuildResult(
        recipe,
        result.path,
        result.sha256,
        published.path if published else None,
        published.sha256 if published else None,
        sources,
        Path(vocab_from),
        result,
        outcome,
    )
