"""``gguf-exact tune``: measure n-max 1..4 on this machine and keep the best in a local profile.

llama-server fixes ``--spec-draft-n-max`` at start-up, so each arm is its own server,
started with the profile and ``spec-draft-n-max=N`` (:func:`.server.plan_launch`,
``start_server``) and measured over HTTP by the bench machinery
(:func:`gguf_exact.bench.run.bench_servers`: a warm-up request, then the
shipped prompts, timings from llama-server itself). One server runs at a time (a
small card holds one model), the arms in alternating order, each round forward then
backward (the target alone first and last), so slow drift of the machine falls on
every arm alike. The arm with the highest median tokens/s over its runs is the fastest;
a shorter n-max is kept instead when the fastest's gain over it is within the noise (half
the range of the tokens/s ratios of the same request on both arms), and the output says
when drafting's gain over the target alone is within the noise too (:func:`pick_setting`).

:func:`write_tuned_profile` copies the profile's file into the user's profile folder
(:func:`.profiles.user_profile_dir`: ``$GGUF_EXACT_PROFILES``, else
``~/.config/gguf-exact/profiles``) under a name of its own, ``<profile>-tuned``
(``cpu-tuned``; ``--as NAME`` picks another), with ``spec-draft-n-max`` set and the
measurement in a comment at the top; ``--profile cpu-tuned`` then serves with it. A
profile shipped with gguf-exact (``cpu``, ``rtx3050``, ...; what ``--profile auto``
picks) is shadowed only when ``--as`` names it. The project's ``serve/`` is never written.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gguf_exact.bench.report import TARGET, Arm, alternating_order
from gguf_exact.bench.request import ADAPTIVE_KEY, N_MAX_KEY, fixed_length
from gguf_exact.bench.run import BenchReport, bench_servers, summarize
from gguf_exact.errors import ArgumentError, InputError, NotExactError, Param
from gguf_exact.formats.paths import check_not_input
from gguf_exact.formats.safe_write import atomic_output, output_folder
from gguf_exact.runtime.profiles import PROFILE_DIR, Profile, load_profile, user_profile_dir

TUNED_MARK = "# tuned by gguf-exact tune"


@dataclass
class TuneResult:
    report: BenchReport
    best_n_max: int  # the setting kept: the shortest n-max within the noise of the fastest
    best_tokens_per_second: float
    target_tokens_per_second: float | None
    fastest_n_max: int | None = None  # the n-max with the highest median, kept or not
    spread: float | None = None  # the measurements' noise: a relative half-range (0.03: +-3%), see pick_setting
    target_within_noise: bool = False  # drafting's gain over the target alone is within the noise
    notes: tuple[str, ...] = ()  # what pick_setting kept and why, one line each


@dataclass(frozen=True)
class Pick:
    """What :func:`pick_setting` keeps."""

    n_max: int
    tokens_per_second: float
    fastest_n_max: int
    spread: float | None
    target_within_noise: bool
    notes: tuple[str, ...]


def _ratios(runs: list, a: str, b: str) -> list[float]:
    """tokens/s of arm ``a`` over arm ``b``, paired by (prompt, round): the same request on both."""
    of_b = {(r.prompt, r.round): r.tokens_per_second for r in runs if r.arm == b}
    return [
        r.tokens_per_second / of_b[(r.prompt, r.round)]
        for r in runs
        if r.arm == a and of_b.get((r.prompt, r.round), 0) > 0
    ]


def gain_and_noise(runs: list, a: str, b: str) -> tuple[float, float]:
    """How much faster arm ``a`` is than ``b`` (the median paired ratio, less 1) and the
    noise of that figure: half the range of the paired ratios (0 with fewer than two)."""
    ratios = _ratios(runs, a, b)
    if not ratios:
        return 0.0, 0.0
    noise = (max(ratios) - min(ratios)) / 2 if len(ratios) > 1 else 0.0
    return statistics.median(ratios) - 1.0, noise


def pick_setting(summary: list, runs: list) -> Pick:
    """The setting tune keeps: the fastest n-max by median run, unless a shorter one is
    within the noise of it (its gain no more than the spread of the paired measurements),
    then the shortest such; and whether drafting's gain over the target alone is within
    the noise too (then the target alone is as fast)."""
    drafting = sorted((s for s in summary if s.n_max), key=lambda s: s.n_max)
    fastest = max(drafting, key=lambda s: s.tokens_per_second_median)
    kept, notes, spread = fastest, [], None
    for s in drafting:
        if s.n_max >= fastest.n_max:
            break
        gain, noise = gain_and_noise(runs, fastest.label, s.label)
        spread = noise if spread is None else max(spread, noise)
        if gain <= noise:
            kept = s
            notes.append(
                f"kept n-max {s.n_max}, the simpler setting: n-max {fastest.n_max} is {gain:+.1%} faster, "
                f"within the noise (+-{noise:.1%})"
            )
            break
    within = False
    target = next((s for s in summary if s.label == TARGET), None)
    if target is not None:
        gain, noise = gain_and_noise(runs, kept.label, TARGET)
        spread = noise if spread is None else max(spread, noise)
        if gain <= noise:
            within = True
            notes.append(
                f"n-max {kept.n_max} is {gain:+.1%} against the target alone, within the noise (+-{noise:.1%}): "
                "the target alone (--no-draft) is as fast on this machine"
            )
    return Pick(int(kept.n_max), kept.tokens_per_second_median, int(fastest.n_max), spread, within, tuple(notes))


def tune_n_max(
    request: TuneRequest,
    prompts: dict[str, str] | None = None,
    with_target: bool = True,
    progress: Callable[[str], None] = lambda s: None,
) -> TuneResult:
    """Tokens/s of ``request.profile`` at each n-max in ``request.n_values`` (and the
    target alone when ``with_target``), one llama-server at a time; see the module doc."""
    target, drafter, profile, n_values = request.target, request.drafter, request.profile, request.n_values
    n_predict, rounds, overrides, server_bin = request.n_predict, request.rounds, request.overrides, request.server_bin
    from gguf_exact.bench.prompt_set import load_prompts
    from gguf_exact.engines.launch import plan_launch, start_server
    from gguf_exact.engines.process import free_port, scratch_run_root
    from gguf_exact.engines.settings import ServeSettings
    from gguf_exact.engines.status import stop_server

    if not n_values or any(n < 1 for n in n_values):
        raise ArgumentError(Param("n_values"), f" {','.join(map(str, n_values))}: give draft lengths of 1 or more")
    prompts = prompts or load_prompts()
    arms = ([Arm(TARGET, 0)] if with_target else []) + [Arm(f"n_max={n}", n) for n in n_values]
    runs = []
    with scratch_run_root("tune") as root:  # its servers' run folders: not the user's, removed after
        for order, (rnd, arm) in enumerate(alternating_order(arms, rounds)):
            sets = list(overrides) + fixed_length(arm.n_max)
            launch = plan_launch(
                ServeSettings(
                    target,
                    drafter if arm.n_max else None,
                    profile,
                    tuple(sets),
                    port=free_port(),
                    server_bin=server_bin,
                    runs=root,
                )
            )
            start_server(launch, detach=True, timeout=600)
            try:
                one = bench_servers([Arm(arm.label, arm.n_max, launch.url)], prompts, n_predict, rounds=1)
            finally:
                stop_server(launch.port, root)
            for r in one.runs:
                r.round, r.order = rnd, order
            runs += one.runs
            progress(f"round {rnd + 1}/{rounds}: {arm.label}")
    summary = summarize(arms, runs)
    for s in summary:
        s.mean_accepted_length = None  # llama-server does not report draft rounds
    drafting = [s for s in summary if s.n_max]
    silent = [s.label for s in drafting if s.acceptance_rate is None]
    if silent:
        raise InputError(
            f"profile {profile.name}: no draft tokens at {', '.join(silent)}: its [draft] table does not turn draft-mtp on "
            '(spec-type = "draft-mtp"), so there is no n-max to tune'
        )
    # the median run: one slow run (a page fault, another process) must not pick the winner;
    # a gain within the noise does not either (pick_setting)
    pick = pick_setting(summary, runs)
    base = next((s.tokens_per_second_median for s in summary if s.label == TARGET), None)
    meta = {
        "backend": "llama-server, one server per arm and visit",
        "prompts": list(prompts),
        "n_predict": n_predict,
        "rounds": rounds,
        "order": "each round: arms forward, then backward (A B B A), a fresh server per visit",
        "profile": str(profile.path or profile.name),
        "overrides": list(overrides),
        "model": str(target),
        "draft": str(drafter),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return TuneResult(
        BenchReport(meta, runs, summary),
        pick.n_max,
        pick.tokens_per_second,
        base,
        fastest_n_max=pick.fastest_n_max,
        spread=pick.spread,
        target_within_noise=pick.target_within_noise,
        notes=pick.notes,
    )


@dataclass(frozen=True)
class TuneRequest:
    """What to tune: a pair, the profile to start from, the arms and the prompts; and the
    name the tuned copy is saved under (:func:`tuned_name`)."""

    target: Path
    drafter: Path
    profile: Profile
    profile_arg: str  # the profile as the user named it ("auto", "cpu", a file): recorded in the command
    n_values: tuple[int, ...] = (1, 2, 3, 4)
    prompt_names: tuple[str, ...] | None = None  # None: every shipped prompt
    n_predict: int = 64
    rounds: int = 1
    overrides: tuple[str, ...] = ()
    server_bin: Path | None = None
    save_as: str | None = None

    @property
    def name(self) -> str:
        """The tuned profile's name; a bad ``save_as`` raises here, before any measuring."""
        return tuned_name(self.profile, self.save_as)

    @property
    def command(self) -> str:
        """The ``gguf-exact tune`` command that makes this request, for the tuned profile's header."""
        import shlex

        args = ["--model", str(self.target), "--draft", str(self.drafter), "--profile", self.profile_arg]
        args += ["--n-max", ",".join(map(str, self.n_values)), "--n-predict", str(self.n_predict)]
        args += ["--rounds", str(self.rounds)]
        args += ["--prompts", ",".join(self.prompt_names)] if self.prompt_names else []
        args += ["--as", self.save_as] if self.save_as else []
        return shlex.join(["gguf-exact", "tune", *args, *(a for o in self.overrides for a in ("--set", o))])


