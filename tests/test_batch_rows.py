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
prompt read in pieces, give the rows one-row decodes give. A repacked Q4_K matrix's GEMM (4 rows at a time)
now scales each super block as its GEMV does (39i), and one row of an F32/F16/BF16 matrix goes through the
kernel a batch's rows take (39j; every Gemma 4 has the F16 ``per_layer_model_proj``), and Q3_K and IQ4_XS
dot products add each block as the tiled kernel does (39m), as do Q2_K's (39n, with its repacked GEMM as
39i's) and the IQ2, IQ3 and IQ1 types' (39o). With 38m-38o, 39f-39j and 39m-39o every row of every pass here is
byte for byte the row decoded alone (a group split that lost a row left it 1.2 off), in the common file types
and one of each other kernel llama.cpp's quantizer writes, on the tiny model and on one of E2B's layer shapes,
on AVX-512 and on AVX2 (a build without AVX-512 run on the Ice Lake, ``results/s47-every-file-type-rows-39i-39j/``;
Q4_1, Q5_0, Q5_1, IQ4_NL, Q3_K_L, Q4_K_S, Q2_K_S, IQ3_S, IQ3_XS and IQ2_S files too:
``results/s48-q2-k-and-the-other-file-types/``).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gguf_exact.tiny.main_model import E2B, TINY, write_donor, write_main_checkpoint

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


def assert_every_pass_alike(llm, n_follow: int, label: str = "") -> tuple[list[int], list[int], np.ndarray]:
    """Decodes ``n_follow`` tokens after a prompt one at a time, then in one pass of each 2..n_follow rows:
    every pass's rows must be the one-row decodes' byte for byte. Returns the prompt, the tokens, the rows."""
    prompt = llm.tokenize(b"the cat sat on the mat")
    follow = [prompt[1 + i % (len(prompt) - 1)] for i in range(n_follow)]
    alone = decoded_rows(llm, prompt, [[t] for t in follow])
    assert alone.shape == (n_follow, llm.n_vocab())
    assert len({a.tobytes() for a in alone}) == n_follow  # every row's logits differ: a mix-up shows
    for n in range(2, n_follow + 1):
        off = float(np.abs(decoded_rows(llm, prompt, [follow[:n]]) - alone[:n]).max())
        assert off == 0.0, f"{label}a batch of {n} rows is {off:.2e} off one-row decodes"
    return prompt, follow, alone


def test_each_row_of_a_batch_equals_that_row_decoded_alone(donor, capfd):
    import llama_cpp  # a missing binding fails the run, never skips it

    llm = llama_cpp.Llama(str(donor), n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True, verbose=True)
    log = capfd.readouterr().err
    # the layer matrices are in the interleaved buffer the patched kernels read
    assert re.search(r"CPU_REPACK model buffer size =\s+3\.04 MiB", log), log[-2000:]

    prompt, follow, alone = assert_every_pass_alike(llm, FOLLOW)
    assert len(set(follow)) >= 5
    # and a pass of 3 rows after one of 2, as speculation runs them (a draft of 1, then of 2)
    assert decoded_rows(llm, prompt, [follow[:2], follow[2:5]]).tobytes() == alone[:5].tobytes()


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


# Each file type people download, as the bindings' own llama-quantize writes it from the Q4_0 donor:
# its llama_ftype (None: the donor as built, Google's layout) and the type most of its MLP matrices take;
# one file type per kernel (Q2_K_S multiplies as Q2_K, IQ3_M and IQ3_XS as IQ3_S, IQ2_S as IQ2_XS).
FILE_TYPES = {
    "Q4_0": (None, "Q4_0"),
    "Q2_K": (10, "Q2_K"),
    "Q3_K_M": (12, "Q3_K"),
    "IQ4_XS": (30, "IQ4_XS"),
    "Q4_K_M": (15, "Q4_K"),
    "Q5_K_S": (16, "Q5_K"),
    "Q5_K_M": (17, "Q5_K"),
    "Q6_K": (18, "Q6_K"),
    "Q8_0": (7, "Q8_0"),
    "F16": (1, "F16"),
    "BF16": (32, "BF16"),
    "F32": (0, "F32"),
    "IQ3_M": (27, "IQ3_S"),
    "IQ3_XXS": (23, "IQ3_XXS"),
    "IQ2_XXS": (19, "IQ2_XXS"),
    "IQ2_XS": (20, "IQ2_XS"),
    "IQ2_M": (29, "IQ2_S"),
    "IQ1_S": (24, "IQ1_S"),
    "IQ1_M": (31, "IQ1_M"),
}
# llama.cpp quantizes these only with an importance matrix: each gets one of ones (every column alike).
NEEDS_IMATRIX = {"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_M", "IQ1_S", "IQ1_M"}
# One of Gemma 4 E2B's layer shapes at full width (1536 wide, MLP 6144, 8 heads of 256/512, per-layer
# inputs of 256) with two layers and the tiny vocabulary: each matrix many blocks and super blocks long.
E2B_SHAPED = replace(E2B, n_layer=2, n_kv_shared=0, n_vocab=TINY.n_vocab)
SHAPES = {"tiny": (TINY, FOLLOW), "e2b-shaped": (E2B_SHAPED, 17)}  # and the rows after the prompt


