"""Running chunk tasks on both cores: forked worker processes, or threads.

A re-pack's per-chunk work is numpy calls separated by enough Python that two
threads contend for the GIL (measured: about 1.45x on two cores, against 1.75x for
two processes). On Linux the workers are therefore forked processes: they inherit
the run's state object, open file descriptors included (``pread``/``pwrite`` need
no shared file position), so a task is only a method name and a few integers, and
a result a small object. Elsewhere, or on request, threads run the same tasks.
With one worker, tasks run in the calling thread.

Only one pool may serve at a time in a process (the state is a module global,
which forked workers read).
"""

import contextlib
import signal
import sys
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from typing import Any, Iterator

_STATE: object = None  # the object whose methods the tasks call by name


def _call(name: str, args: tuple) -> Any:
    return getattr(_STATE, name)(*args)


def _ignore_interrupts() -> None:
    """Workers leave Ctrl-C to the parent, which cancels the rest and cleans up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ChunkPool:
    def __init__(self, executor: Executor | None) -> None:
        self.executor = executor

    def run(self, name: str, arg_list: list[tuple]) -> list:
        """``state.<name>(*args)`` for each ``args``, results in order. On the first
        failure the rest is cancelled and the running tasks awaited (none may still
        write once the caller closes its files), then the error is raised."""
        if self.executor is None or len(arg_list) <= 1:
            return [_call(name, args) for args in arg_list]
        futures = [self.executor.submit(_call, name, args) for args in arg_list]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            wait(futures)
            raise


def worker_kind(kind: str) -> str:
    if kind == "auto":
        return "process" if sys.platform.startswith("linux") else "thread"
    if kind not in ("process", "thread"):
        raise ValueError(f"worker kind {kind!r}: expected auto, process or thread")
    return kind


@contextlib.contextmanager
def chunk_pool(state: object, workers: int, kind: str = "auto") -> Iterator[ChunkPool]:
    """A pool whose tasks call methods of ``state``; ``state`` must be complete
    (files open) before the first task, as forked workers copy it then."""
    global _STATE
    if _STATE is not None:
        raise RuntimeError("a chunk pool is already serving in this process")
    _STATE = state
    executor: Executor | None = None
    if workers > 1:
        if worker_kind(kind) == "process":
            # Imported here: multiprocessing and its process pool (sockets, pickling) are a
            # hundredth of a second of start-up that a threaded write (`convert`) never uses.
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            executor = ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("fork"), initializer=_ignore_interrupts
            )
        else:
            executor = ThreadPoolExecutor(workers)
    try:
        yield ChunkPool(executor)
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        _STATE = None
