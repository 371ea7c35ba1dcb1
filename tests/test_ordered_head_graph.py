"""Patch #24's ordered-embedding head as ggml computes it, apart from the rest of llama.cpp.

The patch's ``build_ordered_head`` (taken from the patch file itself, line for line) is compiled
against the pinned sdist's ggml headers and the bindings' own ggml libraries, and run on the CPU
for several outputs at once (as llama-server's slots ask) with random centroids, a shuffled
ordering and a Q4_0 tied head. Its logits are held to transformers' algorithm recomputed here
from the same numbers: the same candidates (the tokens with a finite logit, 4 clusters of 10),
the same pick, the candidates' scores, and -INF everywhere else.
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

N_EMBD, N_VOCAB, N_C, TOP_K, N_OUT = 64, 320, 32, 4, 3
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
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, logits);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    FILE * f = fopen(argv[5], "wb"); fwrite(logits->data, 1, ggml_nbytes(logits), f); fclose(f);
    return 0;
}
"""


def patched_function() -> str:
    """``build_ordered_head`` as the patch adds it to gemma4-assistant.cpp."""
    added = [line[1:] for line in PATCH.read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]
    text = "\n".join(added)
    start = text.index("static ggml_tensor * build_ordered_head(")
    end = text.index("\n}\n", start) + 3
    return text[start:end].replace("const llama_model_gemma4_assistant & model", "const Model & model")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
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
    values = dict(n_embd=N_EMBD, n_vocab=N_VOCAB, n_c=N_C, top_k=TOP_K, n_out=N_OUT)
    (root / "t.cpp").write_text(HARNESS % values)
    cmd = ["c++", "-std=c++17", "-O1", f"-I{root / 'include'}", f"-I{root}", str(root / "t.cpp"), f"-L{lib}",
           "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{lib}", "-o", str(root / "t")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.bindings
def test_the_patched_head_scores_transformers_candidates_for_every_output(harness):
    rng = np.random.default_rng(11)
    centroids = rng.normal(0, 1, (N_C, N_EMBD)).astype(np.float32)
    ordering = rng.permutation(N_VOCAB).astype(np.int32)
    head_q4 = quantize(rng.normal(0, 0.05, (N_VOCAB, N_EMBD)).astype(np.float32), GGMLQuantizationType.Q4_0)
    head = dequantize(head_q4, GGMLQuantizationType.Q4_0).reshape(N_VOCAB, N_EMBD).astype(np.float64)
    hidden = rng.normal(0, 1, (N_OUT, N_EMBD)).astype(np.float32)
    for name, array in (("c", centroids), ("o", ordering), ("e", head_q4), ("h", hidden)):
        array.tofile(harness / f"{name}.bin")
    args = [str(harness / f"{n}.bin") for n in "coeh"] + [str(harness / "out.bin")]
    proc = subprocess.run([str(harness / "t"), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logits = np.fromfile(harness / "out.bin", dtype=np.float32).reshape(N_OUT, N_VOCAB)
    clusters = ordering.reshape(N_C, N_VOCAB // N_C)
    picks = set()
    for o in range(N_OUT):
        h = hidden[o].astype(np.float64)
        top = np.argsort(-(centroids.astype(np.float64) @ h))[:TOP_K]
        want = np.sort(clusters[top].reshape(-1))
        got = np.flatnonzero(np.isfinite(logits[o]))
        assert got.tolist() == want.tolist(), f"output {o}"
        assert len(got) == TOP_K * N_VOCAB // N_C == 40
        np.testing.assert_allclose(logits[o, want], head[want] @ h, rtol=1e-5, atol=1e-5)
        assert np.all(np.isneginf(np.delete(logits[o], want)))
        assert int(logits[o].argmax()) == int(want[np.argmax(head[want] @ h)])
        picks.add(int(logits[o].argmax()))
    assert len(picks) == N_OUT  # three outputs, three different drafts: each scored its own candidates
