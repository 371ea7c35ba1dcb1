"""The Python engine against llama-server as a profile serves them (``bench_real.py --parity``, issue 40).

Nothing pinned beyond the profile: each engine decodes on its own default threads, which is
what a user of ``serve`` gets (the rest of bench-real pins ``--threads`` for both, and so
never saw the Python engine decode the target alone on llama-cpp-python's ``cpu_count() // 2``
threads). Per :class:`Mode` (the target alone, a fixed draft length, the adaptive one):

- one at a time: each engine's server alone on the machine, ``A B B A``
  (:func:`~.report.alternating_order`) ``repeats`` times, so a drift over the minutes falls
  on both engines alike; the ratio of each adjacent pair of runs, its minimum and median;
- side by side: both servers loaded, each request to one then the other
  (:func:`~.real.arms_side_by_side`, the order rotated per request), ``rounds`` rounds; the
  ratio of the two arms' medians and, request by request (:mod:`.paired`), the geometric mean
  of each request's ratio to its peer's with its 95% interval. On this project's shared 2-core
  VMs one run of an engine differs from the next by up to 10-25%, so a parity claim rests on the
  request pairs' interval, not on one A B B A sequence.

Figures are generation tokens/s (after the first token, as bench-real's tables).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from gguf_exact.bench.paired import PairedRatio, paired_ratio
from gguf_exact.bench.real import Arm, arms_side_by_side
from gguf_exact.bench.report import Arm as Labelled
from gguf_exact.bench.report import alternating_order
from gguf_exact.bench.request import SAMPLERS
from gguf_exact.engines.shared.engine_options import server_threads

PYTHON, SERVER = "python", "llama-server"


@dataclass(frozen=True)
class Mode:
    """What both engines run: ``kind``'s drafter (``none``: the target alone) up to ``n_max``, each
    request with ``sampler`` (a :data:`~.request.SAMPLERS` name; a sampled mode's drafts verified as
    the shipped profiles verify them, by rejection sampling)."""

    kind: str
    n_max: int = 0
    adaptive: bool = False
    sampler: str = "greedy"

    @property
    def sampled(self) -> bool:
        return self.arm(PYTHON).sampled  # one definition of a sampled request: the arm's

    def label(self) -> str:
        how = f"{self.kind} " + (f"adaptive up to n-max {self.n_max}" if self.adaptive else f"n-max {self.n_max}")
        how = how if self.n_max else "target alone"
        return how + (f", {self.sampler} sampler" + (", rejection" if self.n_max else "") if self.sampled else "")

    def arm(self, engine: str) -> Arm:
        """``engine``'s server in this mode (a greedy arm names no rule: at temperature 0 both are exact match)."""
        return Arm(engine, self.n_max, self.adaptive, sampler=self.sampler, rule="rejection")


def parity_modes(kinds: Sequence[str], n_max: Sequence[int], bound: int | None, sampler: str = "greedy") -> list[Mode]:
    """The target alone, then per kind each fixed length and the adaptive one up to ``bound``."""
    modes = [Mode("none", sampler=sampler)]
    for kind in kinds:
        modes += [Mode(kind, n, sampler=sampler) for n in n_max]
        modes += [Mode(kind, bound, True, sampler)] if bound else []
    return modes


def _ratios(python: list[float], server: list[float]) -> dict:
    pairs = [p / s for p, s in zip(python, server) if s]
    return {
        PYTHON: python,
        SERVER: server,
        "ratios": pairs,
        "ratio_min": min(pairs, default=0.0),
        "ratio_median": statistics.median(pairs) if pairs else 0.0,
    }


