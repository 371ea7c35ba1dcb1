"""A converted gemma4-assistant drafter loads in llama.cpp beside its gemma4 target and runs."""

from pathlib import Path

import pytest

from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.engines.python.runner import Runner, live_contexts
from gguf_exact.errors import GgufExactError
from gguf_exact.tiny.models import TinyTarget, write_tiny_drafter, write_tiny_target

pytestmark = pytest.mark.bindings

N_VOCAB = TinyTarget().n_vocab


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    target = write_tiny_target(root / "target.gguf", seed=0)
    write_tiny_drafter(root / "drafter_hf", seed=0)
    convert_drafter(root / "drafter_hf", root / "drafter.gguf", vocab_from=target)
    return target, root / "drafter.gguf"


def test_converted_drafter_drafts_beside_the_target(pair):
    target, drafter = pair
    with Runner(target, drafter, n_ctx=512, n_threads=2) as r:
        assert r.n_vocab == N_VOCAB
        prompt = r.tokenize("def f(x): return x + 1")
        assert prompt[0] == 1 and len(prompt) > 1
        alone = r.generate(prompt, 12, n_max=0)
        first = r.generate(prompt, 12, n_max=3)
        again = r.generate(prompt, 12, n_max=3)
    assert live_contexts() == 0
    assert len(first.tokens) == 12 and all(0 <= t < N_VOCAB for t in first.tokens)
    assert first.tokens == again.tokens == alone.tokens  # speculation never changes the text
    assert first.drafts_generated > 0 and first.drafts_generated == again.drafts_generated
    assert first.n_tokens == first.target_passes + first.drafts_accepted


def test_prompt_longer_than_a_batch(pair):
    target, drafter = pair
    prompt = [1] + [3 + i % (N_VOCAB - 3) for i in range(40)]
    with Runner(target, drafter, n_ctx=128, n_threads=2, n_batch=16) as r:
        g = r.generate(prompt, 6, n_max=2)
        assert g.n_tokens == 6 and g.tokens == r.generate(prompt, 6, n_max=0).tokens


def test_target_in_the_drafter_slot_is_refused(pair):
    target, _ = pair
    with pytest.raises(GgufExactError, match="architecture is 'gemma4', expected 'gemma4-assistant'"):
        Runner(target, target)
    assert live_contexts() == 0
