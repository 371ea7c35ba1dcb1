"""``gguf-exact tune``: measure the draft settings on this machine and keep the best in a local profile.

It measures the fixed lengths (n-max 1..4, the adaptive policy off), the adaptive policy's
settings (each n-max bound of ``bounds`` with each drafter-confidence floor of ``p_mins``:
``spec-draft-adaptive = true``, ``spec-draft-n-max``, ``spec-draft-p-min``) and the target
alone. llama-server fixes these at start-up, so each arm is its own server, started with the
profile and the arm's overrides (:func:`.server.plan_launch`, ``start_server``) and measured
over HTTP by the bench machinery (:func:`gguf_exact.bench.run.bench_servers`: a warm-up
request, then the shipped prompts, timings from llama-server itself). One server runs at a
time (a small card holds one model), the arms in alternating order, each round forward then
backward (the target alone first and last), so slow drift of the machine falls on every arm
alike. The choices (:mod:`.tune_pick`): the best fixed length by median run, a shorter one
when the gain is within the noise; the best adaptive setting, the default (the profile's
bound, p-min 0) unless another is faster beyond the noise; and adaptive is kept unless the
best fixed length is faster beyond the noise. The output says what the adaptive default
gives beside the best fixed length.

:func:`write_tuned_profile` copies the profile's file into the user's profile folder
(:func:`.profiles.user_profile_dir`: ``$GGUF_EXACT_PROFILES``, else
``~/.config/gguf-exact/profiles``) under a name of its own, ``<profile>-tuned``
(``cpu-tuned``; ``--as NAME`` picks another), with the kept setting and the measurement in
a comment at the top; ``--profile cpu-tuned`` then serves with it. A profile shipped with
gguf-exact (``cpu``, ``rtx3050``, ...; what ``--profile auto`` picks) is shadowed only when
``--as`` names it. The project's ``serve/`` is never written.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gguf_exact.bench.report import TARGET, Arm, alternating_order
from gguf_exact.bench.request import ADAPTIVE_KEY, N_MAX_KEY, P_MIN_KEY
from gguf_exact.bench.run import BenchReport, bench_servers, summarize
from gguf_exact.bench.tune_pick import TOO_NOISY, AdaptivePick, Setting, pick_adaptive, pick_setting, too_noisy
from gguf_exact.engines.shared.draft_policy import PolicySettings
from gguf_exact.engines.shared.knobs import BY_KEY
from gguf_exact.engines.shared.profiles import PROFILE_DIR, Profile, load_profile, user_profile_dir
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.errors import ArgumentError, InputError, NotExactError, Param
from gguf_exact.formats.paths import Inputs, check_not_input
from gguf_exact.formats.safe_write import atomic_output, output_folder, staged_outputs

TUNED_MARK = "# tuned by gguf-exact tune"


@dataclass
class TuneResult:
    report: BenchReport
    best_n_max: int  # the fixed length kept: the shortest n-max within the noise of the fastest
    best_tokens_per_second: float
    target_tokens_per_second: float | None
    fastest_n_max: int | None = None  # the n-max with the highest median, kept or not
    spread: float | None = None  # the measurements' noise: a relative half-range (0.03: +-3%), see pick_setting
    target_within_noise: bool = False  # drafting's gain over the target alone is within the noise
    notes: tuple[str, ...] = ()  # what the picks kept and why, one line each
    adaptive: AdaptivePick | None = None  # None: no adaptive setting measured
    max_spread: float = TOO_NOISY  # the most spread the picks are trusted with (TuneRequest.max_spread)

    @property
    def kept(self) -> Setting:
        """What the tuned profile serves: the adaptive pick's, else the best fixed length."""
        return self.adaptive.kept if self.adaptive is not None else Setting(self.best_n_max)

    @property
    def noisy(self) -> str | None:
        """Why these measurements cannot rank the settings (:func:`.tune_pick.too_noisy`), in
        one line that says what to do; None when they can."""
        if not too_noisy(self.spread, self.max_spread):
            return None
        return (
            f"the measurements are too noisy to rank the settings: the same request's tokens/s ratio between two "
            f"arms spread +-{self.spread:.0%}, over the +-{self.max_spread:.0%} tune trusts (--max-spread), so no "
            "profile was written; run tune again on an idle machine, with more --rounds and --n-predict"
        )