@dataclass
class Tuned:
    """What :func:`tune_profile` measured, wrote and saved."""

    request: TuneRequest
    result: TuneResult
    report_files: dict[str, Path]  # bench.json, bench.md
    profile_file: Path | None = None  # None: measured only
    replaces_builtin: bool = False  # the saved name is a profile shipped with gguf-exact


def tune_profile(
    request: TuneRequest, out_dir: Path, write: bool = True, progress: Callable[[str], None] = lambda s: None
) -> Tuned:
    """Measure ``request`` (:func:`tune_n_max`), write the measurement to ``out_dir`` and,
    with ``write``, save the best n-max as a profile of its own (:func:`write_tuned_profile`)."""
    from gguf_exact.bench.prompt_set import load_prompts

    name = request.name
    BenchReport.check_outputs(out_dir)  # before measuring: neither the report nor the profile is an input
    if write:
        check_not_input(tuned_destination(request.profile, None, name), profile_input(request.profile))
    prompts = load_prompts(list(request.prompt_names) if request.prompt_names is not None else None)
    result = tune_n_max(request, prompts, progress=progress)
    tuned = Tuned(request, result, result.report.write(out_dir, plot=False))
    if write:
        tuned.profile_file = write_tuned_profile(request.profile, result, request.command, name=name)
        tuned.replaces_builtin = shadows_builtin(name)
    return tuned


