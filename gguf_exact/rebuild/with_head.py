"""``gguf-exact fetch RECIPE`` (``--what drafter``): a drafter with its ordered-embedding head.

The published exact drafters carry no ordered-embedding head (issue 24), so the fast draft
step needs the checkpoint: this fetches the recipe's ``[source]`` checkpoint and its
published ``[exact]`` GGUF (both verified against their pins), and converts the checkpoint
here with its head, the published file lending its ``tokenizer.*`` keys (the target's, 59 MB
instead of the target's 3.3 GB). The output goes to ``MODELS_DIR/converted/<output>``, beside
the published file rather than over it, so every fetched file stays the pinned bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gguf_exact.drafter.convert import ConvertResult, convert_drafter
from gguf_exact.errors import GgufExactError, HubError
from gguf_exact.formats.paths import check_not_input, one_command, reads
from gguf_exact.formats.safe_write import output_folder
from gguf_exact.hub import checksums
from gguf_exact.hub.fetch import Fetched, fetch_recipe, part_dir, pinned_files
from gguf_exact.hub.recipes import Recipe
from gguf_exact.hub.session import HubConfig

CONVERTED = "converted"  # MODELS_DIR/converted/: drafters converted here, not fetched as they are
HEAD_TENSOR = "masked_embd_centroids.weight"


@dataclass
class DrafterWithHead:
    recipe: Recipe
    path: Path
    fetched: list[Fetched]  # the source's files, then the published GGUF
    convert: ConvertResult

    @property
    def has_head(self) -> bool:
        """The file carries the ordered head (the checkpoint's config uses one)."""
        return any(t.name == HEAD_TENSOR for t in self.convert.tensors)


def converted_path(recipe: Recipe, models_dir: str | Path) -> Path:
    """Where :func:`fetch_drafter_with_head` writes ``recipe``'s drafter."""
    return Path(models_dir) / CONVERTED / recipe.output


def can_convert(recipe: Recipe) -> bool:
    """``recipe`` is a drafter whose source and published file are both pinned: the default
    ``fetch`` converts it with its head; else it fetches the published file."""
    if recipe.kind != "drafter" or not {"source", "exact"} <= set(recipe.parts):
        return False
    try:
        pins = checksums.read(recipe.checksums)
        pinned_files(recipe, "source", pins)
        pinned_files(recipe, "exact", pins)
    except GgufExactError:  # a part not pinned yet: `fetch --what PART` says so when asked for
        return False
    return True


@one_command()
def fetch_drafter_with_head(
    recipe: Recipe,
    models_dir: str | Path,
    config: HubConfig | None = None,
    progress: Callable[[str], None] | None = None,
    download_progress: bool = True,
) -> DrafterWithHead:
    """Fetch ``recipe``'s source and published drafter (verified), convert the source with its
    ordered head (verified on write) to :func:`converted_path`, and return what was done."""
    if recipe.kind != "drafter":
        raise HubError(
            f'{recipe.path}: recipe {recipe.name} is a {recipe.kind}; only drafters (kind = "drafter") are converted'
        )
    config = config or HubConfig.from_env()
    reads(recipe.path, "recipe")
    pins = checksums.read(recipe.checksums)
    pinned_files(recipe, "source", pins)  # every pin checked before anything is downloaded
    pinned_files(recipe, "exact", pins)
    out = converted_path(recipe, models_dir)
    check_not_input(out)
    sources = fetch_recipe(recipe, "source", models_dir, config, download_progress)
    published = fetch_recipe(recipe, "exact", models_dir, config, download_progress)
    source_dir = part_dir(models_dir, recipe.part("source"))
    output_folder(out.parent)
    result = convert_drafter(source_dir, out, published[0].path, progress=progress)
    return DrafterWithHead(recipe, result.path, sources + published, result)


__all__ = ["CONVERTED", "DrafterWithHead", "can_convert", "converted_path", "fetch_drafter_with_head"]