@pytest.fixture(scope="module")
def e2b_shaped(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rows-e2b-shaped")
    write_main_checkpoint(root / "src", E2B_SHAPED, seed=0)
    write_donor(root / "donor.gguf", root / "src", E2B_SHAPED)
    return root / "donor.gguf"


def uniform_importance(tensors) -> ctypes.Array:
    """An importance matrix of ones for every matrix: llama_model_imatrix_data entries, the last all null
    as llama.cpp reads the list. The column arrays ride on the array (``_columns``) so they outlive the call."""
    import llama_cpp

    matrices = [t for t in tensors if len(t.shape) == 2]
    entries = (llama_cpp.llama_model_imatrix_data * (len(matrices) + 1))()
    columns = [(ctypes.c_float * int(t.shape[0]))(*[1.0] * int(t.shape[0])) for t in matrices]
    for entry, matrix, ones in zip(entries, matrices, columns):
        entry.name, entry.size = matrix.name.encode(), len(ones)
        entry.data = ctypes.cast(ones, ctypes.POINTER(ctypes.c_float))
    entries._columns = columns
    return entries


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("file_type", list(FILE_TYPES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_row_of_a_pass_equals_that_row_decoded_alone_in_every_file_type(
    request, tmp_path, shape, file_type, flash_attn
):
    """A user's model in any common file type. llama.cpp multiplied several ways by the rows of a pass:
    K-quant matrices from 8 rows through a tiled kernel adding each block otherwise than the one-row
    dot product (39h), repacked Q4_K matrices from 4 rows through a GEMM scaling each sub block pair
    where the GEMV scales each super block once (39i), and one row of an F32/F16/BF16 matrix (every
    Gemma 4's F16 ``per_layer_model_proj``; the F16 KV cache with flash attention off) through
    another dot product than two rows or more (39j); Q3_K and IQ4_XS matrices from 8 rows as K-quants did
    before 39h (39m: 2.5e-2 and 3.0e-2 on the E2B shape); Q2_K's GEMM as Q4_K's and its dot product as
    39h's (39n: 1.8e-2 from 4 rows, 1.5e-1 from 8); the IQ2, IQ3 and IQ1 dot products as 39h's (39o: 1.6e-2
    to 8.0e-2 from 8). Before 39i and 39j the E2B-shaped model's rows came
    out 2.0e-2 (Q4_K_M from 4 rows), 1.4e-2 (Q5_K_S from 2), 8.9e-3 (Q8_0 from 12), 2.1e-3 (F16 from 2)
    and 6.2e-4 (F32 from 3) off one-row decodes with flash attention off, 1.3e-2 (Q5_K_M from 2) with it
    on; now every row of every pass is byte for byte."""
    import llama_cpp
    from gguf import GGUFReader

    spec, follow_rows = SHAPES[shape]
    donor = request.getfixturevalue("donor" if shape == "tiny" else "e2b_shaped")
    ftype, mlp_type = FILE_TYPES[file_type]
    model = donor
    if ftype is not None:
        model = tmp_path / f"{file_type}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.allow_requantize = True  # the donor's layer matrices are Q4_0
        params.nthread = 2
        if file_type in NEEDS_IMATRIX:
            ones = uniform_importance(GGUFReader(donor).tensors)
            params.imatrix = ctypes.cast(ones, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        assert llama_cpp.llama_model_quantize(str(donor).encode(), str(model).encode(), params) == 0
    tensors = GGUFReader(model).tensors
    mlp = [t for t in tensors if ".ffn_" in t.name and len(t.shape) == 2]
    assert len(mlp) == 3 * spec.n_layer
    assert sum(t.tensor_type.name == mlp_type for t in mlp) > len(mlp) // 2, [t.tensor_type.name for t in mlp]
    proj = next(t for t in tensors if t.name == "per_layer_model_proj.weight")
    assert proj.tensor_type.name == "F16"  # 39j's matrix, in every file type
    llm = llama_cpp.Llama(
        str(model),
        n_ctx=128,
        n_batch=64,
        n_ubatch=64,
        n_threads=2,
        logits_all=True,
        flash_attn=flash_attn,
        verbose=False,
    )

    assert_every_pass_alike(llm, follow_rows, f"{shape} {file_type}: ")
