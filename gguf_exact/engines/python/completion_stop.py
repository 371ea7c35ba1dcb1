"""Where :meth:`.engine.MtpLlama.create_completion` stops llama-cpp-python's generate loop itself.

:class:`CompletionStop` is the stopping criterion it adds to each call's, checked before
each sampled token is yielded. It stops the loop when the call has all the tokens it may
emit: llama-cpp-python checks ``max_tokens`` only after a token that completes a UTF-8
character, so a reply ending in an unfinished one ran past it (``generate --n-predict 64``
gave 71 tokens; repeated lead bytes ran to the end of the context). It also stops when the
served request's client has gone (:attr:`.request.CheckedRequest.abandoned`): at most one
target pass after it left, as llama-server cancels the task. llama-cpp-python calls a
reply ended by a criterion "stop"; :meth:`CompletionStop.correct` makes it "length".
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import llama_cpp

if TYPE_CHECKING:  # the engine imports this module
    from gguf_exact.engines.python.engine import _Call
    from gguf_exact.engines.python.request import CheckedRequest

log = logging.getLogger(__name__)


class CompletionStop:
    """The criterion for one ``create_completion`` call. ``current_call``: the engine's
    book-keeping of the generate call running now (its ``tokens`` and ``remaining()``),
    None outside one. ``arguments``: the call's bound arguments; the criterion joins
    their ``stopping_criteria``."""

    def __init__(
        self, current_call: Callable[[], _Call | None], request: CheckedRequest | None, arguments: dict[str, Any]
    ) -> None:
        self.current_call = current_call
        self.request = request  # the served request (.request.CheckedRequest), or None
        if request is not None and request.started is None:
            request.started = time.monotonic()  # the engine has it: its wait in the queue ends
        self.reason: str | None = None  # "length" or "abandoned" once it stopped the loop
        arguments["stopping_criteria"] = llama_cpp.StoppingCriteriaList([*(arguments["stopping_criteria"] or []), self])

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        call = self.current_call()
        if self.reason is None and call is not None:
            if self.request is not None and self.request.abandoned.is_set():
                self.reason = "abandoned"
                log.info("client disconnected: generation stopped after %d tokens", len(call.tokens))
            elif call.remaining() <= 0:
                self.reason = "length"
        return self.reason is not None

    def correct(self, answer: Any) -> Any:
        """A completion (or a streamed chunk) with the finish reason a stop here means."""
        if self.reason is not None:
            for choice in answer["choices"]:
                if choice.get("finish_reason") == "stop":
                    choice["finish_reason"] = "length"
        return answer

    def corrected(self, chunks: Iterator[Any]) -> Iterator[Any]:
        for chunk in chunks:
            yield self.correct(chunk)


__all__ = ["CompletionStop"]
