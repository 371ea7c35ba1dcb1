"""A batch's rows give the logits that one-row decodes give, bit for bit, on repacked Q4_0 matrices.

Speculation verifies a draft of k tokens in one pass of k+1 rows, and its text equals the target
alone's because each row of that pass comes out as the row decoded alone would. On x86 the carried
patch 38m runs 2-4 rows of a repacked Q4_0 matrix (``CPU_REPACK``, 8 columns interleaved) through
one GEMV that unpacks each weight block once for all of them, where llama.cpp ran one GEMV a row
(passes of 2-4 rows 1.1-1.4x faster on an AVX2 Zen 3 at E2B and E4B; ``docs/benchmarks.md``), and
38n, with AVX2 alone, every batch's rows, in groups of at most 16 (17-34 rows: 2 or 3 groups); with
AVX-512 (38o) a batch of 5-15 rows that is not a multiple of 4 goes through it whole, and otherwise the GEMM
takes rows 4 at a time and the GEMV over rows the 2-3 left. A kernel that read
another row's activations or wrote another row's output, or a group split that lost or repeated a
row, fails here: the rows hold different tokens.

From 8 rows on llama.cpp multiplies a K-quant matrix (the Q6_K output matrix of every model here)
through a tiled kernel that adds each block otherwise than the one-row dot product did (logits 1.2e-7-1.8e-7
apart here, 9.5e-7 at E2B); patch 39h makes the dot product add each block the tiled kernel's way. Past 512
cells of cache, with flash attention on, patch 39f keeps one row's attention in one chunk as a batch's rows
are, and patch 39g takes every row count through one flash-attention kernel, so a prompt-sized pass, and a
prompt read in pieces, give the rows one-row decodes give. With 38m-38o, 39f, 39g and 39h every row of
every pass here is byte for byte the row decoded alone (a group split that lost a row left it 1.2 off), on
AVX-512 and on AVX2 (a build without AVX-512 run on the Ice Lake, ``results/s46-k-quant-rows-39h/``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint

pytestmark = pytest.mark.bindings

FOLLOW = 34  # tokens after the prompt: batches of 2-34 rows (one group of the GEMV over rows up to 16, then 2-3)


@pytest.fixture(scope="module")
def donor(tmp_path_factory) -> Path:
    """A tiny gemma4 GGUF with Google's layout: Q4_0 layer matrices that llama.cpp repacks."""
    root = tmp_path_factory.mktemp("rows")
    write_main_checkpoint(root / "src", TINY, seed=0)
    write_donor(root / "donor.gguf", root / "src", TINY)
    return root / "donor.gguf"


def decoded_rows(llm, prompt: list[int], batches: list[list[int]]) -> np.ndarray:
    """The logits of the rows after ``prompt``, decoded in these batches (each one llama_decode of
    len(batch) rows, within n_batch) from an empty cache."""
    llm.reset()
    llm.eval(prompt)
    for batch in batches:
        llm.eval(batch)
    return np.array(llm.scores[len(prompt) : llm.n_tokens], dtype=np.float32)


def test_each_row_of_a_batch_equals_that_row_decoded_alone(donor, capfd):
    import llama_cpp  # a missing binding fails the run, never skips it

    llm = llama_cpp.Llama(str(donor), n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, verbose=True)
    log = capfd.readouterr().err
    # the layer matrices are in the interleaved buffer the patched kernels read
    assert re.search(r"CPU_REPACK model buffer size =\s+3\.04 MiB", log), log[-2000:]

    prompt = llm.tokenize(b"the cat sat on the mat")
    follow = [prompt[1 + i % (len(prompt) - 1)] for i in range(FOLLOW)]
    assert len(set(follow)) >= 5

    def rows(batches: list[list[int]]) -> np.ndarray:
        return decoded_rows(llm, prompt, batches)

    alone = rows([[t] for t in follow])
    assert alone.shape == (FOLLOW, llm.n_vocab())
    assert len({a.tobytes() for a in alone}) == FOLLOW  # every row's logits differ: a mix-up shows
    for n in range(2, FOLLOW + 1):
        off = float(np.abs(rows([follow[:n]]) - alone[:n]).max())
        assert off == 0.0, f"a batch of {n} rows is {off:.2e} off one-row decodes"
    # and a pass of 3 rows after one of 2, as speculation runs them (a draft of 1, then of 2)
    assert rows([follow[:2], follow[2:5]]).tobytes() == alone[:5].tobytes()


LONG = 600  # tokens of context: the cache's 768 cells are past the 512 from which llama.cpp split one row (39f)


