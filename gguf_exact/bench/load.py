"""Many users at once (``make bench-load``): llama-server with ``--parallel`` P and P clients.

Each client is a stream of requests (one after the other, the shipped prompts of several
kinds in turn, each client starting at another), all clients released together. Per pair
kind, draft arm (:data:`ARMS`: speculation off, fixed n-max 1 and 3, the profile's own
adaptive length), slot count and sampler (:data:`SAMPLERS`: greedy and Gemma's own):
total generated tokens/s over the clients' wall time, the decode's tokens/s a request (its tokens over
llama-server's ``timings.predicted_ms``: what speculation changes, without the prefill, which
on lavapipe's tiny pair is two thirds of a request and most of its spread), per-request latency
(median, p90) and acceptance per slot, from llama-server's own answers (``id_slot`` and
``timings.draft_n``/``draft_n_accepted`` of each ``/completion``).

:func:`stops_paying` reads the results as the question asks: at how many users the best
drafting arm stops beating speculation off. :func:`client_streams` and :func:`changed`
are also the soak's (``scripts/soak_load.py``): replies checked against the target alone's.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from gguf_exact.bench.paired import paired_ratio
from gguf_exact.bench.real import running
from gguf_exact.bench.request import BENCH_PROFILE, SAMPLERS, fixed_length
from gguf_exact.engines.shared.knobs import KNOB
from gguf_exact.errors import ArgumentError, GgufExactError

PARALLEL_KEY, CTX_KEY = (KNOB[name].flag for name in ("parallel", "ctx_size"))
# llama-server's counters of sampled requests verified by rejection sampling, and of those that asked
# for it and kept exact match (their chain: ignore_eos is a logit bias, grammar, penalties; patch 38)
RULE_REQUESTS, RULE_FALLBACKS = "llamacpp:spec_rejection_requests_total", "llamacpp:spec_rejection_fallbacks_total"


@dataclass(frozen=True)
class LoadArm:
    """A draft setting: ``n_max`` 0 is speculation off (no drafter loaded); ``adaptive``:
    the profile's own draft policy and bound, untouched; ``sets``: KEY=VALUE over the profile
    for this arm alone (a peer measured side by side, :func:`load_arm`)."""

    label: str
    n_max: int
    adaptive: bool = False
    sets: tuple[str, ...] = ()

    def overrides(self) -> list[str]:
        return [*([] if self.adaptive else fixed_length(self.n_max)), *self.sets]


ARMS = (LoadArm("off", 0), LoadArm("n-max 1", 1), LoadArm("n-max 3", 3), LoadArm("adaptive", 4, True))
PEER_MARK = "@"  # "adaptive@kv-unified=false": the adaptive arm with a cache per slot, beside the arms as shipped


def load_arm(text: str) -> LoadArm:
    """An arm of :data:`ARMS` by its label, or ``LABEL@KEY=VALUE[@KEY=VALUE...]``: that arm with
    those overrides, a peer of the arms as configured (left out of :func:`stops_paying`)."""
    label, *sets = (part.strip() for part in text.split(PEER_MARK))
    base = next((a for a in ARMS if a.label == label), None)
    if base is None or any("=" not in s for s in sets):
        raise ArgumentError(
            f"arm {text!r}: expected one of {', '.join(a.label for a in ARMS)}, optionally with @KEY=VALUE overrides"
        )
    return replace(base, label=text.strip(), sets=tuple(sets))


@dataclass
class Reply:
    """One request's answer as its client saw it (``error``: why it got none)."""

    client: int
    index: int  # the client's n-th request
    prompt: str  # the prompt's name
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    slot: int = -1
    draft_n: int = 0
    draft_n_accepted: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0  # llama-server's timings.predicted_ms: after the prefill
    error: str = ""


def prompt_order(names: Sequence[str], client: int, index: int) -> str:
    """The prompt of a client's n-th request: the names in turn, client ``c`` starting at the
    ``c``-th, so clients at the same moment send prompts of different kinds."""
    return names[(client + index) % len(names)]


