"""``tune``: the draft settings measured on this machine, the best kept in a profile of its own."""

from __future__ import annotations

from pathlib import Path

import click

from gguf_exact.cli import console
from gguf_exact.cli.app import main
from gguf_exact.cli.console import note, say_fitted, say_markdown
from gguf_exact.cli.options import (
    CommaList,
    drafter_from_options,
    n_max_list_option,
    out_dir_option,
    profile_line,
    profile_option,
    prompts_option,
    results_dir,
    server_bin_option,
    target_and_draft_options,
)
from gguf_exact.errors import MeasurementError


@main.command()
@target_and_draft_options(auto=True, no_draft=False)
@profile_option(lead="The profile to start from: ")
@click.option(
    "--as",
    "save_as",
    metavar="NAME",
    help="The name to save the tuned profile under (default: PROFILE-tuned, e.g. cpu-tuned). "
    "Naming a profile shipped with gguf-exact (cpu, rtx3050, ...) replaces it for every later serve.",
)
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a profile value while measuring."
)
@n_max_list_option("Comma-separated fixed draft lengths to try (the adaptive policy off).", "1,2,3,4")
@click.option(
    "--bounds",
    type=CommaList(int, "4,6"),
    default="4,6",
    show_default=True,
    help="Comma-separated n-max bounds of the adaptive draft length to try ('' for fixed lengths only).",
)
@click.option(
    "--p-min",
    "p_mins",
    type=CommaList(float, "0,0.5,0.9"),
    default="0,0.5,0.9",
    show_default=True,
    help="With each bound, these drafter confidences below which a draft stops (spec-draft-p-min).",
)
@prompts_option
@click.option("--n-predict", default=64, show_default=True, help="Tokens per prompt and run.")
@click.option("--rounds", default=1, show_default=True, help="Rounds; each visits the arms forward then backward.")
@server_bin_option
@out_dir_option("tune", "bench.json and bench.md of the measurement")
@click.option("--no-write", is_flag=True, help="Measure and print; write no profile.")
@click.option(
    "--max-spread",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
    help="The most noise tune ranks settings with: when the same request's tokens/s ratio between two arms "
    "spreads more than this either side of its middle (0.5: +-50%), it prints the table, writes no profile and "
    "exits 1.",
)
def tune(
    target: Path,
    drafter: str | None,
    fetch_draft: bool,
    models_dir: Path,
    profile: str,
    save_as: str | None,
    overrides: tuple[str, ...],
    n_values: list[int],
    bounds: list[int],
    p_mins: list[float],
    prompt_names: list[str] | None,
    n_predict: int,
    rounds: int,
    server_bin: Path | None,
    out_dir: Path | None,
    no_write: bool,
    max_spread: float,
) -> None:
    """Measure the draft settings on this machine; keep the best in a profile of its own.

    Starts llama-server with the profile once per arm (the target alone, the fixed
    lengths n-max 1, 2, 3, 4, then the adaptive draft length at each --bounds
    bound with each --p-min; one server at a time, arms forward then backward),
    runs the shipped prompts against each and prints the table, the best fixed
    length and what the adaptive default gives beside it. Its servers' run folders
    are temporary: `status` never shows them. The kept setting (adaptive unless
    a fixed length is faster beyond the noise) goes into a copy
    of the profile named PROFILE-tuned (cpu-tuned, rtx3050-tuned; --as NAME for
    another) in the user's profile folder ($GGUF_EXACT_PROFILES, else
    ~/.config/gguf-exact/profiles), the measurement in a comment at its top:
    serve with `--profile cpu-tuned`. The profiles shipped with gguf-exact (and
    what --profile auto picks) stay as they are unless --as names one. Delete
    the copy to go back.
    """
    from gguf_exact.bench.tune import TuneRequest, kept_line, tune_profile, tuned_name
    from gguf_exact.engines.shared.profile_choice import resolve_profile

    prof, choice = resolve_profile(profile)
    name = tuned_name(prof, save_as)  # a bad --as stops here, before any measuring
    found = drafter_from_options(target, drafter, False, fetch_draft, models_dir, auto=True)
    request = TuneRequest(
        target, found.path, prof, profile, tuple(n_values), tuple(bounds), tuple(p_mins),
        tuple(prompt_names) if prompt_names else None, n_predict, rounds, tuple(overrides), server_bin, save_as,
        max_spread,
    )  # fmt: skip
    if not found.given:
        note(f"drafter {found.path} ({found.how})")
    note(profile_line(prof, choice))
    with console.status("tune: measuring") as step:  # minutes: name the arm and round under way
        tuned = tune_profile(request, out_dir or results_dir("tune"), not no_write, console.progress_lines(), step)
    result = tuned.result
    say_markdown(result.report.markdown())
    if result.noisy is not None:  # its ratios and picks would be the noise's, not the settings'
        say_fitted("wrote " + ", ".join(str(p) for p in tuned.report_files.values()))
        raise MeasurementError(result.noisy)
    base = result.target_tokens_per_second
    vs = f"; the target alone {base:.1f} tokens/s" if base else ""
    say_fitted(
        f"best fixed length: n-max {result.best_n_max} at {result.best_tokens_per_second:.1f} tokens/s (median run){vs}"
    )
    if (a := result.adaptive) is not None:
        say_fitted(
            f"adaptive default ({a.default.describe()}): {a.default_tokens_per_second:.1f} tokens/s, "
            f"{a.default_vs_fixed:.2f}x the best fixed length (median ratio of the same requests)"
        )
        if a.best != a.default:
            say_fitted(f"best adaptive: {a.best.describe()} at {a.best_tokens_per_second:.1f} tokens/s")
    if result.spread is not None:
        say_fitted(
            f"spread: +-{result.spread:.1%} (half the range of the tokens/s ratios of the same request on two arms); "
            "a gain within it does not count"
        )
    for line in result.notes:
        say_fitted(line)
    if base and result.best_tokens_per_second < base and not result.target_within_noise:
        console.out.print(
            "drafting is slower than the target alone on this machine (noisy if it is busy)", markup=False
        )
    say_fitted("wrote " + ", ".join(str(p) for p in tuned.report_files.values()))
    if tuned.profile_file is None:
        return
    dest = tuned.profile_file
    say_fitted(f"wrote {dest}: {kept_line(result.kept)}; serve with `--profile {name}`")
    if tuned.replaces_builtin:
        say_fitted(
            f"note: it replaces the {name} profile shipped with gguf-exact for every later serve, chat and "
            f"--profile auto; delete {dest} to go back"
        )