def default_adaptive(profile: Profile) -> Setting:
    """The adaptive setting the profile serves by default: its own n-max bound and p-min where
    it is adaptive, else the policy's defaults."""
    config, base = serving_config(profile, with_draft=True), PolicySettings()
    n_max = config.n_max if config.adaptive and config.options.n_max is not None else base.n_max
    return Setting(n_max, True, config.p_min)


def tune_settings(request: TuneRequest) -> tuple[list[Setting], Setting]:
    """The arms measured (the target alone, the fixed lengths, the adaptive settings, the
    default among them) and the default adaptive setting."""
    if not request.n_values or any(n < 1 for n in request.n_values):
        raise ArgumentError(
            Param("n_values"), f" {','.join(map(str, request.n_values))}: give draft lengths of 1 or more"
        )
    if any(n < 1 for n in request.bounds):
        raise ArgumentError(Param("bounds"), f" {','.join(map(str, request.bounds))}: give n-max bounds of 1 or more")
    if any(not 0 <= p <= 1 for p in request.p_mins):
        raise ArgumentError(
            Param("p_mins"), f" {','.join(f'{p:g}' for p in request.p_mins)}: give p-min values from 0 to 1"
        )
    default = default_adaptive(request.profile)
    adaptive = [Setting(b, True, p) for b in request.bounds for p in request.p_mins]
    if adaptive and default not in adaptive:
        adaptive.insert(0, default)
    return [Setting(0), *(Setting(n) for n in request.n_values), *adaptive], default


