"""Speculation at the real models' size (``make bench-real``): what one and many users get.

On a full-size pair (:mod:`gguf_exact.tiny.full_pair`), per engine (llama-server and
the Python engine, both over HTTP with the same requests) and n-max (0 = the target
alone; a fixed length, or the bound of the adaptive policy's):

- :func:`arms_side_by_side`: several :class:`Arm` (an engine at one n-max, fixed or
  adaptive, with overrides of its own) loaded side by side and sent the same requests in
  turn, several rounds (medians): load time (start to ``/health`` 200), time to first
  token (a 1-token request after a warm-up), then the prompts: tokens/s (client wall and
  the server's generation phase), acceptance, tokens per target pass, and each server
  process's peak RSS (``VmHWM``: its memory-mapped weights it touched included).
  :func:`engines_arm`: one n-max in every engine.
- :func:`concurrent_arm`: ``clients`` requests at once on a server with ``--parallel`` slots: each
  request's tokens and acceptance (llama-server's own ``timings``) and the aggregate tokens/s.

What the passes cost in-process, and the speed-up that predicts: :mod:`.pass_costs`.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from gguf_exact.bench.report import Figures
from gguf_exact.bench.request import BENCH_PROFILE, SAMPLERS, adaptive_length, fixed_length, rule_overrides
from gguf_exact.engines.python.policy_trace import TRACE_ENV
from gguf_exact.engines.shared.settings import ENGINES  # what serve --engine takes
from gguf_exact.errors import InputError

TTFT_PROMPT = "Time to first token, measured on a prompt of its own: " * 2
GIB = 1024**3
MEMORY_SPARE = GIB  # left free beside the servers: this process, the system, other work's page cache


@dataclass(frozen=True)
class Arm:
    """One server of a side-by-side run: ``engine`` drafting up to ``n_max`` (0: the target
    alone, no drafter), a fixed length or the policy's (``adaptive``), with ``sets``
    (``KEY=VALUE``, e.g. ``spec-draft-p-min=0.5``) over the run's own for this arm only; its
    requests sample with ``sampler`` (a :data:`~.request.SAMPLERS` name) and a sampled arm's
    drafts are verified by ``rule`` (exact match, or rejection: speculative sampling)."""

    engine: str
    n_max: int
    adaptive: bool = False
    sets: tuple[str, ...] = ()
    label: str = ""  # a name for logs and tables ("": described by the fields)
    sampler: str = "greedy"
    rule: str = "exact"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sets", tuple(self.sets))

    @property
    def sampled(self) -> bool:
        return SAMPLERS[self.sampler].get("temperature", 0.0) > 0

    def overrides(self) -> list[str]:
        """The draft length's overrides, a sampled drafting arm's rule, then the arm's own (the
        later of two values wins). Greedy arms name no rule: at temperature 0 both are exact match."""
        rule = rule_overrides(self.rule) if self.n_max and self.sampled else []
        return [*(adaptive_length(self.n_max) if self.adaptive else fixed_length(self.n_max)), *rule, *self.sets]

    def describe(self) -> str:
        """The arm in a few words, for a log: its engine and its label, or its length and sets."""
        if self.label:
            return f"{self.engine}, {self.label}"
        if not self.n_max:
            how = "the target alone"
        else:
            how = f"adaptive up to n-max {self.n_max}" if self.adaptive else f"n-max {self.n_max}"
        how += "" if not self.sampled else f", {self.sampler}" + (f", {self.rule}" if self.n_max else "")
        return f"{self.engine}, {how}" + (f" ({', '.join(self.sets)})" if self.sets else "")


@dataclass
class ArmResult(Figures):
    """One engine at one n-max: the prompts' :class:`~.report.Figures`, with load time, time
    to first token and peak RSS."""

    engine: str
    n_max: int
    load_seconds: float
    ttft_seconds: float
    peak_rss_mib: float
    ttft_prompt_tokens: int = 0
    adaptive: bool = False  # the draft length chosen by the policy, up to n_max
    rounds: int = 1  # the timings are medians over this many rounds
    same_every_round: bool = True  # every round gave the same text (greedy)
    texts: list[str] = field(default_factory=list, repr=False)
    # the Python engine's own time per request outside llama_decode (target and drafter), summed
    # over the prompts (medians over rounds); None for llama-server, which does not report it
    python_seconds: float | None = None
    # what the engine's draft-length policy measured by the end of the arm (/metrics: pass
    # seconds per row count, drafter step, acceptance per depth); None where it chose no length
    policy: dict | None = None
    sets: list[str] = field(default_factory=list)  # the arm's own overrides (Arm.sets)
    label: str = ""
    sampler: str = "greedy"
    rule: str = "exact"  # the verification rule of a sampled drafting arm (greedy: exact match either way)
    # over every round's requests (/metrics counters): passes that carried drafts, and how many
    # of them had their draft at position 0, 1, ... accepted
    draft_rounds: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    request_rates: list[list[float]] = field(default_factory=list)  # per round and prompt, its peers' pair (.paired)

    @property
    def acceptance_per_depth(self) -> list[float]:
        """Per depth d, accepted / drafted there, given the drafts before it were accepted:
        depth 1 over the passes that drafted, depth d over those whose depth d - 1 was
        accepted. Exact at a fixed length (each pass drafts n-max, unless a request's end
        leaves less room); where a pass drafts fewer (the adaptive length), deeper figures
        read low."""
        drafted = [self.draft_rounds, *self.accepted_per_position]
        return [a / d for a, d in zip(self.accepted_per_position, drafted) if d]

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        d |= {
            "tokens_per_second": self.tokens_per_second,
            "generation_tokens_per_second": self.generation_tokens_per_second,
            "acceptance": self.acceptance_rate,
            "acceptance_per_depth": self.acceptance_per_depth,
            "tokens_per_pass": self.tokens_per_target_pass,
        }
        return d


def peak_rss_mib(pid: int) -> float:
    """``VmHWM`` of a running process, in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@contextmanager