def client_streams(
    url: str,
    prompts: dict[str, str],
    clients: int,
    n_predict: int,
    sampler: str = "greedy",
    requests: int | None = None,
    seconds: float | None = None,
    first: int = 0,
) -> tuple[list[Reply], float]:
    """``clients`` threads released together, each sending ``requests`` requests one after the
    other (or as many as start within ``seconds``), numbered from ``first`` (the prompt order
    goes on from there); (every reply, wall seconds). A request that fails is kept with its
    error, not raised: a lost request is a finding."""
    from gguf_exact.engines.shared.http import post_json

    if (requests is None) == (seconds is None):
        raise ValueError("give requests or seconds")
    names = list(prompts)
    replies: list[list[Reply]] = [[] for _ in range(clients)]
    gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def stream(c: int) -> None:
        gate.wait()
        i = first
        while (i < first + requests) if requests is not None else (time.perf_counter() < stop_at[0]):
            r = Reply(c, i, prompt_order(names, c, i))
            body = {
                "prompt": prompts[r.prompt],
                "n_predict": n_predict,
                "return_tokens": True,
                "cache_prompt": False,  # every request pays its prefill, as a new user's would
                "seed": 1 + 100_000 * c + i,
                **SAMPLERS[sampler],
            }
            if not body["temperature"]:
                # every greedy request the same length, so counts and texts compare across arms; not a
                # sampled one: llama-server makes ignore_eos a logit bias, and a request with one keeps
                # exact match where the profile verifies sampled drafts by rejection sampling
                body["ignore_eos"] = True
            t0 = time.perf_counter()
            try:
                res = post_json(url.rstrip("/") + "/completion", body)
                timings = res.get("timings") or {}
                r.tokens = [int(t) for t in res.get("tokens", [])]
                r.text, r.slot = res.get("content", ""), int(res.get("id_slot", -1))
                r.draft_n, r.draft_n_accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
                r.decode_seconds = float(timings.get("predicted_ms", 0.0)) / 1000.0
            except GgufExactError as e:
                r.error = str(e)
            r.seconds = time.perf_counter() - t0
            replies[c].append(r)
            i += 1

    # daemons: Ctrl-C ends the run (and its servers, stopped on the way out) without waiting for replies
    threads = [threading.Thread(target=stream, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    stop_at[0] = t0 + (seconds or 0.0)
    gate.wait()
    for t in threads:
        t.join()
    return [r for rs in replies for r in rs], time.perf_counter() - t0


def per_slot(replies: Sequence[Reply]) -> dict[int, tuple[int, int]]:
    """``{slot: (accepted, drafted)}`` over the replies each slot answered."""
    out: dict[int, tuple[int, int]] = {}
    for r in replies:
        if not r.error:
            a, d = out.get(r.slot, (0, 0))
            out[r.slot] = (a + r.draft_n_accepted, d + r.draft_n)
    return dict(sorted(out.items()))


def changed(replies: Sequence[Reply], reference: dict[str, str]) -> list[Reply]:
    """The replies lost (an error) or whose text is not ``reference``'s for their prompt."""
    return [r for r in replies if r.error or r.text != reference[r.prompt]]


def p90(values: Sequence[float]) -> float:
    """The 90th percentile (``statistics.quantiles``, inclusive); the value itself for one."""
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


@dataclass
class LoadResult:
    """One arm at one slot count and sampler: what its clients got."""

    kind: str
    arm: str
    n_max: int
    adaptive: bool
    users: int  # clients, each with a slot of its own (--parallel)
    sampler: str
    wall_seconds: float
    replies: list[Reply]
    load_average: float = 0.0  # the machine's 1-minute load average, the highest seen after a round
    rejection_requests: int = 0  # requests verified by rejection sampling (the server's /metrics)
    rejection_fallbacks: int = 0  # requests that asked for it and kept exact match
    round_rates: list[float] = field(default_factory=list)  # each round's tokens/s, paired with off's (.paired)

    @property
    def rule(self) -> str:
        """How the drafts were verified, as the server counted: ``rejection``, ``exact``, or
        ``exact (N fell back)`` where requests asked for rejection sampling and kept exact match
        (``rejection (N of M fell back)`` where only some did)."""
        rs, fell = self.rejection_requests, self.rejection_fallbacks
        if fell:
            return f"rejection ({fell} of {rs + fell} fell back)" if rs else f"exact ({fell} fell back)"
        return "rejection" if rs else "exact"

    @property
    def tokens(self) -> int:
        return sum(len(r.tokens) for r in self.replies if not r.error)

    @property
    def lost(self) -> int:
        return sum(1 for r in self.replies if r.error)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """A request's tokens per second of its decode (after its prefill), over the replies: at one user the
        server's decode speed, at several what each user gets once its first token came."""
        seconds = sum(r.decode_seconds for r in self.replies if not r.error)
        return self.tokens / seconds if seconds else 0.0

    def latency(self) -> tuple[float, float]:
        """Per-request seconds: (median, p90)."""
        s = [r.seconds for r in self.replies if not r.error]
        return (statistics.median(s), p90(s)) if s else (0.0, 0.0)

    def as_dict(self) -> dict:
        med, high = self.latency()
        return {k: v for k, v in asdict(self).items() if k != "replies"} | {
            "tokens": self.tokens,
            "requests": len(self.replies),
            "lost": self.lost,
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "latency_median_seconds": med,
            "latency_p90_seconds": high,
            "per_slot": {str(k): list(v) for k, v in per_slot(self.replies).items()},
            "rule": self.rule,
            "replies": [asdict(r) for r in self.replies],
        }


@dataclass(frozen=True)
class LoadRequest:
    """What :func:`measure_load` runs for one pair: every arm at every slot count, each
    sampler's clients on the same server (one server per arm and slot count)."""

    kind: str
    target: Path
    drafter: Path
    prompts: dict[str, str]
    parallels: tuple[int, ...] = (1, 2, 4)
    arms: tuple[LoadArm, ...] = ARMS
    samplers: tuple[str, ...] = tuple(SAMPLERS)
    n_predict: int = 32
    requests: int = 1  # per client and round
    rounds: int = 2
    ctx_per_slot: int = 512
    sets: tuple[str, ...] = ()  # KEY=VALUE over the profile, for every arm
    profile: str = BENCH_PROFILE
    vulkan_devices: str | None = None  # a Vulkan profile's devices (serve --vulkan-devices; 0: lavapipe)


def measure_load(
    req: LoadRequest,
    log: Callable[[str], None] = lambda _: None,
    on_group: Callable[[list[LoadResult]], None] = lambda _: None,
) -> list[LoadResult]:
    """Every arm x slot count x sampler of ``req``. Per slot count P, every arm's llama-server
    (``--parallel P``, ``ctx_per_slot`` a slot) loaded at once; then ``req.rounds`` rounds, in
    each of which every arm in turn (the order rotated by one a round) takes P clients of
    ``req.requests`` requests per sampler: on a shared machine a burst of other work slows
    the arms alike, not whichever ran at that minute. Each figure sums the rounds."""
    from gguf_exact.engines.shared.http import get_metrics, post_json

    def rule_counts(url: str) -> tuple[float, float]:
        m = get_metrics(url)
        return m.get(RULE_REQUESTS, 0.0), m.get(RULE_FALLBACKS, 0.0)

    out = []
    for p in req.parallels:
        with ExitStack() as stack:
            urls = []
            for j, arm in enumerate(req.arms):
                sets = [*req.sets, f"{PARALLEL_KEY}={p}", f"{CTX_KEY}={req.ctx_per_slot * p}", *arm.overrides()]
                drafter = req.drafter if arm.n_max else None
                label = f"{req.kind}-{p}-users-{j}"  # a trace path of its own beside the other arms' servers
                launch, _proc, _load = stack.enter_context(
                    running(req.target, drafter, "llama-server", sets, req.profile, req.vulkan_devices, trace_label=label)
                )
                # warm-up: pages the weights in, on a prompt of its own
                post_json(launch.url + "/completion", {"prompt": "Warm-up.", "n_predict": 2, "cache_prompt": False})
                urls.append(launch.url)
            got = {(a, s): LoadResult(req.kind, arm.label, arm.n_max, arm.adaptive, p, s, 0.0, [])
                   for a, arm in enumerate(req.arms) for s in req.samplers}  # fmt: skip
            for rnd in range(req.rounds):
                for a in [(rnd + i) % len(req.arms) for i in range(len(req.arms))]:
                    for sampler in req.samplers:
                        before = rule_counts(urls[a])
                        replies, wall = client_streams(
                            urls[a],
                            req.prompts,
                            p,
                            req.n_predict,
                            sampler,
                            requests=req.requests,
                            first=rnd * req.requests,
                        )
                        after = rule_counts(urls[a])
                        res, counted = got[a, sampler], got[a, sampler].tokens  # the round's: what .tokens adds
                        res.rejection_requests += int(after[0] - before[0])
                        res.rejection_fallbacks += int(after[1] - before[1])
                        res.replies += replies
                        res.round_rates.append((res.tokens - counted) / wall)
                        res.wall_seconds += wall
                        res.load_average = max(res.load_average, os.getloadavg()[0])
            for r in got.values():
                med, high = r.latency()
                log(
                    f"{req.kind}, {r.arm}, {p} users, {r.sampler}: {r.tokens_per_second:.2f} tokens/s, "
                    f"latency {med:.2f}/{high:.2f} s, lost {r.lost}, load average up to {r.load_average:.1f}"
                    + (f", verified by {r.rule}" if r.n_max else "")
                )
            out += list(got.values())
            on_group(list(got.values()))  # a long run interrupted keeps the slot counts it finished
    order = {arm.label: i for i, arm in enumerate(req.arms)}
    return sorted(out, key=lambda r: (order[r.arm], r.users))  # stable: samplers keep their order


def stops_paying(results: Sequence[dict]) -> list[dict]:
    """Per pair kind and sampler: at each user count, speculation off's tokens/s, the best
    drafting arm and its ratio to off, the adaptive arm's ratios (to off, and to the better of
    off and the best fixed length: the issue's 1.0x and 0.98x goals; its decode's to off's, where both were
    timed; to off's round by round, :func:`by_round`), and ``stops_at``: the fewest users at which no
    drafting arm beats off (None: it pays at every count measured)."""
    out = []
    groups = sorted({(r["kind"], r["sampler"]) for r in results})
    for kind, sampler in groups:
        rows = [r for r in results if (r["kind"], r["sampler"]) == (kind, sampler) and PEER_MARK not in r["arm"]]
        users = []
        for p in sorted({r["users"] for r in rows}):
            at = {r["arm"]: r for r in rows if r["users"] == p}
            off = at.get("off")
            drafting = [r for r in at.values() if r["n_max"]]
            if off is None or not drafting or not off["tokens_per_second"]:
                continue
            base = off["tokens_per_second"]
            best = max(drafting, key=lambda r: r["tokens_per_second"])
            fixed = [r["tokens_per_second"] for r in drafting if not r["adaptive"]]
            ada = next((r for r in drafting if r["adaptive"]), None)
            users.append(
                {
                    "users": p,
                    "off_tokens_per_second": base,
                    "best_arm": best["arm"],
                    "best_vs_off": best["tokens_per_second"] / base,
                    "adaptive_vs_off": ada["tokens_per_second"] / base if ada else None,
                    "adaptive_vs_better": ada["tokens_per_second"] / max([base, *fixed]) if ada else None,
                    "adaptive_decode_vs_off": decode_ratio(ada, off) if ada else None,
                    "adaptive_vs_off_by_round": by_round(ada, off) if ada else None,
                }
            )
        stops = next((u["users"] for u in users if u["best_vs_off"] < 1.0), None)
        out.append({"kind": kind, "sampler": sampler, "stops_at": stops, "users": users})
    return out


def by_round(arm: dict, off: dict) -> list[float] | None:
    """``arm`` over ``off`` round by round (:mod:`.paired`): [ratio, low, high] of a 95% interval; None under 2 rounds
    or in results written before rounds were timed."""
    est = paired_ratio(off.get("round_rates") or [], arm.get("round_rates") or [])
    return None if est is None else [est.ratio, est.low, est.high]


def decode_ratio(arm: dict, off: dict) -> float | None:
    """``arm``'s decode tokens/s over ``off``'s (None where either was not timed: results written before it was)."""
    a, b = arm.get("decode_tokens_per_second"), off.get("decode_tokens_per_second")
    return a / b if a and b else None


def table(results: Sequence[dict]) -> str:
    """The Markdown table of every result, then per kind and sampler where the drafter stops
    paying."""
    off = {
        (r["kind"], r["sampler"], r["users"]): r for r in results if not r["n_max"] and PEER_MARK not in r["arm"]
    }  # a peer's ratio is to the off arm as configured
    lines = [
        "| kind | sampler | users | arm | tokens/s | vs off | decode tokens/s a request | decode vs off | latency median s "
        "| p90 s | accepted/drafted per slot | verified by | requests | lost |",
        "|" + "---|" * 14,
    ]
    for r in results:
        base = off.get((r["kind"], r["sampler"], r["users"]))
        ratio = f"{r['tokens_per_second'] / base['tokens_per_second']:.2f}x" if base else "-"
        decode, decode_vs = r.get("decode_tokens_per_second"), decode_ratio(r, base) if base else None
        slots = " ".join(f"{s}:{a}/{d}" for s, (a, d) in r["per_slot"].items()) if r["n_max"] else "-"
        lines.append(
            f"| {r['kind']} | {r['sampler']} | {r['users']} | {r['arm']} | {r['tokens_per_second']:.2f} | {ratio} "
            f"| {f'{decode:.2f}' if decode else '-'} | {'-' if decode_vs is None else f'{decode_vs:.2f}x'} "
            f"| {r['latency_median_seconds']:.2f} | {r['latency_p90_seconds']:.2f} | {slots} "
            f"| {r.get('rule', '-') if r['n_max'] else '-'} | {r['requests']} "
            f"| {r['lost']} |"
        )
    lines.append("")
    for g in stops_paying(results):
        curve = ", ".join(
            f"{u['users']}: {u['best_arm']} {u['best_vs_off']:.2f}x"
            + ("" if u["adaptive_vs_off"] is None else f" (adaptive {u['adaptive_vs_off']:.2f}x off, "
               f"{u['adaptive_vs_better']:.2f}x the better of off and fixed"
               + ("" if u.get("adaptive_decode_vs_off") is None else f"; decode {u['adaptive_decode_vs_off']:.2f}x off")
               + ("" if not u.get("adaptive_vs_off_by_round") else "; by round {:.2f}x off, 95% {:.2f}-{:.2f}".format(
                   *u["adaptive_vs_off_by_round"]))
               + ")")
            for u in g["users"]
        )  # fmt: skip
        if not g["users"]:
            lines.append(f"- {g['kind']}, {g['sampler']}: no user count has both speculation off and a drafting arm")
            continue
        top = max(u["users"] for u in g["users"])
        users = lambda n: f"{n} user{'s' if n > 1 else ''}"  # noqa: E731
        where = (
            f"stops paying at {users(g['stops_at'])}" if g["stops_at"] else f"pays up to {users(top)} (all measured)"
        )
        lines.append(f"- {g['kind']}, {g['sampler']}: the drafter {where}; best arm vs off by users: {curve}")
    return "\n".join(lines) + "\n"


__all__ = [
    "ARMS",
    "PEER_MARK",
    "SAMPLERS",
    "LoadArm",
    "LoadRequest",
    "LoadResult",
    "Reply",
    "changed",
    "client_streams",
    "load_arm",
    "measure_load",
    "per_slot",
    "prompt_order",
    "stops_paying",
    "table",
]