def tune_n_max(
    request: TuneRequest,
    prompts: dict[str, str] | None = None,
    with_target: bool = True,
    progress: Callable[[str], None] = lambda s: None,
    step: Callable[[str], None] = lambda s: None,
) -> TuneResult:
    """Tokens/s of ``request.profile`` at each setting of :func:`tune_settings` (the target
    alone only when ``with_target``), one llama-server at a time; see the module doc.
    ``progress`` gets a line after each visit of an arm, ``step`` the step under way before
    it starts (a visit's server loading, then its requests: seconds to minutes each)."""
    target, drafter, profile = request.target, request.drafter, request.profile
    n_predict, rounds, overrides, server_bin = request.n_predict, request.rounds, request.overrides, request.server_bin
    from gguf_exact.bench.prompt_set import load_prompts
    from gguf_exact.engines.launch import plan_launch, start_server
    from gguf_exact.engines.shared.process import free_port, scratch_run_root
    from gguf_exact.engines.shared.settings import ServeSettings
    from gguf_exact.engines.shared.status import stop_server

    settings, default = tune_settings(request)
    settings = [s for s in settings if s.n_max or with_target]
    by_label = {s.label: s for s in settings}
    prompts = prompts or load_prompts()
    arms = [Arm(s.label, s.n_max) for s in settings]
    runs = []
    with scratch_run_root("tune") as root:  # its servers' run folders: not the user's, removed after
        visits = alternating_order(arms, rounds)
        for order, (rnd, arm) in enumerate(visits):
            where = f"round {rnd + 1}/{rounds}, visit {order + 1} of {len(visits)}: {arm.label}"
            sets = list(overrides) + by_label[arm.label].overrides()
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
            step(f"{where}, starting llama-server")
            start_server(launch, detach=True, timeout=600)
            try:
                step(f"{where}, measuring {len(prompts)} prompts of {n_predict} tokens")
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
    silent = [s.label for s in summary if s.n_max and not by_label[s.label].adaptive and s.acceptance_rate is None]
    if silent:
        raise InputError(
            f"profile {profile.name}: no draft tokens at {', '.join(silent)}: its [draft] table does not turn draft-mtp on "
            '(spec-type = "draft-mtp"), so there is no n-max to tune'
        )
    # the median run: one slow run (a page fault, another process) must not pick the winner;
    # a gain within the noise does not either (tune_pick)
    pick = pick_setting(summary, runs)
    chosen = None
    if any(s.adaptive for s in settings):
        chosen = pick_adaptive(summary, runs, by_label, default, Setting(pick.n_max))
    base = next((s.tokens_per_second_median for s in summary if s.label == TARGET), None)
    meta = {
        "backend": "llama-server, one server per arm and visit",
        "prompts": list(prompts),
        "n_predict": n_predict,
        "rounds": rounds,
        "order": "each round: arms forward, then backward (A B B A), a fresh server per visit",
        "profile": str(profile.path or profile.name),
        "overrides": list(overrides),
        "settings": {s.label: s.overrides() for s in settings},
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
        notes=pick.notes + (chosen.notes if chosen else ()),
        adaptive=chosen,
        max_spread=request.max_spread,
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
    bounds: tuple[int, ...] = (4, 6)  # the adaptive policy's n-max bounds measured (none: fixed lengths only)
    p_mins: tuple[float, ...] = (0.0, 0.5, 0.9)  # with each of these drafter-confidence floors
    prompt_names: tuple[str, ...] | None = None  # None: every shipped prompt
    n_predict: int = 64
    rounds: int = 1
    overrides: tuple[str, ...] = ()
    server_bin: Path | None = None
    save_as: str | None = None
    max_spread: float = TOO_NOISY  # a spread over this writes no profile (TuneResult.noisy)

    @property
    def name(self) -> str:
        """The tuned profile's name; a bad ``save_as`` raises here, before any measuring."""
        return tuned_name(self.profile, self.save_as)

    @property
    def command(self) -> str:
        """The ``gguf-exact tune`` command that makes this request, for the tuned profile's header."""
        import shlex

        args = ["--model", str(self.target), "--draft", str(self.drafter), "--profile", self.profile_arg]
        args += ["--n-max", ",".join(map(str, self.n_values)), "--bounds", ",".join(map(str, self.bounds))]
        args += ["--p-min", ",".join(f"{p:g}" for p in self.p_mins), "--n-predict", str(self.n_predict)]
        args += ["--rounds", str(self.rounds)]
        args += ["--prompts", ",".join(self.prompt_names)] if self.prompt_names else []
        args += ["--as", self.save_as] if self.save_as else []
        args += ["--max-spread", f"{self.max_spread:g}"] if self.max_spread != TOO_NOISY else []
        return shlex.join(["gguf-exact", "tune", *args, *(a for o in self.overrides for a in ("--set", o))])


@dataclass
class Tuned:
    """What :func:`tune_profile` measured, wrote and saved."""

    request: TuneRequest
    result: TuneResult
    report_files: dict[str, Path]  # bench.json, bench.md
    profile_file: Path | None = None  # None: measured only, or refused (TuneResult.noisy)
    replaces_builtin: bool = False  # the saved name is a profile shipped with gguf-exact


def tune_profile(
    request: TuneRequest,
    out_dir: Path,
    write: bool = True,
    progress: Callable[[str], None] = lambda s: None,
    step: Callable[[str], None] = lambda s: None,
) -> Tuned:
    """Measure ``request`` (:func:`tune_n_max`), write the measurement to ``out_dir`` and,
    with ``write``, save the best n-max as a profile of its own (:func:`write_tuned_profile`),
    unless the measurements are too noisy to rank the settings (:attr:`TuneResult.noisy`).
    ``progress`` and ``step`` as :func:`tune_n_max` takes them."""
    from gguf_exact.bench.prompt_set import load_prompts

    name = request.name
    BenchReport.check_outputs(out_dir)  # before measuring: neither the report nor the profile is an input
    if write:
        check_not_input(tuned_destination(request.profile, None, name), profile_input(request.profile))
    prompts = load_prompts(list(request.prompt_names) if request.prompt_names is not None else None)
    result = tune_n_max(request, prompts, progress=progress, step=step)
    # The measurement and the profile are renamed into place together: a profile that cannot
    # be written leaves the report of an earlier tune in out_dir as it was.
    with staged_outputs():
        tuned = Tuned(request, result, result.report.write(out_dir, plot=False))
        if write and result.noisy is None:
            tuned.profile_file = write_tuned_profile(request.profile, result, request.command, name=name)
            tuned.replaces_builtin = shadows_builtin(name)
    return tuned


def set_n_max(toml_text: str, n_max: int | float | bool, note: str = "", key_name: str = N_MAX_KEY) -> str:
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


def kept_keys(kept: Setting) -> list[tuple[str, int | float | bool]]:
    """The ``[draft]`` keys the tuned profile gets for the kept setting, in the order written."""
    if not kept.adaptive:
        return [(N_MAX_KEY, kept.n_max), (ADAPTIVE_KEY, False)]
    return [(N_MAX_KEY, kept.n_max), (ADAPTIVE_KEY, True), (P_MIN_KEY, kept.p_min)]


def kept_line(kept: Setting) -> str:
    """``spec-draft-n-max = 3, spec-draft-adaptive = false``: what the profile now says."""
    return ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else f'{v:g}'}" for k, v in kept_keys(kept))


