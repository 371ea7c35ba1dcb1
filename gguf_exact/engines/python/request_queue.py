"""The Python engine's requests: one answered at a time, the rest in a bounded queue.

llama-cpp-python's ``Llama`` decodes one sequence: its server's lock makes every other
request wait, for as long as the ones before it take, with no bound (four requests queued
behind a vanished client's 1,000,000 tokens timed out). So the queue is explicit: at most
:data:`MAX_WAITING` requests wait behind the one being answered; one more is answered
HTTP 503 with ``Retry-After`` (what the waiting ones are expected to take, from the recent
answers' mean time), and ``/metrics`` shows the queue's length, the time requests waited and
how many were turned away. Several users at once: llama-server (``--parallel N``) decodes
their sequences in one batch; this engine does not (docs/python-engine.md).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

MAX_WAITING = 64  # behind the one being answered (as many as the fault tests send at once); one more is a 503


@dataclass
class RequestQueue:
    """The count of requests in the engine's hands (``in_flight``: answered or waiting) and
    the figures ``/metrics`` shows. Thread-safe: the routes run in worker threads."""

    max_waiting: int = MAX_WAITING
    in_flight: int = 0
    turned_away: int = 0  # answered 503: the queue was full
    answered: int = 0
    wait_seconds: float = 0.0  # admitted until the engine took them, all answered requests
    answer_seconds: float = 0.0  # the engine took them until they ended
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self) -> float | None:
        """When the request joins the queue (its admission time), or None when it is full."""
        with self._lock:
            if self.in_flight > self.max_waiting:
                self.turned_away += 1
                return None
            self.in_flight += 1
            return time.monotonic()

    def leave(self, admitted: float, started: float | None) -> None:
        """A request admitted at ``admitted`` ended; the engine took it at ``started`` (None: never)."""
        now = time.monotonic()
        with self._lock:
            self.in_flight -= 1
            if started is not None:
                self.answered += 1
                self.wait_seconds += started - admitted
                self.answer_seconds += now - started

    @property
    def waiting(self) -> int:
        return max(0, self.in_flight - 1)

    def retry_after(self) -> int:
        """Seconds a turned-away client should wait: the queue's requests at the recent mean
        answer time (1 s before any was answered), at least 1."""
        with self._lock:
            mean = self.answer_seconds / self.answered if self.answered else 1.0
            return max(1, math.ceil(mean * self.in_flight))

    def metrics(self) -> list[tuple[str, str, str, float]]:
        """(kind, name, help, value) rows for ``/metrics``."""
        return [
            ("gauge", "llamacpp:requests_deferred", "Requests waiting for the engine (behind the one it answers)", self.waiting),
            ("gauge", "gguf_exact:requests_max_waiting", "Most requests that may wait; one more is answered 503", self.max_waiting),
            ("counter", "gguf_exact:requests_turned_away_total", "Requests answered 503: the queue was full", self.turned_away),
            ("counter", "gguf_exact:request_wait_seconds_total", "Time answered requests waited for the engine", self.wait_seconds),
        ]  # fmt: skip


__all__ = ["MAX_WAITING", "RequestQueue"]
