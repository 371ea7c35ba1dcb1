"""The ``publish`` command: a release folder (the file and its model card), uploaded to the Hub."""

from __future__ import annotations

from pathlib import Path

import click

from gguf_exact.cli.app import main
from gguf_exact.cli.console import say

PATH = click.Path(path_type=Path)


@main.command()
@click.argument("gguf_path", type=PATH)
@click.option("--repo", required=True, help="The Hub repo to publish to, OWNER/NAME.")
@click.option("--source", required=True, type=PATH, help="The QAT checkpoint (HF folder) the file was made from.")
@click.option("--donor", type=PATH, help="Re-packed files: the donor GGUF given to repack.")
@click.option("--vocab-from", "vocab_from", type=PATH, help="Drafters: the target GGUF given to convert.")
@click.option("--out", type=PATH, help="The release folder (default: the repo's name, here).")
@click.option(
    "--quality", "quality_json", type=PATH, help="The output of `gguf-exact quality ... --json`, for the card."
)
@click.option(
    "--base-model", help="The source's Hub repo as OWNER/NAME@REVISION (default: read from a Hub cache snapshot path)."
)
@click.option("--license", "license_id", help="The card's license (default: the source README.md's).")
@click.option("--quantized-by", help="Who made the file (default: the repo's owner).")
@click.option("--dry-run", is_flag=True, help="Write the release folder; upload nothing.")
def publish(
    gguf_path: Path,
    repo: str,
    source: Path,
    donor: Path | None,
    vocab_from: Path | None,
    out: Path | None,
    quality_json: Path | None,
    base_model: str | None,
    license_id: str | None,
    quantized_by: str | None,
    dry_run: bool,
) -> None:
    """Publish a verified GGUF: a release folder with a model card, uploaded in one commit.

    Verifies GGUF_PATH against its source (with --donor or --vocab-from; a file that
    does not pass is not published), writes the release folder: the file and a
    README.md with Hugging Face front matter (license, base_model, tags,
    quantized_by, library_name), the sha256 and size, the source repo and revision,
    the exactness per kind of tensor, the quality table (--quality), and the commands
    that reproduce and check the file; then creates the repo and uploads the folder
    in one commit through huggingface_hub, unless --dry-run.
    """
    from gguf_exact.publish.release import PublishRequest, publish_release

    request = PublishRequest(
        gguf_path, repo, source, donor=donor, vocab_from=vocab_from, out=out, quality=quality_json,
        base_model=base_model, license=license_id, quantized_by=quantized_by, dry_run=dry_run,
    )  # fmt: skip
    r = publish_release(request)
    say(f"release folder {r.folder}: {r.file.name} ({r.size:,} bytes, sha256 {r.sha256}), {r.card.name}")
    if r.uploaded is None:
        say("dry run: nothing uploaded")
    else:
        say(f"uploaded to {r.uploaded.repo} at commit {r.uploaded.commit}: {r.uploaded.url}")
