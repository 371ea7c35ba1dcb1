"""Recipe commands: ``recipes``, ``fetch``, ``build`` and ``pin`` (pinned files from the Hugging Face Hub)."""

from __future__ import annotations

from pathlib import Path

import click

from gguf_exact.cli.app import main
from gguf_exact.cli.console import note, say, say_fitted
from gguf_exact.cli.options import models_dir_option
from gguf_exact.errors import HubError, NotExactError


@main.command("recipes")
@models_dir_option
def recipes_command(models_dir: Path) -> None:
    """List the recipes `fetch`, `pin` and `build` know, and what is pinned, file by file.

    Per recipe: what it makes, its parts (exact: the published GGUF; source: the
    checkpoint; target: the GGUF whose vocabulary a drafter copies), each with its
    repository and whether `fetch RECIPE --what PART` can run or `pin` must come
    first; per file its pinned commit, sha256 and size, and whether a file is present
    in --models-dir (`fetch --dry-run` verifies it). Recipes are read from
    $GGUF_EXACT_RECIPES, ~/.config/gguf-exact/recipes, then the ones shipped with gguf-exact.
    """
    from gguf_exact.hub.fetch import pin_state
    from gguf_exact.hub.plan import file_pins
    from gguf_exact.hub.recipes import all_recipes

    found = all_recipes()
    if not found:
        raise HubError("no recipes found; write one as convert/<name>.toml (docs/recipes.md)")
    for r in found:
        what = f"drafter for {r.size} targets" if r.kind == "drafter" and r.size else r.kind
        say_fitted(f"{r.name}  ({what}) {r.description}")
        files = file_pins(r, models_dir)
        for role, part in r.parts.items():
            say_fitted(f"  {role:<7} {part.repo}")
            say_fitted(f"  {'':<7} {pin_state(r, role)}")
            for f in (f for f in files if f.role == role):
                say_fitted(
                    f"    {f.path[len(part.repo) + 1 :]}: {_size_words(f.size)}, {'present' if f.present else 'absent'}"
                )
                commit = f"commit {f.commit[:12]} pinned" if f.commit else f"commit not pinned ({f.revision})"
                sha = f"sha256 {f.sha256[:12]} pinned" if f.sha256 else "sha256 not pinned"
                say_fitted(f"      {commit}, {sha}")
        say_fitted(f"  file    {r.path}")


def _size_words(size: int | None) -> str:
    return "size not pinned" if size is None else f"{size:,} bytes"


@main.command()
@click.argument("recipe")
@models_dir_option
@click.option(
    "--what",
    type=click.Choice(["drafter", "exact", "source", "target"]),
    default=None,
    help="drafter: the checkpoint converted here with its ordered-embedding head (the default for a "
    "drafter recipe whose source is pinned); exact: the published exact GGUF (the default otherwise); "
    "source: the checkpoint; target: the target GGUF (vocabulary).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say what would be downloaded, from which commit, to where and how big, and what is already "
    "there and verified; download nothing.",
)
def fetch(recipe: str, models_dir: Path, what: str | None, dry_run: bool) -> None:
    """Download the files a recipe pins, each checked against its size and sha256.

    RECIPE is a name from `gguf-exact recipes` (e.g. e2b-assistant) or a path to a
    .toml file. For a drafter whose checkpoint is pinned, the default (--what drafter)
    fetches the checkpoint and the published exact GGUF and converts the checkpoint
    here, with its ordered-embedding head (the fast draft step), to
    MODELS_DIR/converted/; --what exact gets the published exact GGUF alone (no head),
    source the checkpoint, target the GGUF whose vocabulary a drafter copies; a part whose files
    are not pinned yet needs `gguf-exact pin RECIPE --what PART` first. The files come
    from the commit pinned in checksums/RECIPE.sha256 (where no commit is pinned, from
    the recipe's revision, refused unless the sha256 is the pinned one), through
    huggingface_hub and its cache (HF_HUB_CACHE). The size is checked before the
    sha256; a file that differs is refused and nothing is left at its final path; an
    interrupted download resumes on the next run; HF_HUB_OFFLINE=1 uses the cache only.
    Private or gated repos need `hf auth login` or HF_TOKEN.
    """
    from gguf_exact.hub.fetch import fetch_recipe
    from gguf_exact.hub.recipes import load_recipe
    from gguf_exact.rebuild.with_head import can_convert

    r = load_recipe(recipe)
    headless = what is None and r.kind == "drafter" and not can_convert(r)
    if what is None:
        what = "exact" if headless or r.kind != "drafter" else "drafter"
    if what == "drafter":
        return _drafter_with_head(r, models_dir, dry_run)
    if dry_run:
        return _dry_run(r, what, models_dir)
    got = fetch_recipe(r, what, models_dir)
    for f in got:
        say_fitted(f"{f.path}")
        say_fitted(f"  {f.how}, {f.size:,} bytes" + (f", commit {f.commit}" if f.commit else ""))
    say_fitted(f"verified: size and sha256 as pinned in {r.checksums}; {got[0].file.pinned}")
    if headless:
        note(
            f"fetch {r.name}: the published drafter, without the ordered-embedding head; pin its checkpoint "
            f"(`gguf-exact pin {r.name} --what source`) and `fetch` converts it with the head"
        )


