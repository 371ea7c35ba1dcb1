"""`chat`: a line starting with / that is not a known command never reaches the model."""

from types import SimpleNamespace

import pytest

# gguf_exact.engines.python imports the bindings: imported in the tests, so that `make test-quick`
# (no bindings) collects this file and deselects it
pytestmark = pytest.mark.bindings


class FakeLlm:
    def __init__(self):
        self.sent = []
        self.totals = SimpleNamespace(requests=0)

    def create_chat_completion(self, messages, stream, max_tokens, **kw):
        self.sent.append([m["content"] for m in messages])
        return iter([{"choices": [{"delta": {"content": "ok"}}]}])


def run(lines):
    llm, notes = FakeLlm(), []
    from gguf_exact.engines.python.chat import chat_session

    messages = chat_session(llm, iter(lines), write=lambda t: None, note=notes.append)
    return llm, notes, messages


def test_unknown_slash_command_is_not_sent():
    llm, notes, messages = run(["/help\n", "/stat now\n", "hello\n"])
    line = (
        "unknown command {}: the commands are /stats, /reset, /exit, /quit (start a line with // to send it with one /)"
    )
    assert notes == [line.format("/help"), line.format("/stat")]
    assert llm.sent == [["hello"]]
    assert messages == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "ok"}]
    from gguf_exact.engines.python.chat import COMMANDS

    assert COMMANDS == ("/stats", "/reset", "/exit", "/quit")


def test_double_slash_sends_one_slash_and_known_commands_still_work():
    llm, notes, messages = run(["//etc is a folder\n", "/reset\n", "/exit\n", "never read\n"])
    assert llm.sent == [["/etc is a folder"]]
    assert notes == ["conversation reset"]
    assert messages == []
