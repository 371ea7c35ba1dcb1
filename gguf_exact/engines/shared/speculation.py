"""Is draft-mtp really drafting? ``serve`` asks once after launch, ``status`` each time.

llama-server can load a drafter and still serve without speculation, saying so only
in its log, or not at all: ``-md`` without ``--spec-type draft-mtp`` loads the drafter
(even its context) and leaves speculation off; a speculative context that cannot be
set up is logged (``failed to initialize speculative decoding context``) and the
server carries on (llama.cpp issue #24758: MTP silently disabled when the draft
context cannot be allocated). The evidence, strongest first:

1. draft tokens: ``/metrics``' ``llamacpp:spec_decode_num_draft_tokens_total`` grew
   (over a probe request: :func:`probe`; or since start);
2. ``/slots``' ``speculative`` flag of llama-server (false: no speculative context);
3. the log lines above, and the command line (no ``--spec-type draft-mtp``).

:func:`judge` (pure) turns that into one :class:`Verdict` with one plain line.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from gguf_exact.errors import ServerError

ACTIVE, OFF, UNCONFIRMED, NOT_REQUESTED = "active", "off", "unconfirmed", "not requested"
PROBE_PROMPT = "One, two, three, four, five, six, seven,"
PROBE_TOKENS = 16
# llama.cpp log lines that mean speculation stayed off (tools/server/server-context.cpp at 0c1e57098)
OFF_LOG_LINES = (
    "failed to initialize speculative decoding context",
    "speculative decoding not supported by this context",
)


@dataclass(frozen=True)
class Verdict:
    state: str  # active, off, unconfirmed, not requested
    line: str

    @property
    def active(self) -> bool:
        return self.state == ACTIVE


def _spec_type(command: list[str]) -> str | None:
    for i, arg in enumerate(command):
        if arg in ("--spec-type", "--spec-types") and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith("--spec-type="):
            return arg.partition("=")[2]
    return None


def judge(
    drafter: bool,
    command: list[str],
    slots_speculative: bool | None,
    draft_tokens: int | None,
    accepted_tokens: int | None,
    log_text: str,
    probed: bool,
    engine: str = "llama-server",
) -> Verdict:
    """One verdict from the evidence (see the module doc). ``draft_tokens`` and
    ``accepted_tokens`` are over the probe request when ``probed``, else since start."""
    if not drafter:
        return Verdict(NOT_REQUESTED, "off: no drafter, the target alone")
    when = "in the probe request" if probed else "since start"
    if draft_tokens:
        return Verdict(ACTIVE, f"active: {draft_tokens} draft tokens {when}, {accepted_tokens or 0} accepted")
    logged = next((ln[ln.index(n) :].strip() for ln in log_text.splitlines() for n in OFF_LOG_LINES if n in ln), None)
    spec_type = _spec_type(command)
    if slots_speculative is False or logged:
        if engine == "llama-server" and spec_type is None:
            why = "the command has no --spec-type draft-mtp (-md alone loads the drafter and leaves speculation off)"
        elif engine == "llama-server" and "draft-mtp" not in (spec_type or "").split(","):
            why = f"--spec-type is {spec_type!r}, not draft-mtp"
        elif logged:
            why = f"llama.cpp logged: {logged}"
        else:
            why = "llama.cpp did not say why (see its log; a draft context it could not allocate is one cause, llama.cpp #24758)"
        return Verdict(OFF, f"OFF: a drafter was given but the server is not speculating: {why}")
    if probed:
        return Verdict(
            UNCONFIRMED,
            "unconfirmed: the server is set up to speculate but the probe request drafted no tokens (see its log)",
        )
    return Verdict(
        UNCONFIRMED, "on, not yet confirmed: no request has drafted yet (`gguf-exact status --probe` sends one)"
    )


def probe(url: str, timeout: float = 120.0, api_key: str | None = None) -> tuple[int, int]:
    """Send one short greedy completion and return (draft tokens, accepted tokens) it
    added to ``/metrics`` (the servers answer one request at a time)."""
    from gguf_exact.engines.shared.http import auth_headers, get_metrics

    base = url.rstrip("/")
    names = ("llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total")
    before = get_metrics(base, api_key)
    body = {"prompt": PROBE_PROMPT, "max_tokens": PROBE_TOKENS, "temperature": 0.0}
    req = urllib.request.Request(
        base + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"} | auth_headers(api_key),
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
    except (urllib.error.URLError, OSError) as e:
        raise ServerError(f"{base}: the probe request failed ({e})") from None
    after = get_metrics(base, api_key)
    drafted, accepted = (int(after.get(n, 0.0) - before.get(n, 0.0)) for n in names)
    return drafted, accepted


__all__ = ["ACTIVE", "NOT_REQUESTED", "OFF", "UNCONFIRMED", "Verdict", "judge", "probe"]