VALUE = " " * 8  # wrapped values stay in their column


def _drafter_with_head(r, models_dir: Path, dry_run: bool) -> None:
    from gguf_exact.rebuild.with_head import converted_path, fetch_drafter_with_head

    out = converted_path(r, models_dir)
    if dry_run:
        _dry_run(r, "source", models_dir)
        _dry_run(r, "exact", models_dir)
        say_fitted(f"then: converted here to {out}, with the checkpoint's ordered-embedding head")
        return
    done = fetch_drafter_with_head(r, models_dir)
    for f in done.fetched:
        say_fitted(f"{f.path}")
        say_fitted(f"  {f.how}, {f.size:,} bytes" + (f", commit {f.commit}" if f.commit else ""))
    say_fitted(f"verified: size and sha256 as pinned in {r.checksums}")
    head = "with its ordered-embedding head" if done.has_head else "its checkpoint has no ordered-embedding head"
    say_fitted(f"{done.path}")
    say_fitted(f"  converted here from the checkpoint, {head}; {done.convert.size:,} bytes, verified on write")


def _dry_run(r, what: str, models_dir: Path) -> None:
    from gguf_exact.cli.console import human_size
    from gguf_exact.hub.plan import IN_CACHE, IN_PLACE, plan_fetch

    plans = plan_fetch(r, what, models_dir)
    say_fitted(f"fetch {r.name} --what {what}, dry run: nothing is downloaded")
    for p in plans:
        f = p.file
        say_fitted(f.path)
        say_fitted(f"  pinned  {f.pinned}, {_size_words(f.size)}", VALUE)
        say_fitted(f"  to      {p.dest}", VALUE)
        if p.there:
            say_fitted(f"  there   {p.there}: fetch replaces it", VALUE)
        if p.state == IN_PLACE:
            say_fitted("  state   in place, verified (size, then sha256)")
        elif p.state == IN_CACHE:
            say_fitted("  state   in the Hub cache, verified: fetch links it into place")
        elif p.problem:
            say_fitted(f"  state   would stop: {p.problem}", VALUE)
        else:
            size = p.remote.size if p.remote and p.remote.size is not None else f.size
            how_big = f"{size:,} bytes ({human_size(size)})" if size is not None else "size unknown"
            commit = p.remote.commit if p.remote else f.commit
            say_fitted(f"  state   would download {how_big} from commit {commit}", VALUE)
    waiting = [p for p in plans if p.state not in (IN_PLACE, IN_CACHE)]
    stops = [p for p in waiting if p.problem]
    total = sum((p.remote.size if p.remote and p.remote.size else p.file.size) or 0 for p in waiting if not p.problem)
    say_fitted(
        f"dry run: {len(plans) - len(waiting)} of {len(plans)} files in place or cached, "
        f"{len(waiting) - len(stops)} to download ({total:,} bytes)"
    )
    if stops:
        raise HubError(f"fetch {r.name} --what {what} would stop at {len(stops)} of {len(plans)} files (above)")