def tuned_header(result: TuneResult, command: str) -> list[str]:
    """The comment lines (always three) that say what was measured, by which command."""

    def name(s) -> str:
        label = s.label
        return "target alone" if label == TARGET else label.replace("n_max=", "n-max ").replace("p_min=", "p-min ")

    rows = ", ".join(f"{name(s)} {s.tokens_per_second_median:.1f}" for s in result.report.rows)
    return [
        f"{TUNED_MARK} on {result.report.meta['time']}: {kept_line(result.kept)}",
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


def profile_input(base: Profile) -> Inputs:
    """``base`` as an input the tuned profile must not be, unless tune wrote it (its first
    line is tune's mark): such a copy is tune's own, updated in place."""
    lines = base.path.read_text().splitlines()[:1] if base.path is not None else []
    return {} if lines and lines[0].startswith(TUNED_MARK) else {"profile": base.path}


def write_tuned_profile(
    base: Profile, result: TuneResult, command: str, folder: Path | None = None, name: str | None = None
) -> Path:
    """Write ``base`` with the kept setting (:attr:`TuneResult.kept`: the adaptive policy's
    bound and p-min, or a fixed n-max with the policy off) to ``folder/<name>.toml``
    (default: the user's profile folder, ``<base>-tuned``, see :func:`tuned_name`) and read
    it back; the project's ``serve/`` is refused."""
    dest = tuned_destination(base, folder, name)
    assert base.path is not None  # tune measured a profile loaded from its file
    body = base.path.read_text().splitlines()
    if body and body[0].startswith(TUNED_MARK):  # a copy tuned before: its header is replaced
        body = body[len(tuned_header(result, command)) :]
    new = "\n".join(tuned_header(result, command) + body)
    kept = result.kept
    keys = kept_keys(kept)
    if not kept.adaptive and not serving_config(base, with_draft=True).adaptive:
        keys = keys[:1]  # a profile that never was adaptive keeps its form
    for key, value in keys:
        note = "measured by gguf-exact tune" if key == N_MAX_KEY else "kept by gguf-exact tune"
        new = set_n_max(new, value, note, key)
    output_folder(dest.parent)
    with atomic_output(dest, inputs=profile_input(base)) as tmp:
        tmp.write_text(new)
        written = serving_config(load_profile(tmp), with_draft=True)
        for key, value in keys:
            got = written.value(BY_KEY[key].name)
            if got != value:
                raise NotExactError(f"{dest}: written with {key} = {got!r}, expected {value!r}")
    return dest


__all__ = [
    "N_MAX_KEY",
    "TuneRequest",
    "TuneResult",
    "Tuned",
    "default_adaptive",
    "kept_keys",
    "kept_line",
    "set_n_max",
    "shadows_builtin",
    "tune_n_max",
    "tune_settings",
    "tune_profile",
    "tuned_destination",
    "tuned_header",
    "tuned_name",
    "write_tuned_profile",
]