def set_n_max(toml_text: str, n_max: int, note: str = "", key_name: str = N_MAX_KEY) -> str:
    """``toml_text`` with ``spec-draft-n-max = n_max`` (or ``key_name = n_max``) in its
    ``[draft]`` table (the line replaced, else added under ``[draft]``, else a ``[draft]``
    table appended); every other line, comments included, kept."""
    lines = toml_text.splitlines()
    comment = f"  # {note}" if note else ""
    value = str(n_max).lower() if isinstance(n_max, bool) else n_max
    entry = f"{key_name} = {value}{comment}"
    header = re.compile(r"^\s*\[([^\]]+)\]\s*(#.*)?$")
    start = next((i for i, ln in enumerate(lines) if (m := header.match(ln)) and m.group(1).strip() == "draft"), None)
    if start is None:
        return "\n".join(lines).rstrip("\n") + f"\n\n[draft]\n{entry}\n"
    end = next((i for i in range(start + 1, len(lines)) if header.match(lines[i])), len(lines))
    key = re.compile(rf"^\s*{re.escape(key_name)}\s*=")
    for i in range(start + 1, end):
        if key.match(lines[i]):
            lines[i] = entry
            break
    else:
        lines.insert(start + 1, entry)
    return "\n".join(lines) + "\n"