@main.command()
@click.argument("recipe")
@models_dir_option
@click.option(
    "--out-dir",
    type=click.Path(path_type=Path),
    default=Path("build/drafters"),
    show_default=True,
    help="Where the rebuilt GGUF is written.",
)
@click.option(
    "--vocab-from",
    type=click.Path(path_type=Path),
    help="Target GGUF whose tokenizer.* keys are copied, instead of the recipe's [target] file.",
)
def build(recipe: str, models_dir: Path, out_dir: Path, vocab_from: Path | None) -> None:
    """Rebuild a recipe's exact drafter from its pinned source; compare it with the published file.

    Fetches the [source] checkpoint (and the [target] GGUF unless --vocab-from is
    given) at the pinned commit, verified; converts and verifies as `convert` does;
    then compares the output with the [exact] file. Four outcomes: "reproduced" (same
    sha256); "same levels" (every Q4_0 block holds the published file's levels, only
    scales differ, and every published block is as exact as the plan by verify's block
    rule); "same levels, less exact" (as above, but some published blocks are less
    exact: counted per tensor); or "differs" (the first differing tensor and block,
    exit 1). Both files' bit-exact share against the source is printed. A file made by
    another scale rule, such as the published method, comes out "same levels, less exact".
    """
    from gguf_exact.hub.recipes import load_recipe
    from gguf_exact.rebuild.build import build_recipe
    from gguf_exact.rebuild.outcome import LESS_EXACT, REPRODUCED, SAME_LEVELS

    r = load_recipe(recipe)
    res = build_recipe(r, models_dir, out_dir, vocab_from)
    t = res.convert.total
    pinned = res.sources[0].file.pinned
    say_fitted(
        f"source  {models_dir / r.part('source').repo} ({len(res.sources)} files, size and sha256 verified; {pinned})"
    )
    say_fitted(f"vocab   {res.vocab_from}")
    say_fitted(f"wrote   {res.output} ({res.convert.size:,} bytes; {t.exact:,} of {t.n_values:,} values bit-exact)")
    o = res.outcome
    if o is None:
        say_fitted(f"sha256 {res.sha256}; the recipe pins no published exact file to compare with")
        return
    if o.kind == REPRODUCED:
        say_fitted(f"reproduced: sha256 {res.sha256} is the published {res.published}")
        return
    say_fitted(f"built      {res.sha256}  {res.output}")
    say_fitted(f"published  {res.published_sha256}  {res.published}")
    if o.metadata_keys:
        say_fitted(f"metadata   {len(o.metadata_keys)} keys differ: {', '.join(o.metadata_keys[:6])}")
    if o.kind in (SAME_LEVELS, LESS_EXACT):
        for s in o.scales:
            less = f", {s.less_exact:,} less exact" if s.less_exact else ""
            say_fitted(f"  {s.name}: {s.as_exact:,} of {s.blocks:,} published blocks as exact as the plan{less}")
        say_fitted(
            f"{o.kind}: every Q4_0 block holds the published file's levels; "
            f"{o.other_scale_blocks:,} of {o.q4_0_blocks:,} blocks are stored with another scale"
            + (
                f", {o.less_exact_blocks:,} of them less exact than the plan"
                if o.kind == LESS_EXACT
                else ", none less exact than the plan"
            )
        )
        for who, e in (("built", o.built_exact), ("published", o.published_exact)):
            if e is not None:  # measured unless the files differ
                say_fitted(
                    f"bit-exact against the source, {who + ':':<10} {e.exact_fraction:.4%} ({e.exact:,} of {e.n_values:,} values)"
                )
        return
    raise NotExactError(
        f"{res.output}: not reproduced: differs from the published {res.published}: {o.difference}; "
        "compare them with `gguf-exact compare --source SRC A.gguf B.gguf`"
    )


@main.command()
@click.argument("recipe")
@click.option(
    "--revision",
    help="Pin this branch, tag or commit instead of the recipe's revision (one part: name it with --what).",
)
@click.option(
    "--what",
    type=click.Choice(["all", "source", "exact", "target"]),
    default="all",
    show_default=True,
    help="Which part of the recipe to pin.",
)
def pin(recipe: str, revision: str | None, what: str) -> None:
    """Resolve a recipe's revisions to commits and record each file's sha256.

    Reads the Hub's file metadata (model info with files_metadata): LFS files are not
    downloaded; small git files such as config.json are read, checked against their
    git id and size, and hashed. Names, commits and hashes in the Hub's answer are
    checked before use. Rewrites checksums/RECIPE.sha256 in a checkout of
    gguf-exact (commit it); an installed gguf-exact keeps its own files and writes
    ~/.config/gguf-exact/checksums/RECIPE.sha256 ($GGUF_EXACT_CHECKSUMS) instead,
    which fetch, build and serve then read first. Shows any sha256 that changed.
    """
    from gguf_exact.hub.checksums import CHECKSUMS_DIR, user_checksums_dir
    from gguf_exact.hub.pin import pin_recipe
    from gguf_exact.hub.recipes import load_recipe

    r = load_recipe(recipe)
    report = pin_recipe(r, None if what == "all" else [what], revision)
    for p in report.parts:
        say(f"[{p.role}] {p.pin.repo} revision {p.pin.revision} -> commit {p.pin.commit}")
        for e in p.entries:
            changed = f"  CHANGED, was {e.previous}" if e.previous not in (None, e.sha256) else ""
            say(f"  {e.sha256}  {e.path}  ({e.how}){changed}")
    say(f"wrote {report.checksums}")
    if report.checksums.parent == user_checksums_dir():
        say(
            f"(gguf-exact's own {CHECKSUMS_DIR / report.checksums.name} is not written here: "
            "fetch, build and serve read this copy first; delete it to go back)"
        )
