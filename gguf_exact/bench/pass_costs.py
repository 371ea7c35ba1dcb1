"""What the passes of a speculating pair cost, in-process (the bindings, same threads as the
servers), and the speed-up those costs predict (``make bench-real``'s first step):

- :func:`target_pass_seconds`: a target pass at 1 and at n-max + 1 rows (logits for every row,
  as verification asks);
- :func:`drafter_profile`: a drafter step, and how much of it its output head takes (the
  262,144-row head, or the ordered-embedding head's nodes; per graph node, timed through
  llama.cpp's ``cb_eval`` hook);
- :func:`split_pass_seconds`: a target pass shared by several sequences, each bringing its own
  rows, with a cache per sequence (llama-server's ``--parallel N``) or one shared cache
  (``--kv-unified``); the passes llama.cpp cuts a cache per sequence's batch into are
  :func:`~gguf_exact.engines.shared.batch_cost.equal_split`'s;
- :func:`predicted_speedup`: the speed-up those costs predict for a measured number of tokens
  per target pass, to set beside the measured one; :func:`card_prediction` the same on a card
  whose target pass is given.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

HEAD_NODE = "result_output"  # the drafter's tied output head (gemma4-assistant.cpp)
OUTPUT_NODE = "result_output"  # the target's logits (gemma4.cpp): one per graph pass
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


NE_OFFSET = 16  # offsetof(struct ggml_tensor, ne): after the type (int, padded) and the buffer pointer


@contextmanager
def shared_passes(
    target: Path, n_seq: int, threads: int, unified: bool, context: int = 200, rows_seen: list[int] | None = None
) -> Iterator[Callable[[Sequence[int]], float]]:
    """A target context of ``n_seq`` sequences, each first given ``context`` tokens, with a cache per
    sequence or one shared (``unified``), yielding ``decode(rows)``: one ``llama_decode`` bringing
    ``rows[s]`` rows of sequence s (logits for each), its seconds. ``rows_seen``: each graph pass's
    rows are appended to it (the output node's rows, through llama.cpp's eval callback). The
    bindings' low-level API: the high-level ``Llama`` serves one sequence."""
    import llama_cpp as L

    def callback(tensor: int, ask: bool, _user: Any) -> bool:
        if ctypes.string_at(tensor + NAME_OFFSET) != OUTPUT_NODE.encode():
            return False
        if not ask and rows_seen is not None:
            rows_seen.append(ctypes.c_int64.from_address(tensor + NE_OFFSET + 8).value)  # ne[1]: its rows
        return True

    from gguf_exact.engines.python.bindings import errors_only_logs

    hook = L.ggml_backend_sched_eval_callback(callback)
    with ExitStack() as stack:
        errors_only_logs(stack)
        model = L.llama_model_load_from_file(str(target).encode(), L.llama_model_default_params())
        if not model:
            raise RuntimeError(f"{target}: llama.cpp could not load it")
        stack.callback(L.llama_model_free, model)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.kv_unified = 4096 * n_seq, 512, 512, n_seq, unified
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED  # as both engines run it
        if rows_seen is not None:
            cp.cb_eval, cp.cb_eval_user_data = hook, None
        ctx = L.llama_init_from_model(model, cp)
        stack.callback(L.llama_free, ctx)
        batch = L.llama_batch_init(512, 0, n_seq)
        stack.callback(L.llama_batch_free, batch)
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        pos = [0] * n_seq

        def decode(rows: Sequence[int]) -> float:
            batch.n_tokens = 0
            for s, n in enumerate(rows):
                for token in vocab_ids(300 + pos[s] % 64, n, n_vocab):
                    i = batch.n_tokens
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos[s], 1, 1
                    batch.seq_id[i][0] = s
                    batch.n_tokens, pos[s] = i + 1, pos[s] + 1
            t = time.perf_counter()
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError(f"{target}: llama_decode failed on {list(rows)}")
            return time.perf_counter() - t

        for s in range(n_seq):  # the context, one sequence at a time, in passes of at most 256
            for start in range(0, context, 256):
                decode([min(256, context - start) if q == s else 0 for q in range(n_seq)])
        if rows_seen is not None:
            rows_seen.clear()
        yield decode


def split_pass_seconds(
    target: Path, compositions: Sequence[Sequence[int]], threads: int, unified: bool, context: int = 200,
    repeats: int = 3,
) -> dict[tuple[int, ...], float]:  # fmt: skip
    """The fastest of ``repeats`` decodes of each composition (rows per sequence, see
    :func:`shared_passes`), a cache per sequence or one shared."""
    n_seq = max(len(c) for c in compositions)
    with shared_passes(target, n_seq, threads, unified, context) as decode:
        out: dict[tuple[int, ...], list[float]] = {tuple(c): [] for c in compositions}
        for _ in range(repeats + 1):  # the first round, discarded, pages in what each shape touches
            for c in out:
                out[c].append(decode(c))
    return {c: min(t[1:]) for c, t in out.items()}


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
