"""What the passes of a speculating pair cost, in-process (the bindings, same threads as the
servers), and the speed-up those costs predict (``make bench-real``'s first step):

- :func:`target_pass_seconds`: a target pass at 1 and at n-max + 1 rows (logits for every row,
  as verification asks);
- :func:`drafter_profile`: a drafter step, and how much of it its output head takes (the
  262,144-row head, or the ordered-embedding head's nodes; per graph node, timed through
  llama.cpp's ``cb_eval`` hook);
- :func:`predicted_speedup`: the speed-up those costs predict for a measured number of tokens
  per target pass, to set beside the measured one; :func:`card_prediction` the same on a card
  whose target pass is given.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

HEAD_NODE = "result_output"  # the drafter's tied output head (gemma4-assistant.cpp)
ORDERED_HEAD_NODES = "ordered_head."  # the ordered-embedding head's nodes (patch #24), beside result_output
NAME_OFFSET = 256  # offsetof(struct ggml_tensor, name) in ggml 0c1e57098 (x86-64)


def target_pass_seconds(
    target: Path, rows: Sequence[int], threads: int, repeats: int = 3, gpu_layers: int = 0
) -> dict[int, float]:
    """Median seconds of one target decode of ``k`` rows (logits for each), for each ``k``,
    after a 32-token prefix; the prefix's cache is kept and the rows re-decoded."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(target), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=threads, n_threads_batch=threads,
        logits_all=True, verbose=False, n_gpu_layers=gpu_layers, flash_attn=True,  # as both engines run it
    )  # fmt: skip
    try:
        n_vocab = llm.n_vocab()
        prefix = vocab_ids(300, 32, n_vocab)
        llm.eval(prefix)
        llm.eval(vocab_ids(400, 1, n_vocab))  # pages the weights in
        out = {}
        for k in rows:
            times = []
            for i in range(repeats + 1):  # the first, discarded, pages in what k rows touch
                llm.n_tokens = len(prefix)
                t = time.perf_counter()
                llm.eval(vocab_ids(500, k, n_vocab))
                if i:
                    times.append(time.perf_counter() - t)
            out[k] = statistics.median(times)
        return out
    finally:
        llm.close()


@dataclass
class DrafterProfile:
    step_seconds: float  # one drafter decode (one draft token), no hook attached
    head_seconds: float  # its output head's nodes, timed node by node
    profiled_step_seconds: float  # the whole step, timed node by node
    nodes: int
    head_nodes: tuple[str, ...] = ()  # the nodes timed as the head, in llama.cpp's order
    head_node_seconds: tuple[float, ...] = ()  # each head node's median time, in that order

    @property
    def head_share(self) -> float:
        return self.head_seconds / self.profiled_step_seconds if self.profiled_step_seconds else 0.0

    def as_dict(self) -> dict:
        return self.__dict__ | {"head_share": self.head_share}


def vocab_ids(first: int, count: int, n_vocab: int) -> list[int]:
    """``count`` consecutive token ids from ``first`` (the profiles' arbitrary text), moved down
    to end at the last id of a vocabulary too small for them (the tiny pairs' 320 tokens)."""
    start = max(0, min(first, n_vocab - count))
    return list(range(start, start + count))


def drafter_profile(target: Path, drafter: Path, threads: int, steps: int = 10, gpu_layers: int = 0) -> DrafterProfile:
    """The drafter's step time in the engine, and its output head's share of it.

    A second drafter context on the same target carries an eval callback that asks
    to see every graph node, so llama.cpp computes them one by one and calls back after
    each: the time between calls is that node's."""
    import llama_cpp

    from gguf_exact.engines.python.drafter import LlamaDrafter
    from gguf_exact.engines.python.runner import Runner

    seen: list[tuple[str, float]] = []

    def callback(tensor: int, ask: bool, _user: Any) -> bool:
        if not ask:
            name = ctypes.string_at(tensor + NAME_OFFSET).decode("utf-8", "replace")
            seen.append((name, time.perf_counter()))
        return True

    hook = llama_cpp.ggml_backend_sched_eval_callback(callback)
    with Runner(target, drafter, n_ctx=512, n_threads=threads, n_gpu_layers=gpu_layers) as r:
        r.generate(vocab_ids(300, 32, r.n_vocab), 2, 1)  # a target cache for the drafter to read
        (token,) = vocab_ids(400, 1, r.n_vocab)
        pos = r.llm.n_tokens  # llama.cpp wants the draft right after the cache's last position
        plain = r.drafter
        assert plain is not None  # the Runner was given the drafter
        h = (ctypes.c_float * plain.n_embd)()
        for _ in range(5):  # the first steps page the head in (0.4 s each on a full-size E2B)
            plain.draft(token, pos, 1, h)
        times = []
        for _ in range(steps):
            plain.seconds = 0.0
            plain.draft(token, pos, 1, h)
            times.append(plain.seconds)
        step = statistics.median(times)
        defaults = llama_cpp.llama_context_default_params

        def with_hook():
            p = defaults()
            p.cb_eval = hook
            p.cb_eval_user_data = None
            return p

        with ExitStack() as stack:
            llama_cpp.llama_context_default_params = with_hook
            try:
                timed = LlamaDrafter(stack, drafter, plain.target, threads, gpu_layers or None)
            finally:
                llama_cpp.llama_context_default_params = defaults
            for _ in range(3):
                timed.draft(token, pos, 1, h)
            heads, totals, per_node = [], [], []
            for _ in range(steps):
                seen.clear()
                t0 = time.perf_counter()
                timed.draft(token, pos, 1, h)
                last, head, head_nodes, node_times = t0, 0.0, [], []
                for name, t in seen:
                    if name == HEAD_NODE or name.startswith(ORDERED_HEAD_NODES):
                        head += t - last
                        head_nodes.append(name)
                        node_times.append(t - last)
                    last = t
                heads.append(head)
                totals.append(last - t0)
                per_node.append(node_times)
            nodes = len(seen)
    node_medians = tuple(statistics.median(ts) for ts in zip(*per_node))
    return DrafterProfile(
        step, statistics.median(heads), statistics.median(totals), nodes, tuple(head_nodes), node_medians
    )


def predicted_speedup(
    tokens_per_pass: float, pass_1: float, pass_verify: float, draft_step: float, n_max: int
) -> float:
    """Speed-up over the target alone that the measured costs predict: each target pass
    yields ``tokens_per_pass`` tokens and costs one verification of n-max + 1 rows plus
    n-max drafter steps; the target alone yields one token per ``pass_1``."""
    return tokens_per_pass * pass_1 / (pass_verify + n_max * draft_step)


def card_prediction(
    tokens_per_pass: float, card_pass: float, cpu_pass_1: float, draft_step: float, n_max: int
) -> float:
    """A prediction, not a measurement: :func:`predicted_speedup` on a card whose target pass
    costs ``card_pass`` at 1 row and about the same at n-max + 1 (a GPU verifies a few rows in
    one pass's time), with the drafter's CPU step scaled by the card's pass over the CPU's
    (``cpu_pass_1``): the drafter is taken to speed up on the card as the target does."""
    return predicted_speedup(tokens_per_pass, card_pass, card_pass, draft_step * card_pass / cpu_pass_1, n_max)


__all__ = [
    "DrafterProfile",
    "card_prediction",
    "drafter_profile",
    "predicted_speedup",
    "target_pass_seconds",
    "vocab_ids",
]
