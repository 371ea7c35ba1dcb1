"""``gguf-exact chat``: a conversation in the terminal on the engine, streamed as tokens are accepted.

The conversation is a list of messages sent whole with every turn through
``create_chat_completion`` (the GGUF's chat template); llama-cpp-python keeps the
common prefix in the KV cache, so only the new turn is decoded. Commands:
``/stats`` (the figures so far), ``/reset`` (forget the conversation), ``/exit``.
Any other line starting with ``/`` is not sent to the model: it gets one line naming the
commands (``//`` at the start sends the line with one ``/``).
"""

from __future__ import annotations

from typing import Callable, Iterator

from gguf_exact.engines.python.engine import MtpLlama, SpecTotals
from gguf_exact.engines.python.runner import GREEDY, Sampling

COMMANDS = ("/stats", "/reset", "/exit", "/quit")


def unknown_command_line(text: str) -> str:
    """The one line an unknown slash command gets."""
    word = text.split()[0]
    return (
        f"unknown command {word}: the commands are {', '.join(COMMANDS)} (start a line with // to send it with one /)"
    )


def stats_line(t: SpecTotals) -> str:
    """Replies, tokens, acceptance, tokens per target pass and tokens/s so far."""
    if not t.requests:
        return "no replies yet"
    acc = "-" if t.acceptance_rate is None else f"{t.acceptance_rate:.1%} ({t.accepted_tokens}/{t.draft_tokens})"
    tps = "-" if t.tokens_per_second is None else f"{t.tokens_per_second:.1f}"
    per_pass = "-" if t.tokens_per_target_pass is None else f"{t.tokens_per_target_pass:.2f}"
    return (
        f"{t.requests} {'reply' if t.requests == 1 else 'replies'}, {t.tokens} token{'' if t.tokens == 1 else 's'}; "
        f"acceptance {acc}; {per_pass} tokens per target pass; "
        f"{tps} tokens/s (after each reply's first token)"
    )


def chat_session(
    llm: MtpLlama,
    lines: Iterator[str],
    write: Callable[[str], None],
    note: Callable[[str], None],
    sampling: Sampling = GREEDY,
    max_tokens: int = 512,
    system: str | None = None,
) -> list[dict]:
    """Read user lines from ``lines`` until it ends, ``/exit`` or Ctrl-C at the prompt; stream
    each reply with ``write`` (Ctrl-C during one ends that reply, what was shown kept as the
    assistant's turn); ``note`` gets prompts, figures and problems. Returns the conversation."""
    start = [{"role": "system", "content": system}] if system else []
    messages: list[dict] = list(start)
    while True:
        write("\n> ")
        try:
            line = next(lines, None)
        except KeyboardInterrupt:  # Ctrl-C at the prompt ends the chat, as Ctrl-D does
            write("\n")
            return messages
        if line is None:
            return messages
        text = line.strip()
        if text in ("/exit", "/quit"):
            return messages
        if text == "/stats":
            note(stats_line(llm.totals))
            continue
        if text == "/reset":
            messages = list(start)
            note("conversation reset")
            continue
        if not text:
            continue
        if text.startswith("//"):
            text = text[1:]
        elif text.startswith("/"):
            note(unknown_command_line(text))
            continue
        messages.append({"role": "user", "content": text})
        reply: list[str] = []
        chunks = None
        try:
            chunks = llm.create_chat_completion(
                messages=messages, stream=True, max_tokens=max_tokens, **sampling.completion_kwargs()
            )
            for chunk in chunks:
                piece = chunk["choices"][0]["delta"].get("content") or ""
                if piece:
                    reply.append(piece)
                    write(piece)
        except ValueError as e:  # the conversation no longer fits the context
            messages.pop()
            note(f"error: {e}; /reset to start over")
            continue
        except KeyboardInterrupt:  # Ctrl-C during a reply ends the reply, not the chat
            if chunks is not None:
                chunks.close()
            llm.reset()  # a pass cut short may have left the cache ahead of the tokens it holds
            write("\n")
            note("reply stopped; Ctrl-C at the prompt (or Ctrl-D, /exit) ends the chat")
        messages.append({"role": "assistant", "content": "".join(reply)})


__all__ = ["COMMANDS", "chat_session", "stats_line", "unknown_command_line"]