@pytest.fixture(scope="module")
def long_context(donor):
    """The tiny model with flash attention on (the engines' default: llama-server's ``auto``) and room for
    LONG tokens of context and 100 rows after; the LONG-token prompt; the text it repeats."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(donor),
        n_ctx=1024,
        n_batch=1024,
        n_ubatch=1024,
        n_threads=2,
        logits_all=True,
        flash_attn=True,
        verbose=False,
    )
    text = llm.tokenize(b"the cat sat on the mat and then the dog ran to the park ")
    prompt = (text * (LONG // len(text) + 1))[:LONG]
    return llm, prompt, text


def test_past_512_cells_a_batch_with_flash_attention_equals_one_row_decodes(long_context):
    """Flash attention at a context past 512 cells. llama.cpp split one row's cache over the threads
    there and reduced their partial softmaxes, where a batch's rows each go through one chunk; with the F16 accumulators of that path a 2-5-row batch
    came out up to 2.2e-2 off one-row decodes here. Patch 39f computes one row as a batch's row."""
    llm, prompt, text = long_context
    follow = [text[1 + i % (len(text) - 1)] for i in range(8)]

    def rows(batches: list[list[int]]) -> np.ndarray:
        return decoded_rows(llm, prompt, batches)

    alone = rows([[t] for t in follow])
    assert len({a.tobytes() for a in alone}) == len(follow)
    for n in range(2, len(follow) + 1):
        off = float(np.abs(rows([follow[:n]]) - alone[:n]).max())
        assert off == 0.0, f"a batch of {n} rows after {LONG} tokens is {off:.2e} off one-row decodes"


PROMPT_SIZED = (64, 100)  # rows of one pass from which llama.cpp took flash attention's tiled kernel (before 39g)
CHECKPOINT_PIECES = ([LONG - 4 - 64, 64, 4], [LONG - 4, 4])  # llama-server's cuts before a prompt's end (n_ubatch 64)


def test_a_prompt_sized_batch_and_a_prompt_read_in_pieces_give_the_rows_one_row_decodes_give(long_context):
    """With flash attention llama.cpp took a pass of 64 rows or more through a tiled kernel that sums in
    F32 and a smaller one through a chunk kernel that accumulates V in F16: a prompt, or a decode row
    sharing llama-server's batch with another slot's prompt, came out 0.15-0.45 off the same row
    decoded alone here, and the same prompt read in the pieces llama-server cuts to checkpoint its
    sliding-window cache (the last 4 + n_ubatch tokens, then the last 4) left the rows after it
    0.05-0.15 off. Patch 39g takes every row through the tiled kernel, scoring each as one dot
    product, and 39h the output matrix's rows alike: rows of any pass byte for byte."""
    llm, prompt, text = long_context
    follow = [text[1 + i % (len(text) - 1)] for i in range(max(PROMPT_SIZED))]

    alone = decoded_rows(llm, prompt, [[t] for t in follow])
    assert len({a.tobytes() for a in alone}) == len(follow)
    for n in PROMPT_SIZED:
        off = float(np.abs(decoded_rows(llm, prompt, [follow[:n]]) - alone[:n]).max())
        assert off == 0.0, f"a batch of {n} rows after {LONG} tokens is {off:.2e} off one-row decodes"
    for pieces in CHECKPOINT_PIECES:
        llm.reset()
        start = 0
        for size in pieces:
            llm.eval(prompt[start : start + size])
            start += size
        assert start == LONG and llm.n_tokens == LONG
        for t in follow[:16]:
            llm.eval([t])
        after = np.array(llm.scores[LONG : llm.n_tokens], dtype=np.float32)
        off = float(np.abs(after - alone[:16]).max())
        assert off == 0.0, f"the prompt read in pieces of {pieces} leaves rows {off:.2e} off"


# llama_ftype value of each K-quant mix whose matrices take the dot products 39h changes, and its layer matrices' type
K_QUANT_MIXES = {"Q5_K_S": (16, "Q5_K"), "Q6_K": (18, "Q6_K")}


@pytest.mark.parametrize("mix", sorted(K_QUANT_MIXES))
def test_every_row_of_a_k_quant_model_pass_equals_that_row_decoded_alone(donor, tmp_path, mix):
    """A user's model quantized to K-quants (here by the bindings' own llama-quantize): from 8 rows
    llama.cpp takes its matrices through the tiled kernel, which adds each 256-value block as one
    integer sum times the block's scales, where the one-row dot product summed 8 float lanes; rows
    of a pass of 8 or more came out 1.5e-7 to 6.0e-2 off one-row decodes here, past greedy
    near-ties. Patch 39h adds each block the tiled kernel's way in the dot product too."""
    import llama_cpp
    from gguf import GGUFReader

    ftype, matrix_type = K_QUANT_MIXES[mix]
    quantized = tmp_path / f"{mix}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the donor's layer matrices are Q4_0
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(donor).encode(), str(quantized).encode(), params) == 0
    ffn = [t for t in GGUFReader(quantized).tensors if ".ffn_" in t.name and len(t.shape) == 2]
    assert len(ffn) == 3 * TINY.n_layer and {t.tensor_type.name for t in ffn} == {matrix_type}
    llm = llama_cpp.Llama(
        str(quantized), n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, verbose=False
    )

    prompt = llm.tokenize(b"the cat sat on the mat")
    follow = [prompt[1 + i % (len(prompt) - 1)] for i in range(FOLLOW)]
    alone = decoded_rows(llm, prompt, [[t] for t in follow])
    assert len({a.tobytes() for a in alone}) == FOLLOW
    for n in range(2, FOLLOW + 1):
        off = float(np.abs(decoded_rows(llm, prompt, [follow[:n]]) - alone[:n]).max())
        assert off == 0.0, f"{mix}: a batch of {n} rows is {off:.2e} off one-row decodes"
