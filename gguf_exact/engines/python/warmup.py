"""The target's verification passes timed at load (``spec-draft-adaptive-warmup``, as llama-server's
``--spec-draft-adaptive-warmup`` in build patch 23): :func:`time_verification_passes`, whose
figures seed the draft-length policy (:meth:`.draft_length.DraftLength.seed`) so that it starts
from this machine's costs instead of learning them on a request's first passes."""

from __future__ import annotations

import logging
import threading
import time

from gguf_exact.engines.python.llama_adapter import LlamaAdapter

log = logging.getLogger(__name__)


def time_verification_passes(llm: LlamaAdapter, most_rows: int, repeats: int = 3) -> dict[int, float]:
    """Seconds of the target's decode of 1 to ``most_rows`` rows (logits on every row, as a
    verification pass asks), before any request: each row count decoded ``repeats`` times at
    positions 0.., the first (graph built, weights paged in) dropped, the lowest of the others
    kept; the cache emptied after each, and the Llama reset after all.

    The passes run on a thread of their own that ends with them. llama.cpp's CPU backend (built
    with OpenMP, as pip and this project build it) keeps a team of worker threads for each OS
    thread that has computed a graph, for as long as that thread lives; one more team beside the
    serving thread's (these passes run on the loading thread, and a server generates on another)
    made every later target pass about 20% slower and every drafter step 3x (E2B, 2-core Xeon:
    190 ms against 157 per 4-row pass, 3.8 ms against 1.1 per step; gone when the timing thread
    has ended)."""
    costs: dict[int, float] = {}
    failed: list[BaseException] = []

    def run() -> None:
        try:
            costs.update(_timed_passes(llm, most_rows, repeats))
        except BaseException as e:  # raised on the caller's thread below
            failed.append(e)

    t_start = time.perf_counter()
    worker = threading.Thread(target=run, name="gguf-exact-pass-timing")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    shown = ", ".join(f"{r}: {1e3 * s:.1f} ms" for r, s in costs.items())
    log.info(
        "draft policy: verification pass by rows timed at start-up (%.1f s): %s", time.perf_counter() - t_start, shown
    )
    return costs


def _timed_passes(llm: LlamaAdapter, most_rows: int, repeats: int) -> dict[int, float]:
    bos = llm.token_bos()
    token = bos if bos != -1 else 0
    costs = {}
    for rows in range(1, most_rows + 1):
        timings = []
        for _ in range(repeats):
            t = time.perf_counter()
            llm.decode_batch([token] * rows, 0, True)
            timings.append(time.perf_counter() - t)
            llm.drop_cache_from(0)
        costs[rows] = min(timings[1:] or timings)
    llm.reset()
    return costs


__all__ = ["time_verification_passes"]
