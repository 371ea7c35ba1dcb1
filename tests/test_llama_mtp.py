"""A converted gemma4-assistant drafter loads in llama.cpp beside its gemma4 target and runs."""

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from gguf_exact.drafter.convert import convert_drafter  # noqa: E402
from gguf_exact.errors import GgufExactError  # noqa: E402
from gguf_exact.speculative.llama_mtp import TargetWithDrafter  # noqa: E402
from gguf_exact.tiny.models import TinyTarget, write_tiny_drafter, write_tiny_target  # noqa: E402

N_VOCAB = TinyTarget().n_vocab


def make_pair(root: Path) -> tuple[Path, Path]:
    target = write_tiny_target(root / "target.gguf", seed=0)
    write_tiny_drafter(root / "drafter_hf", seed=0)
    convert_drafter(root / "drafter_hf", root / "drafter.gguf", vocab_from=target)
    return target, root / "drafter.gguf"


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    return make_pair(tmp_path)


def in_vocab(ids: list[int]) -> bool:
    return all(isinstance(t, int) and 0 <= t < N_VOCAB for t in ids)


def test_target_and_drafter_run_deterministically(pair):
    target, drafter = pair
    with TargetWithDrafter(target, drafter, n_ctx=512, n_threads=2) as m:
        assert m.n_vocab == N_VOCAB
        prompt = m.tokenize("def f(x): return x + 1")
        assert prompt[0] == 1 and len(prompt) > 1 and in_vocab(prompt)

        greedy = m.target_greedy(prompt, 8)
        assert len(greedy) == 8 and in_vocab(greedy)
        assert m.target_greedy(prompt, 8) == greedy

        drafted = m.draft(prompt, 4)
        assert len(drafted) == 4 and in_vocab(drafted)
        assert m.draft(prompt, 4) == drafted
        # decoding with the drafter left the target usable and unchanged
        assert m.target_greedy(prompt, 8) == greedy


def test_prompt_longer_than_a_batch(pair):
    target, drafter = pair
    prompt = [1] + [3 + i % (N_VOCAB - 3) for i in range(40)]
    with TargetWithDrafter(target, drafter, n_ctx=128, n_threads=2, n_batch=16) as m:
        drafted = m.draft(prompt, 3)
        assert len(drafted) == 3 and in_vocab(drafted)
        greedy = m.target_greedy(prompt, 4)
        assert len(greedy) == 4 and in_vocab(greedy)
        with pytest.raises(GgufExactError, match="exceed n_ctx"):
            m.target_greedy(prompt, m.n_ctx)
        with pytest.raises(GgufExactError, match="outside the vocab"):
            m.draft([1, N_VOCAB], 2)


def test_drafter_of_another_width_is_refused(pair, tmp_path):
    _, drafter = pair
    wide = write_tiny_target(tmp_path / "target256.gguf", seed=0, spec=TinyTarget(n_embd=256))
    with pytest.raises(GgufExactError, match=r"n_embd_out\) 128 does not match the target's n_embd 256"):
        TargetWithDrafter(wide, drafter)


def test_target_in_drafter_slot_is_refused(pair):
    target, _ = pair
    with pytest.raises(GgufExactError, match="expected 'gemma4-assistant'"):
        TargetWithDrafter(target, target)