def running(
    target: Path,
    drafter: Path | None,
    engine: str,
    sets: Sequence[str],
    profile: str = BENCH_PROFILE,
    vulkan_devices: str | None = None,
    server_bin: Path | None = None,
    trace_label: str | None = None,
) -> Iterator[tuple[Any, Any, float]]:
    """A started server (launch, process, seconds to healthy), stopped on exit; ``vulkan_devices`` as
    ``serve --vulkan-devices`` (lavapipe, a CPU-type device llama.cpp hides otherwise), ``server_bin`` as
    ``serve --server-bin`` (another build's llama-server), ``trace_label`` as :func:`trace_env`."""
    from gguf_exact.engines.launch import plan_launch, start_server
    from gguf_exact.engines.shared.process import free_port
    from gguf_exact.engines.shared.settings import ServeSettings
    from gguf_exact.engines.shared.status import stop_server

    settings = ServeSettings(
        target, drafter, profile, tuple(sets), engine, port=free_port(), vulkan_devices=vulkan_devices,
        server_bin=server_bin,
    )  # fmt: skip
    launch = plan_launch(settings)
    proc, seconds = start_server(launch, detach=True, timeout=900, extra_env=trace_env(trace_label, os.environ))
    try:
        yield launch, proc, seconds
    finally:
        stop_server(launch.port)


