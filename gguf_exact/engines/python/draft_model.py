"""llama-cpp-python's draft-model hook on the MTP drafter: :class:`MtpDraftModel`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from llama_cpp import llama_cpp_ext
from llama_cpp.llama_speculative import LlamaDraftModel

from gguf_exact.engines.python.draft_length import DraftLength
from gguf_exact.engines.python.drafter import LlamaDrafter
from gguf_exact.engines.python.request import CURRENT_REQUEST
from gguf_exact.errors import InputError

if TYPE_CHECKING:  # the engine imports this module
    from gguf_exact.engines.python.drafter import HiddenState
    from gguf_exact.engines.python.engine import MtpLlama, _Call
    from gguf_exact.engines.shared.speculative_sampling import Support

_NO_DRAFTS = np.zeros(0, dtype=np.intc)


@dataclass
class _Shadow:
    """The policy's shadow (``spec-draft-shadow``): drafts for positions ``pos + 1``.. not verified, compared
    with the tokens the target samples there, one a pass; ``q``: each draft's q (rejection sampling), ``chances``
    the sum min(p, q) of each depth compared, p the row that sampled it."""

    call: _Call
    pos: int
    tokens: list[int]
    q: list[Support]
    chances: list[float] = field(default_factory=list)
    seen: int = 0  # drafts matched so far


class MtpDraftModel(LlamaDraftModel):
    """llama-cpp-python's draft-model hook, drafting with a gemma4-assistant MTP drafter.

    ``Llama.generate`` calls it with every token so far; the last one is the newest,
    at position ``len(input_ids) - 1``, not yet decoded. The drafter starts from the
    target's hidden state of the position before it, which is row
    ``pos - 1 - batch_start`` of the target's last decode. ``n_max`` may be changed
    between calls; 0 (or no drafter) drafts nothing: the target alone. ``length``
    (:class:`.draft_length.DraftLength`) says how many to draft within it: ``n_max``, or
    the adaptive policy's choice, within what the request being served asks for.
    """

    def __init__(self, n_max: int, adaptive: bool = False, p_min: float = 0.0, shadow: bool = False) -> None:
        self.length = DraftLength(n_max, adaptive, p_min, shadow)
        self._seen: tuple[_Call, float, int] | None = None  # (call, target seconds, rows) at the last draft
        self.drafter: LlamaDrafter | None = None
        self.llm: MtpLlama | None = None  # the engine it drafts for (set once both exist)
        self._shadow: _Shadow | None = None
        self._drafts: list[int] = []  # the last draft's tokens, verified by the pass that follows it

    @property
    def n_max(self) -> int:
        return self.length.n_max

    @n_max.setter
    def n_max(self, value: int) -> None:
        self.length.n_max = value

    def hidden(self, pos: int) -> HiddenState:
        """The target's hidden state for a draft at ``pos``: that of position ``pos - 1``,
        row ``pos - 1 - batch_start`` of the target's last decode (a pointer to
        ``n_embd`` floats)."""
        llm = self.llm
        assert llm is not None  # drafting starts once the engine is set
        h = llama_cpp_ext.llama_get_embeddings_nextn_ith(llm.ctx, pos - 1 - llm._batch_start)
        if not h:
            raise InputError(f"target: llama.cpp returned no hidden state for position {pos - 1}")
        return h

    def _observe_last_pass(self, call: _Call) -> None:
        """Tell the policy what the generation pass since the last draft cost (the target's decode
        time and rows between two drafts of one call: one pass) and what was verified of its draft."""
        llm, seen = self.llm, self._seen
        assert llm is not None  # drafting starts once the engine is set
        self._seen = (call, llm.target_seconds, llm.target_rows)
        if seen is None or seen[0] is not call or len(call.pass_drafts) < 2 or llm.target_rows == seen[2]:
            return  # the first draft of a call follows the prompt, not a generation pass
        self.length.policy.observe_pass(llm.target_rows - seen[2], llm.target_seconds - seen[1])
        drafted, emitted = call.pass_drafts[-1], call.pass_emitted[-1]
        if drafted <= 0 or emitted <= 0:
            return
        # the pass's tokens against its drafts: a draft is kept iff the token there is it (a rejected draft's
        # token, exact match's or the residual's, never is); a pass cut short inside its run of kept drafts (an
        # end of generation, a stop string, a client gone) verified only those
        tokens = call.tokens[-emitted:]
        kept = next((j for j, d in enumerate(self._drafts[:emitted]) if tokens[j] != d), min(drafted, emitted))
        verified = drafted if kept < emitted else kept
        chances = llm.rejection.chances[:verified] if llm.rejection is not None else ()
        self.length.policy.observe_result(verified, kept, chances)

    def finish(self, call: _Call) -> None:
        """The call is over: its last pass, which no draft follows to tell it, told now (as llama-server's
        policy is told every pass it verifies); a shadow in flight is dropped."""
        if self.llm is not None and self.drafter is not None:
            self._observe_last_pass(call)
        self._seen, self._shadow, self._drafts = None, None, []

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        llm = self.llm
        assert llm is not None
        llm._verify_next = True  # the next eval is a verification pass: logits on every row
        call = llm._call
        pos = len(input_ids) - 1
        if self.drafter is None:
            return _NO_DRAFTS
        limit = llm.context_size - pos - 2  # leave room in the context, as llama-server does
        if call is not None:
            limit = min(limit, call.remaining() - 1)  # a pass yields at most k + 1 tokens
            self._observe_last_pass(call)
            self._check_shadow(call, input_ids, pos)
        request = CURRENT_REQUEST.get()
        k, p_min = self.length.plan(limit, request.speculation if request is not None else None)
        self._shadow = self._shadow if k <= 0 else None  # a real draft first: its tokens are not the shadow's
        self._drafts = []
        if k <= 0:
            # none while one is in flight: replaced, only the shadows whose first draft missed would be told
            if self.length.shadow and call is not None and self._shadow is None:
                self._draft_shadow(call, input_ids, pos, self.length.shadow, p_min)
            return _NO_DRAFTS
        seconds = self.drafter.seconds
        rule = llm.rejection  # speculative sampling: drafts drawn from the drafter's q, kept for the target
        if rule is not None:
            rule.start_draft(pos)
        drafts = self.drafter.draft(
            int(input_ids[-1]), pos, k, self.hidden(pos), p_min, None if rule is None else rule.draw_draft
        )
        self.length.policy.observe_steps(self.drafter.last_steps, self.drafter.seconds - seconds)
        self._drafts = list(drafts)
        if call is not None:
            call.pending_drafts = len(drafts)
        return np.asarray(drafts, dtype=np.intc)

    def _draft_shadow(self, call: _Call, input_ids: np.ndarray, pos: int, n: int, p_min: float) -> None:
        """Draft ``n`` as a draft would be (the request's p_min; q with rejection sampling), none verified."""
        llm, drafter = self.llm, self.drafter
        assert llm is not None and drafter is not None
        rule, qs = llm.rejection, []

        def pick(row: np.ndarray) -> int:
            assert rule is not None
            token, q = rule.draw_shadow(row)
            qs.append(q)
            return token

        seconds = drafter.seconds
        tokens = drafter.draft(int(input_ids[-1]), pos, n, self.hidden(pos), p_min, None if rule is None else pick)
        self.length.policy.observe_steps(drafter.last_steps, drafter.seconds - seconds)
        self._shadow = _Shadow(call, pos, tokens, qs) if tokens else None

    def _check_shadow(self, call: _Call, input_ids: np.ndarray, pos: int) -> None:
        """The token at ``pos``, the target's newest, against the shadow's draft there; its result told the
        policy at a miss or once every draft matched. Out of step (another call, a pass skipped): dropped."""
        sh, llm = self._shadow, self.llm
        if sh is None or llm is None:
            return
        if sh.call is not call or sh.pos + 1 + sh.seen != pos:
            self._shadow = None
            return
        if sh.q and llm.rejection is not None:  # the row of position pos - 1 sampled this token
            sh.chances.append(llm.rejection.chance(llm.row_logits(pos - 1), sh.q[sh.seen]))
        hit = int(input_ids[pos]) == sh.tokens[sh.seen]
        sh.seen += 1 if hit else 0
        if hit and sh.seen < len(sh.tokens):
            return
        self.length.policy.observe_shadow(len(sh.tokens), sh.seen, sh.chances)
        self._shadow = None


__all__ = ["MtpDraftModel"]
