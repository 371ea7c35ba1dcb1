"""The target's verification passes and a drafter step timed at load (``spec-draft-adaptive-warmup``, as
llama-server's ``--spec-draft-adaptive-warmup`` in build patches 23f and 39t): :func:`time_start_up_costs`,
whose figures seed the draft-length policy (:meth:`.draft_length.DraftLength.seed`) so that it starts from
this machine's costs instead of learning them on a request's first passes."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from llama_cpp import llama_cpp_ext

from gguf_exact.engines.python.draft_length import StartUpCosts
from gguf_exact.errors import InputError

if TYPE_CHECKING:  # the engine imports this module
    from gguf_exact.engines.python.engine import MtpLlama

log = logging.getLogger(__name__)


def time_start_up_costs(llm: MtpLlama, most_rows: int, repeats: int = 3) -> StartUpCosts:
    """Seconds of the target's decode of 1 to ``most_rows`` rows (logits on every row, as a
    verification pass asks), before any request: each row count decoded ``repeats`` times at
    positions 0.., the first (graph built, weights paged in) dropped, the lowest of the others
    kept; the cache emptied after each, and the Llama reset after all. Then one drafter step,
    alike: after 1 row of the target, from its hidden state (on lavapipe a step costs more than
    that row: unpriced, the policy's climb drafted there as if steps were free).

    The passes run on a thread of their own that ends with them. llama.cpp's CPU backend (built
    with OpenMP, as pip and this project build it) keeps a team of worker threads for each OS
    thread that has computed a graph, for as long as that thread lives; one more team beside the
    serving thread's (these passes run on the loading thread, and a server generates on another)
    made every later target pass about 20% slower and every drafter step 3x (E2B, 2-core Xeon:
    190 ms against 157 per 4-row pass, 3.8 ms against 1.1 per step; gone when the timing thread
    has ended)."""
    costs: list[StartUpCosts] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            costs.append(_timed(llm, most_rows, repeats))
        except BaseException as e:  # raised on the caller's thread below
            failed.append(e)

    t_start = time.perf_counter()
    worker = threading.Thread(target=run, name="gguf-exact-pass-timing")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    shown = ", ".join(f"{r}: {1e3 * s:.1f} ms" for r, s in costs[0].passes.items())
    step = costs[0].step
    shown += f"; a drafter step {1e3 * step:.1f} ms" if step is not None else ""
    log.info(
        "draft policy: verification pass by rows timed at start-up (%.1f s): %s", time.perf_counter() - t_start, shown
    )
    return costs[0]


def _timed(llm: MtpLlama, most_rows: int, repeats: int) -> StartUpCosts:
    bos = llm.token_bos()
    token = bos if bos != -1 else 0
    passes = {}
    for rows in range(1, most_rows + 1):
        timings = []
        for _ in range(repeats):
            t = time.perf_counter()
            llm.decode_batch([token] * rows, 0, True)
            timings.append(time.perf_counter() - t)
            llm.drop_cache_from(0)
        passes[rows] = min(timings[1:] or timings)
    steps = []
    drafter = llm.drafter
    for _ in range(repeats if drafter is not None else 0):
        assert drafter is not None
        llm.decode_batch([token], 0, True)
        h = llama_cpp_ext.llama_get_embeddings_nextn_ith(llm.ctx, 0)
        if not h:
            raise InputError("target: llama.cpp returned no hidden state for the start-up drafter step")
        before = drafter.seconds
        drafter.draft(token, 1, 1, h)  # as a request's first draft: the token after row 0, at position 1
        steps.append(drafter.seconds - before)
        llm.drop_cache_from(0)
    llm.reset()
    return StartUpCosts(passes, min(steps[1:] or steps) if steps else None)


__all__ = ["time_start_up_costs"]