def trace_env(label: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """A ``label``ed server's own ``LLAMA_SPEC_DRAFT_TRACE`` where one is set, ``PATH.<label>``: servers
    loaded at once given one path appended to one file, interleaved (not replayable)."""
    return {TRACE_ENV: f"{environ[TRACE_ENV]}.{label}"} if environ.get(TRACE_ENV) and label else {}


def proc_kib(text: str, key: str) -> int:
    """The ``key:   N kB`` line of a ``/proc`` text (``meminfo``, ``smaps_rollup``), in KiB (0 without one)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0])
    return 0


def anonymous_bytes(pid: int) -> int:
    """A process's anonymous memory (heap, KV cache, compute buffers: its own), 0 when it is gone (its
    memory-mapped model pages are page cache, shared by every server of the file)."""
    try:
        return proc_kib(Path(f"/proc/{pid}/smaps_rollup").read_text(), "Anonymous") * 1024
    except OSError:
        return 0


def memory_available_bytes() -> int:
    return proc_kib(Path("/proc/meminfo").read_text(), "MemAvailable") * 1024


def check_room(servers: int, left: int, largest_anonymous: int, model_bytes: int, available: int) -> None:
    """Raise :class:`InputError` unless ``left`` more servers of ``servers``, each taken to need
    the largest anonymous memory seen so far, fit in ``available`` beside the model files' page
    cache (each page once, however many servers map it) and :data:`MEMORY_SPARE`: swapping
    would time the disk, not the engines."""
    needed = largest_anonymous * left + model_bytes + MEMORY_SPARE
    if needed > available:
        raise InputError(
            f"{servers} servers side by side: the {left} still to start need {needed / GIB:.1f} GiB "
            f"({largest_anonymous / GIB:.1f} GiB each, the model files {model_bytes / GIB:.1f} GiB and "
            f"{MEMORY_SPARE / GIB:.0f} GiB spare) but {available / GIB:.1f} GiB is available; interleave fewer "
            "arms (bench_real.py --interleave none, or fewer --n-max values or engines)"
        )


def _median_sum(per_round: list[list[Any]], figure: Any) -> float:
    """Per prompt, the median of ``figure`` over rounds; summed over prompts."""
    return sum(statistics.median(figure(gens[i]) for gens in per_round) for i in range(len(per_round[0])))


def arms_side_by_side(
    target: Path,
    drafter: Path | None,
    arms: Sequence[Arm],
    prompts: Sequence[str],
    n_predict: int,
    sets: Sequence[str],
    profile: str = BENCH_PROFILE,
    rounds: int = 3,
    on_request: Callable[[int, int, int], None] | None = None,
) -> list[ArmResult]:
    """Every arm loaded at once, each its own server, over ``/v1/completions``: one result per
    arm, in ``arms``' order.

    The servers are started one after the other (each load timed while the others idle), then
    each request goes to every arm in turn before the next request, the order rotated by one
    from one request to the next (A B C, B C A, C A B, ...: each arm first as often as the
    others), ``rounds`` times; each figure is the median over rounds. On a shared machine a
    burst of other work, or the host's own drift (up to 25% within the hour here, 10% from one
    minute to the next), then slows every arm alike instead of whichever arm it fell on: the
    ratios between arms hold where the absolute figures wander, and a request's peers run
    seconds apart, not minutes apart as arms run one after the other.
    ``on_request(arm, round, prompt)`` (indices) is called before each measured request.
    Each arm's requests use its sampler; prompt ``i``'s seed is ``1 + i`` in every arm and
    round, so a sampled run is reproducible and each arm draws from the same seeds.

    Before each server after the first, :func:`check_room`: the servers still to start must
    fit in the memory available."""
    from gguf_exact.engines.shared.http import get_metrics, openai_generate
    from gguf_exact.engines.shared.stats import draft_counters

    drafts = drafter is not None and any(a.n_max for a in arms)
    model_bytes = target.stat().st_size + (drafter.stat().st_size if drafts and drafter is not None else 0)
    with ExitStack() as stack:
        servers = []
        largest_anonymous = 0
        for i, arm in enumerate(arms):
            if i:
                check_room(len(arms), len(arms) - i, largest_anonymous, model_bytes, memory_available_bytes())
            launch, proc, load = stack.enter_context(
                running(target, drafter if arm.n_max else None, arm.engine, [*sets, *arm.overrides()], profile,
                        trace_label=f"{i}-{arm.engine}")  # fmt: skip
            )
            openai_generate(launch.url, prompts[0], 2, 0.0, 1)  # warm-up: pages the weights in
            largest_anonymous = max(largest_anonymous, anonymous_bytes(proc.pid))
            servers.append((launch, proc, load))
        # a prompt no request before or after shares a prefix with: llama-cpp-python reuses
        # the previous request's prefix, llama-server (cache_prompt off) does not
        ttft = [openai_generate(launch.url, TTFT_PROMPT, 1, 0.0, 1) for launch, _, _ in servers]
        counted = [draft_counters(get_metrics(launch.url)) for launch, _, _ in servers]  # before the measured requests
        runs: list[list[list[Any]]] = [[] for _ in arms]
        for r in range(rounds):
            for per_round in runs:
                per_round.append([])
            for i, p in enumerate(prompts):
                first = (r * len(prompts) + i) % len(arms)
                for a in [*range(first, len(arms)), *range(first)]:
                    if on_request is not None:
                        on_request(a, r, i)
                    url, sampler = servers[a][0].url, SAMPLERS[arms[a].sampler]
                    runs[a][-1].append(openai_generate(url, p, n_predict, seed=1 + i, sampler=sampler))
        return [
            _arm_result(arm, *server, ttft[a], runs[a], counted[a])
            for a, (arm, server) in enumerate(zip(arms, servers))
        ]


def _arm_result(
    arm: Arm, launch: Any, proc: Any, load: float, ttft: Any, per_round: list[list[Any]], before: Any
) -> ArmResult:
    """One arm's figures from its requests' answers (``per_round``: the prompts' per round),
    its policy and draft counters from its ``/metrics`` (``before``: the counters before the
    measured requests) and its peak RSS, read while its server runs."""
    from gguf_exact.engines.shared.http import get_metrics
    from gguf_exact.engines.shared.policy_snapshot import parse_snapshot
    from gguf_exact.engines.shared.stats import draft_counters

    first = per_round[0]
    metrics = get_metrics(launch.url)
    snap = parse_snapshot(metrics)
    after = draft_counters(metrics)
    rounds, per_position = 0, []
    if after is not None:
        was = before.accepted_per_position if before is not None else ()
        rounds = after.drafts - (before.drafts if before is not None else 0)
        per_position = [n - (was[i] if i < len(was) else 0) for i, n in enumerate(after.accepted_per_position)]
        # the Python engine lists positions up to the deepest ever accepted: the rest accepted none
        per_position += [0] * (arm.n_max - len(per_position) if rounds else 0)
    python = [g.server_python_seconds for g in first]
    return ArmResult(
        engine=arm.engine,
        n_max=arm.n_max,
        load_seconds=load,
        ttft_seconds=ttft.wall_seconds,
        ttft_prompt_tokens=ttft.n_prompt,
        adaptive=arm.adaptive and arm.n_max > 0,
        tokens=sum(g.n_tokens for g in first),
        wall_seconds=_median_sum(per_round, lambda g: g.wall_seconds),
        generation_seconds=_median_sum(per_round, lambda g: g.wall_seconds - g.prefill_seconds),
        target_passes=sum(g.target_passes for g in first),
        drafts_generated=sum(g.drafts_generated for g in first),
        drafts_accepted=sum(g.drafts_accepted for g in first),
        peak_rss_mib=peak_rss_mib(proc.pid),
        rounds=len(per_round),
        same_every_round=all([g.text for g in gs] == [g.text for g in first] for gs in per_round),
        texts=[g.text for g in first],
        python_seconds=(
            _median_sum(per_round, lambda g: g.server_python_seconds) if all(x is not None for x in python) else None
        ),
        policy=None if snap is None else asdict(snap),
        sets=list(arm.sets),
        label=arm.label,
        sampler=arm.sampler,
        rule=arm.rule,
        draft_rounds=rounds,
        accepted_per_position=per_position,
        request_rates=[[Figures.total([g]).generation_tokens_per_second for g in gens] for gens in per_round],
    )


def engines_arm(
    target: Path,
    drafter: Path | None,
    engines: Sequence[str],
    n_max: int,
    prompts: Sequence[str],
    n_predict: int,
    sets: Sequence[str],
    profile: str = BENCH_PROFILE,
    rounds: int = 3,
    adaptive: bool = False,
) -> list[ArmResult]:
    """Every engine at one n-max (0: the target alone; ``adaptive``: the bound of the length
    the policy chooses, else the fixed length), side by side (:func:`arms_side_by_side`;
    with two engines the order is reversed from one request to the next)."""
    arms = [Arm(engine, n_max, adaptive) for engine in engines]
    return arms_side_by_side(target, drafter, arms, prompts, n_predict, sets, profile, rounds)


@dataclass
class ConcurrentResult:
    engine: str
    n_max: int
    parallel: int
    clients: int
    wall_seconds: float
    tokens: int
    per_request: list[dict]  # tokens, text, draft_n, draft_n_accepted (llama-server)

    @property
    def aggregate_tokens_per_second(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict:
        return self.__dict__ | {"aggregate_tokens_per_second": self.aggregate_tokens_per_second}


def concurrent_arm(
    target: Path,
    drafter: Path | None,
    engine: str,
    n_max: int,
    parallel: int,
    prompts: Sequence[str],
    n_predict: int,
    sets: Sequence[str],
    profile: str = BENCH_PROFILE,
) -> ConcurrentResult:
    """``len(prompts)`` clients at once, one request each, on ``parallel`` slots.

    llama-server: native ``/completion`` (per-request token ids and draft counters).
    The Python engine: ``/v1/completions`` (its server runs one request at a time), each
    request's tokens from its own answer's ``usage`` (the ``/metrics`` difference around a
    request, which :func:`openai_generate` reads, also counts the requests beside it).
    Every request also keeps its client-side seconds: how long a queued one waited shows."""
    from gguf_exact.engines.shared.http import openai_generate, post_json, server_generate

    extra = fixed_length(n_max)
    slots = [f"parallel={parallel}"] if engine == "llama-server" else []
    results: list[dict] = [{} for _ in prompts]
    with running(target, drafter if n_max else None, engine, [*sets, *slots, *extra], profile) as (launch, _p, _l):
        # warm-up on a prompt no client sends: the Python engine keeps the previous request's
        # prefix, and the first client would otherwise skip its prefill there
        openai_generate(launch.url, TTFT_PROMPT, 2, 0.0, 1)

        def one(i: int) -> None:
            start = time.perf_counter()
            if engine == "llama-server":
                g = server_generate(launch.url, prompts[i], n_predict)
                results[i] = {
                    "tokens": g.tokens,
                    "text": g.text,
                    "draft_n": g.drafts_generated,
                    "draft_n_accepted": g.drafts_accepted,
                }
            else:
                body = {"prompt": prompts[i], "max_tokens": n_predict, "temperature": 0.0, "seed": 1}
                res = post_json(launch.url.rstrip("/") + "/v1/completions", body | {"repeat_penalty": 1.0})
                results[i] = {"n_tokens": int(res["usage"]["completion_tokens"]), "text": res["choices"][0]["text"]}
            results[i]["seconds"] = time.perf_counter() - start

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    tokens = sum(len(r.get("tokens", [])) or r.get("n_tokens", 0) for r in results)
    return ConcurrentResult(engine, n_max, parallel, len(prompts), wall, tokens, results)


__all__ = [
    "ENGINES",
    "Arm",
    "ArmResult",
    "anonymous_bytes",
    "arms_side_by_side",
    "check_room",
    "ConcurrentResult",
    "concurrent_arm",
    "peak_rss_mib",
    "engines_arm",
]