def tuned_header(result: TuneResult, command: str) -> list[str]:
    """The comment lines that say what was measured, by which command."""
    rows = ", ".join(
        f"{'target alone' if s.label == TARGET else f'n-max {s.n_max}'} {s.tokens_per_second_median:.1f}"
        for s in result.report.rows
    )
    return [
        f"{TUNED_MARK} on {result.report.meta['time']}: spec-draft-n-max = {result.best_n_max}",
        f"# median tokens/s on this machine: {rows}",
        f"# command: {command}",
    ]


TUNED_SUFFIX = "-tuned"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def tuned_name(base: Profile, save_as: str | None = None) -> str:
    """The name a tuned copy of ``base`` is written under: ``save_as``, else ``<base>-tuned``
    (``cpu`` -> ``cpu-tuned``; a tuned profile tuned again keeps its name), so the
    profiles shipped with gguf-exact are never shadowed unless a name says so."""
    if save_as is None:
        return base.name if base.name.endswith(TUNED_SUFFIX) else base.name + TUNED_SUFFIX
    if not _NAME.fullmatch(save_as) or save_as.endswith(".toml"):
        raise ArgumentError(
            Param("save_as"),
            f" {save_as!r}: a profile name is letters, digits, '.', '_' and '-' (no .toml), e.g. cpu-tuned",
        )
    return save_as


def shadows_builtin(name: str) -> bool:
    """True when ``name`` is one of the profiles shipped with gguf-exact (``serve/NAME.toml``)."""
    return (PROFILE_DIR / f"{name}.toml").is_file()


def tuned_destination(base: Profile, folder: Path | None = None, name: str | None = None) -> Path:
    """Where :func:`write_tuned_profile` writes: ``folder/<name>.toml``, never the project's serve/."""
    folder = Path(folder or user_profile_dir()).expanduser()
    if folder.resolve() == PROFILE_DIR.resolve():
        raise ArgumentError(
            f"{folder}: tune writes user copies, never the project's serve/; set GGUF_EXACT_PROFILES to another folder"
        )
    if base.path is None:
        raise InputError(f"profile {base.name}: no file to copy")
    return folder / f"{tuned_name(base, name)}.toml"


def profile_input(base: Profile) -> dict[str, Path | None]:
    """``base`` as an input the tuned profile must not be, unless tune wrote it (its first
    line is tune's mark): such a copy is tune's own, updated in place."""
    lines = base.path.read_text().splitlines()[:1] if base.path is not None else []
    return {} if lines and lines[0].startswith(TUNED_MARK) else {"profile": base.path}


def write_tuned_profile(
    base: Profile, result: TuneResult, command: str, folder: Path | None = None, name: str | None = None
) -> Path:
    """Write ``base`` with the best n-max to ``folder/<name>.toml`` (default: the user's
    profile folder, ``<base>-tuned``, see :func:`tuned_name`) and read it back; the
    project's ``serve/`` is refused."""
    dest = tuned_destination(base, folder, name)
    body = base.path.read_text().splitlines()
    if body and body[0].startswith(TUNED_MARK):  # a copy tuned before: its header is replaced
        body = body[len(tuned_header(result, command)) :]
    new = set_n_max("\n".join(tuned_header(result, command) + body), result.best_n_max, "measured by gguf-exact tune")
    if base.draft.get(ADAPTIVE_KEY):  # the measured fixed length, not an adaptive one bounded by it
        new = set_n_max(new, False, "tune measured fixed lengths", ADAPTIVE_KEY)
    output_folder(dest.parent)
    with atomic_output(dest, inputs=profile_input(base)) as tmp:
        tmp.write_text(new)
        written = load_profile(tmp)
        if written.draft.get(N_MAX_KEY) != result.best_n_max:
            raise NotExactError(
                f"{dest}: written with {N_MAX_KEY} = {written.draft.get(N_MAX_KEY)!r}, expected {result.best_n_max}"
            )
    return dest


__all__ = [
    "N_MAX_KEY",
    "Pick",
    "TuneRequest",
    "TuneResult",
    "Tuned",
    "set_n_max",
    "shadows_builtin",
    "gain_and_noise",
    "pick_setting",
    "tune_n_max",
    "tune_profile",
    "tuned_destination",
    "tuned_header",
    "tuned_name",
    "write_tuned_profile",
]