def engine_parity(
    target: Path,
    pairs: dict[str, tuple[Path, Path]],
    modes: Sequence[Mode],
    prompts: Sequence[str],
    n_predict: int,
    sets: Sequence[str],
    profile: str,
    repeats: int = 1,
    rounds: int = 2,
    log: Callable[[str], None] = print,
) -> dict:
    """Per mode, one at a time (``repeats`` x A B B A) and side by side (``rounds``): ``target`` alone, and each
    drafting mode on its kind's (target, drafter) of ``pairs`` (``sampled`` has a target of its own)."""
    out: dict = {"server_threads": server_threads(), "modes": []}
    for mode in modes:
        mode_target, drafter = pairs[mode.kind] if mode.n_max else (target, None)
        runs: dict[str, list[float]] = {PYTHON: [], SERVER: []}
        for _, engine in alternating_order([Labelled(PYTHON, mode.n_max), Labelled(SERVER, mode.n_max)], repeats):
            log(f"parity, {mode.label()}: {engine.label} alone")
            [r] = arms_side_by_side(
                mode_target, drafter, [mode.arm(engine.label)], prompts, n_predict, sets, profile, 1
            )
            runs[engine.label].append(r.generation_tokens_per_second)
        log(f"parity, {mode.label()}: both engines side by side")
        both = [mode.arm(PYTHON), mode.arm(SERVER)]
        py, srv = arms_side_by_side(mode_target, drafter, both, prompts, n_predict, sets, profile, rounds)
        row: dict[str, Any] = {"mode": mode.label(), "kind": mode.kind, "n_max": mode.n_max, "adaptive": mode.adaptive}
        row["sampler"] = mode.sampler
        row["one_at_a_time"] = _ratios(runs[PYTHON], runs[SERVER])
        row["side_by_side"] = _ratios([py.generation_tokens_per_second], [srv.generation_tokens_per_second])
        flat = [[r for rates in x.request_rates for r in rates] for x in (srv, py)]
        row["side_by_side"]["requests"] = {SERVER: flat[0], PYTHON: flat[1]}  # per round, per prompt
        est = paired_ratio(*flat)
        if est is not None:
            row["side_by_side"]["request_pairs"] = {"ratio": est.ratio, "low": est.low, "high": est.high,
                                                    "pairs": est.pairs}  # fmt: skip
        # greedy: the same text in both; sampled, each engine draws from its own generator (not compared)
        row["same_text"] = py.texts == srv.texts if not mode.sampled else None
        # the Python engine's own time outside llama_decode (HTTP, sampling, its loop), side by side
        row["python_ms_per_token"] = 1e3 * (py.python_seconds or 0.0) / max(py.tokens, 1)
        out["modes"].append(row)
        log(parity_line(row))
    return out


def add_parity_options(ap: argparse.ArgumentParser) -> None:
    """``bench_real.py``'s options for :func:`parity_run`."""
    ap.add_argument("--parity", choices=("on", "only", "off"), default="on", help="Python engine vs llama-server")
    ap.add_argument("--parity-n-max", default="1,3", help="--parity's fixed draft lengths")
    ap.add_argument("--parity-kinds", default="mixed,hidden", help="--parity's drafters")
    ap.add_argument("--parity-repeats", type=int, default=1, help="A B B A sequences per --parity mode")
    ap.add_argument(
        "--parity-sampler", choices=tuple(SAMPLERS), default="greedy",
        help="--parity's requests' sampler (gemma: drafts verified by rejection sampling, as the shipped profiles do)",
    )  # fmt: skip


def parity_run(
    args: argparse.Namespace, pairs: dict[str, tuple[Path, Path]], bound: int, prompts: Sequence[str], log: Callable
) -> dict:
    """:func:`engine_parity` as ``bench_real.py``'s options ask (``bound``: the adaptive mode's
    n-max, 0 for none), with the run's context size and ``--set`` but not its ``--threads``; the
    target alone is the ``hidden`` pair's (the target every kind but ``sampled`` shares)."""
    kinds = [k for k in args.parity_kinds.split(",") if k]
    modes = parity_modes(kinds, _ints(args.parity_n_max), bound, args.parity_sampler)
    sets = [f"ctx-size={args.ctx}", "no-warmup=true", *args.set]
    return engine_parity(
        pairs["hidden"][0], pairs, modes, prompts, args.n_predict, sets, args.profile, args.parity_repeats,
        args.rounds, log,
    )  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parity_line(row: dict) -> str:
    """One mode's ratios: ``target alone: one at a time 0.98x (min 0.96; 8.1 vs 8.3 tok/s), side by side 0.99x
    (request by request 0.990x (95% 0.970-1.010, 16 request pairs))``."""
    one, side = row["one_at_a_time"], row["side_by_side"]
    speeds = f"{statistics.median(one[PYTHON]):.2f} vs {statistics.median(one[SERVER]):.2f} tokens/s"
    pairs = side.get("request_pairs")
    by_request = "" if pairs is None else f" (request by request {PairedRatio(**pairs).describe()})"
    return (
        f"Python engine / llama-server, {row['mode']}: one at a time {one['ratio_median']:.2f}x "
        f"(min {one['ratio_min']:.2f}; {speeds}), side by side {side['ratio_median']:.2f}x{by_request}"
        + ("; **texts differ**" if row["same_text"] is False else "")
    )


__all__ = ["Mode", "add_parity_options", "engine_parity", "parity_line", "parity_modes", "parity_run"]
