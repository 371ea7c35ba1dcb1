"""llama-cpp-python's private names: spelled in one adapter module only, for the version it was written against."""

import inspect
import re
from pathlib import Path

import pytest

import gguf_exact
from gguf_exact.errors import BuildError

ROOT = Path(gguf_exact.__file__).parent
ADAPTER = ROOT / "engines" / "python" / "llama_adapter.py"
PRIVATE = re.compile(r"\._(ctx|batch|model|n_ctx|n_vocab|stack|requires_eval|input_ids|llama_proxy)\b")


def private_uses(path: Path, text: str | None = None) -> list[str]:
    lines = (path.read_text() if text is None else text).splitlines()
    return [f"{path.relative_to(ROOT)}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if PRIVATE.search(line)]


def test_only_the_adapter_touches_llama_cpp_pythons_private_names():
    found = [use for p in sorted(ROOT.rglob("*.py")) if p != ADAPTER for use in private_uses(p)]
    assert found == []
    assert len(private_uses(ADAPTER)) >= 9  # each of the nine names, in the adapter
    # the check sees a use slipped in elsewhere
    broken = private_uses(ROOT / "engines" / "python" / "runner.py", "vocab = self.llm._model.vocab\nx = llm.n_ctx()\n")
    assert broken == ["engines/python/runner.py:1: vocab = self.llm._model.vocab"]


@pytest.mark.bindings
def test_the_installed_llama_cpp_python_is_the_one_the_adapter_was_written_for():
    from gguf_exact.engines.python.llama_adapter import WRITTEN_FOR, check_version, installed_version

    assert installed_version() == WRITTEN_FOR == "0.3.36"
    check_version()
    with pytest.raises(BuildError, match=r"^llama-cpp-python 0\.3\.37 is installed; .* written against 0\.3\.36"):
        check_version("0.3.37")


@pytest.mark.bindings
def test_upstream_still_has_each_private_name_the_adapter_uses():
    import llama_cpp
    from llama_cpp.server import app

    from gguf_exact.engines.python.llama_adapter import PRIVATE_ATTRIBUTES

    source = inspect.getsource(llama_cpp.Llama)
    missing = [name for name in PRIVATE_ATTRIBUTES if f"self.{name}" not in source]
    assert missing == [] and hasattr(app, "_llama_proxy")


@pytest.mark.bindings
def test_a_grammar_llama_cpp_refuses_is_a_value_error_not_a_crash(tiny):
    """llama-cpp-python 0.3.36 puts the NULL sampler llama.cpp returns for a grammar it refuses
    into the chain, and the process dies (SIGSEGV) on the first token: that happened to the
    Python engine for a request's `grammar` and for any grammar made from a schema or tools."""
    import llama_cpp
    from llama_cpp import LlamaGrammar

    from gguf_exact.engines.python.llama_adapter import LlamaAdapter

    assert "grammar: Optional[LlamaGrammar] = None" in inspect.getsource(llama_cpp.Llama._init_sampler)
    llm = LlamaAdapter(str(tiny / "target.gguf"), n_ctx=64, verbose=False)
    try:
        assert llm.grammar_parses('root ::= "a" "b"') and not llm.grammar_parses('x ::= "a"')
        for refused in ("root ::= (", 'root ::= "a"{2001}', 'x ::= "a"'):
            assert not llm.grammar_parses(refused)
            with pytest.raises(ValueError, match="does not parse as GBNF"):
                llm.create_completion("abc", max_tokens=2, grammar=LlamaGrammar.from_string(refused, verbose=False))
        out = llm.create_completion(
            "abc", max_tokens=4, temperature=0, grammar=LlamaGrammar.from_string('root ::= "ab"')
        )
        assert out["choices"][0]["text"] == "ab"
    finally:
        llm.close()
