"""Patch #24's ordered-embedding head as ggml computes it, apart from the rest of llama.cpp.

The patch's ``build_ordered_head`` (taken from the patch file itself, line for line) is compiled
against the pinned sdist's ggml headers and the bindings' own ggml libraries, and run on the CPU
for several outputs at once (as llama-server's slots ask) with random centroids, a shuffled
ordering and a Q4_0 tied head, beside the full head (``mul_mat`` of the whole tied head) in the
same graph. Its logits are held to transformers' algorithm recomputed here from the same
numbers: the same candidates (the tokens with a finite logit, 4 clusters of 10), the same pick,
-INF everywhere else, and the candidates' scores: bit for bit the full head's where the rows are
gathered as bytes (a Q4_0 row of whole I32s, width 64), near the exact dot products of the
dequantized rows where a row is not whole I32s (width 32: gathered dequantized to F32).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from gguf_exact.builds import llama_build, source_patches

N_VOCAB, N_C, TOP_K, N_OUT = 320, 32, 4, 3
PATCH = next(p for p in source_patches.PATCHES if p.id == "24").path

HARNESS = r"""
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-backend.h"
#include <cmath>
#include <cstdio>
#include <cstdint>
struct Model { ggml_tensor * masked_embd_centroids, * masked_embd_ordering, * output, * tok_embd; int64_t n_centroids, centroid_top_k; };
#include "head.inc"
static void load(ggml_tensor * t, const char * path) { FILE * f = fopen(path, "rb"); fread(t->data, 1, ggml_nbytes(t), f); fclose(f); }
int main(int, char ** argv) {
    ggml_init_params ip = { 64*1024*1024, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * cen = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, %(n_embd)d, %(n_c)d);
    ggml_tensor * ord = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, %(n_vocab)d);
    ggml_tensor * emb = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, %(n_embd)d, %(n_vocab)d);
    ggml_tensor * cur = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, %(n_embd)d, %(n_out)d);
    load(cen, argv[1]); load(ord, argv[2]); load(emb, argv[3]); load(cur, argv[4]);
    Model m = { cen, ord, emb, emb, %(n_c)d, %(top_k)d };
    ggml_tensor * logits = build_ordered_head(ctx, m, cur, %(n_vocab)d);
    ggml_tensor * full = ggml_mul_mat(ctx, emb, cur);  // the full head, as llama.cpp's build_lora_mm
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, logits);
    ggml_build_forward_expand(gf, full);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    FILE * f = fopen(argv[5], "wb"); fwrite(logits->data, 1, ggml_nbytes(logits), f); fwrite(full->data, 1, ggml_nbytes(full), f); fclose(f);
    return 0;
}
"""


def patched_function() -> str:
    """``build_ordered_head`` as the patch adds it to gemma4-assistant.cpp, with the view it uses."""
    added = [line[1:] for line in PATCH.read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]
    text = "\n".join(added)
    start = text.index("static ggml_tensor * view_row_bytes_as(")
    text.index("static ggml_tensor * build_ordered_head(", start)  # the head follows its helper
    end = text.index("\n}\n", text.index("static ggml_tensor * build_ordered_head(")) + 3
    return text[start:end].replace("const llama_model_gemma4_assistant & model", "const Model & model")


@pytest.fixture(scope="module", params=[64, 32], ids=["rows-as-bytes", "rows-dequantized"])
def harness(request, tmp_path_factory):
    """The compiled graph at a head width (``request.param``) and the width."""
    spec = importlib.util.find_spec("llama_cpp")  # its ggml libraries, without loading them into pytest
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the bindings are not installed (make setup)")
    if not shutil.which("c++"):
        pytest.fail("no C++ compiler (build-essential, which the builds need too)")
    lib = Path(spec.submodule_search_locations[0]) / "lib"
    root = tmp_path_factory.mktemp("head-graph")
    sdist = llama_build.fetch_sdist(llama_build.pinned_sdist(), log=lambda _m: None)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            rel = member.name.partition("/vendor/llama.cpp/ggml/include/")[2]
            if rel and member.isfile():
                (root / "include" / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / "include" / rel).write_bytes(tar.extractfile(member).read())
    (root / "head.inc").write_text(patched_function())
    values = dict(n_embd=request.param, n_vocab=N_VOCAB, n_c=N_C, top_k=TOP_K, n_out=N_OUT)
    (root / "t.cpp").write_text(HARNESS % values)
    cmd = ["c++", "-std=c++17", "-O1", f"-I{root / 'include'}", f"-I{root}", str(root / "t.cpp"), f"-L{lib}",
           "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{lib}", "-o", str(root / "t")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, request.param


@pytest.mark.bindings
def test_the_patched_head_scores_transformers_candidates_for_every_output(harness):
    root, n_embd = harness
    rng = np.random.default_rng(11)
    centroids = rng.normal(0, 1, (N_C, n_embd)).astype(np.float32)
    ordering = rng.permutation(N_VOCAB).astype(np.int32)
    head_q4 = quantize(rng.normal(0, 0.05, (N_VOCAB, n_embd)).astype(np.float32), GGMLQuantizationType.Q4_0)
    head = dequantize(head_q4, GGMLQuantizationType.Q4_0).reshape(N_VOCAB, n_embd).astype(np.float64)
    hidden = rng.normal(0, 1, (N_OUT, n_embd)).astype(np.float32)
    for name, array in (("c", centroids), ("o", ordering), ("e", head_q4), ("h", hidden)):
        array.tofile(root / f"{name}.bin")
    args = [str(root / f"{n}.bin") for n in "coeh"] + [str(root / "out.bin")]
    proc = subprocess.run([str(root / "t"), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logits, full = np.fromfile(root / "out.bin", dtype=np.float32).reshape(2, N_OUT, N_VOCAB)
    as_bytes = n_embd * 18 // 32 % 4 == 0  # a Q4_0 row of whole I32s
    assert as_bytes == (n_embd == 64)
    clusters = ordering.reshape(N_C, N_VOCAB // N_C)
    picks = set()
    for o in range(N_OUT):
        h = hidden[o].astype(np.float64)
        top = np.argsort(-(centroids.astype(np.float64) @ h))[:TOP_K]
        want = np.sort(clusters[top].reshape(-1))
        got = np.flatnonzero(np.isfinite(logits[o]))
        assert got.tolist() == want.tolist(), f"output {o}"
        assert len(got) == TOP_K * N_VOCAB // N_C == 40
        assert np.all(np.isneginf(np.delete(logits[o], want)))
        if as_bytes:  # Q4_0 rows against the Q8_0-rounded state, as the full head: its logits, bit for bit
            np.testing.assert_array_equal(logits[o, want], full[o, want])
            h_q8 = dequantize(quantize(hidden[o][None], GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
            np.testing.assert_allclose(logits[o, want], head[want] @ h_q8.reshape(-1), rtol=1e-4, atol=1e-4)
        else:  # F32 rows against the F32 state
            np.testing.assert_allclose(logits[o, want], head[want] @ h, rtol=1e-5, atol=1e-5)
            assert not np.array_equal(logits[o, want], full[o, want])  # the full head rounds the state to Q8_0
        assert int(logits[o].argmax()) == int(want[np.argmax(logits[o, want])])
        assert int(logits[o].argmax()) == int(want[np.argmax(head[want] @ h)])
        picks.add(int(logits[o].argmax()))
    assert len(picks) == N_OUT  # three outputs, three different drafts: each scored its own candidates
