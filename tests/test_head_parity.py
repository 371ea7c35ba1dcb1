"""The drafter's ordered-embedding head in llama.cpp (patch #24) against transformers' own.

A tiny assistant with random centroids and a shuffled token ordering (4 of 32 clusters, 40
candidates of 320 tokens) is converted and drafted with through the bindings at several
positions, tokens and hidden inputs. Its post-projection is the identity on the drafter's
width (stored F32, so the ``h_nextn`` llama.cpp returns is the step's final hidden state,
bit for bit), which lets each step's head be recomputed from what llama.cpp saw:

- in numpy, as ``Gemma4AssistantMaskedEmbedder.forward`` does it (always);
- by transformers itself, ``Gemma4AssistantForCausalLM.from_pretrained`` on the same
  checkpoint, its ``masked_embedding`` on those hidden states (in the parity venv that
  ``make parity`` builds and then runs this file; skipped without it, since ``make test``
  builds no torch).

Each must give the same candidate set (the tokens with a finite logit) and the same
drafted token; the same drafter without its head (``convert --full-head``) scores all 320
tokens, and the ordered head's candidates' logits are the full head's at those tokens (both
multiply the Q4_0 rows against the state rounded to Q8_0), so its pick is the full head's best
among the candidates.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gguf_exact.core import bf16
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.tiny.models import TinyDrafter, drafter_config, drafter_tensors, write_checkpoint, write_tiny_target

REPO = Path(__file__).resolve().parent.parent
PARITY_PYTHON = REPO / "build/parity-venv/bin/python"
SPEC = TinyDrafter()
WIDTH, VOCAB, CLUSTERS, TOP_K = SPEC.hidden_size, SPEC.vocab_size, SPEC.num_centroids, SPEC.centroid_top_k
# 4 drafts of 3 steps each, each draft one target position further: 12 drafter steps
STEPS = [(token, draft_step) for token in (17, 100, 211, 305) for draft_step in range(3)]


def parity_checkpoint(folder: Path) -> Path:
    """The bf16-step tiny drafter (every Q4_0 value its source's, bit for bit) with an identity
    post-projection on its first ``WIDTH`` rows; the other rows random, so the matrix is off
    the grid and ``off_grid=f32`` keeps it exact in F32."""
    tensors = drafter_tensors(SPEC, seed=3, step_kind="bf16")
    rng = np.random.default_rng(4)
    post = np.vstack([np.eye(WIDTH), rng.normal(0, 0.02, (SPEC.backbone_hidden_size - WIDTH, WIDTH))])
    tensors["post_projection.weight"] = bf16.from_f32(post.astype(np.float32))
    return write_checkpoint(folder, drafter_config(SPEC), tensors)


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """Per drafter step: (final hidden state, llama.cpp's logits), with the head and without it, each
    also loaded with llama.cpp's repacked CPU matrices off (``-plain``: ``use_extra_bufts`` false)."""
    import llama_cpp  # the tests are marked bindings: missing bindings fail them, never skip
    from llama_cpp import llama_cpp_ext

    from gguf_exact.engines.python.runner import Runner

    root = tmp_path_factory.mktemp("head-parity")
    target = write_tiny_target(root / "target.gguf", seed=0)
    hf = parity_checkpoint(root / "drafter-hf")
    with_head = convert_drafter(hf, root / "drafter.gguf", target, off_grid="f32").path
    full = convert_drafter(hf, root / "full.gguf", target, off_grid="f32", ordered_head=False).path
    runs = {}
    default_params = llama_cpp.llama_model_default_params

    def plain_params():  # every matrix in a plain CPU buffer: the full head multiplied as the ordered one is
        params = default_params()
        params.use_extra_bufts = False
        return params

    for name, path in (("head", with_head), ("full", full), ("head-plain", with_head), ("full-plain", full)):
        rows = []
        with pytest.MonkeyPatch.context() as mp:
            if name.endswith("-plain"):
                mp.setattr(llama_cpp, "llama_model_default_params", plain_params)
            r = Runner(target, path, n_ctx=256, n_threads=2)
        with r:
            r.llm.eval(list(range(300, 316)))  # a target cache for the drafter to read
            d = r.drafter
            rng = np.random.default_rng(7)
            drafted = 0
            for token, draft_step in STEPS:
                if draft_step:  # a chained step: after the token the last one drafted
                    token = drafted
                else:  # a fresh draft one position further, from a hidden state of the target's width
                    r.llm.eval([token])
                    pos = r.llm.n_tokens
                    h = rng.normal(0, 1, d.n_embd).astype(np.float32)
                ctypes.memmove(d.batch.embd, h.ctypes.data, d.n_embd * 4)
                d.batch.token[0] = token
                d.batch.pos[0] = pos  # shared KV: a draft's steps sit at one position
                assert llama_cpp.llama_decode(d.ctx, d.batch) == 0
                logits = np.array(d._logits_row(), dtype=np.float32)
                nextn = llama_cpp_ext.llama_get_embeddings_nextn_ith(d.ctx, 0)
                h = np.ctypeslib.as_array(nextn, shape=(d.n_embd,)).copy()
                rows.append((h[:WIDTH].copy(), logits))
                drafted = int(logits.argmax())
        runs[name] = rows
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    embd = next(t for t in GGUFReader(with_head).tensors if t.name == "token_embd.weight")
    rows = dequantize(np.asarray(embd.data), GGMLQuantizationType.Q4_0).reshape(VOCAB, WIDTH)
    return {"hf": hf, **runs, "tied_head": rows}


def reference_head(hidden: np.ndarray, tensors: dict[str, np.ndarray], tied_head: np.ndarray) -> np.ndarray:
    """``Gemma4AssistantMaskedEmbedder.forward`` in numpy (float64), -inf where it fills, on the
    tied head as the GGUF holds it (exact Q4_0: each value its source's in bf16, with the
    step's fp16 precision beyond it)."""
    centroids = bf16.to_f32(tensors["masked_embedding.centroids.weight"]).astype(np.float64)
    embed = tied_head.astype(np.float64)
    clusters = tensors["masked_embedding.token_ordering"].reshape(CLUSTERS, VOCAB // CLUSTERS)
    top = np.argsort(-(centroids @ hidden))[:TOP_K]
    candidates = clusters[top].reshape(-1)
    out = np.full(VOCAB, -np.inf)
    out[candidates] = embed[candidates] @ hidden
    return out


def q8_0_rounded(hidden: np.ndarray) -> np.ndarray:
    """The state as llama.cpp's CPU multiplies it against Q4_0 rows: rounded to Q8_0."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    q8 = GGMLQuantizationType.Q8_0
    return dequantize(quantize(hidden.astype(np.float32)[None], q8), q8).reshape(-1).astype(np.float64)


def assert_same_draft(
    ours: np.ndarray, theirs: np.ndarray, tied_head: np.ndarray, hidden: np.ndarray, step: int
) -> bool:
    """Our drafted token is ``theirs``' (logits over the same candidates, computed on the unrounded
    state) unless their best two are closer than llama.cpp's Q8_0 rounding of the state can move
    a logit (for each token the sum of its row's |w| times the state's rounding error): then ours
    need only be within that of their best. True where the draft was decided, False at a near-tie."""
    cand = np.flatnonzero(np.isfinite(theirs) & (theirs > theirs.min()))
    bound = np.abs(tied_head[cand].astype(np.float64)) @ np.abs(hidden.astype(np.float64) - q8_0_rounded(hidden))
    first, second = np.argsort(-theirs[cand])[:2]
    decided = theirs[cand][first] - theirs[cand][second] > bound[first] + bound[second]
    if decided:
        assert int(ours.argmax()) == int(cand[first]), f"step {step}"
    else:
        assert theirs[int(ours.argmax())] >= theirs[cand][first] - 2 * bound.max(), f"step {step}"
    return bool(decided)


def candidates(logits: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.isfinite(logits) & (logits > -1e30)).tolist())


@pytest.mark.bindings
def test_llama_cpp_scores_the_same_candidates_as_transformers_algorithm(drafts):
    tensors = drafter_tensors(SPEC, seed=3, step_kind="bf16")
    picked, decided = set(), 0
    for i, (hidden, logits) in enumerate(drafts["head"]):
        want = reference_head(hidden.astype(np.float64), tensors, drafts["tied_head"])
        assert candidates(logits) == candidates(want), f"step {i}"
        assert len(candidates(logits)) == TOP_K * VOCAB // CLUSTERS == 40
        decided += assert_same_draft(logits, want, drafts["tied_head"], hidden, i)
        finite = np.isfinite(want)
        # the candidates' rows multiplied as the full head does: Q4_0 against the state rounded to Q8_0
        scores = drafts["tied_head"][finite].astype(np.float64) @ q8_0_rounded(hidden)
        np.testing.assert_allclose(logits[finite], scores, rtol=1e-5, atol=1e-5)
        # and against the unrounded state: apart by at most what that rounding can move each logit (its
        # row's |w| times the state's rounding error; a fixed 1% of the largest logit held on AVX2 but
        # not on an AVX-512 Xeon, whose drafter state rounds differently: 1.2% on one of 40)
        rounding = np.abs(drafts["tied_head"][finite].astype(np.float64)) @ np.abs(hidden - q8_0_rounded(hidden))
        assert np.all(np.abs(logits[finite] - want[finite]) <= rounding + 1e-5), f"step {i}"
        assert np.all(np.isneginf(logits[~finite]))  # every other token: the lowest logit
        picked.add(int(logits.argmax()))
    assert len(picked) >= 4  # the positions drafted different tokens
    # on a 2-core AMD EPYC (AVX2) two near-ties, steps 0 and 10: best two 5.3e-4 and 2.6e-3 apart, the
    # rounding's bound 6.4e-3 and 7.6e-3 (at step 0 the rounded state drafts the other of the two, as
    # llama.cpp's full head does); the chained steps' states follow the drafts, so another CPU's rounding
    # decides others (a Sapphire Rapids Xeon, AVX-512: three near-ties). Most steps are decided: the
    # draft check above is not vacuous
    assert decided >= len(STEPS) * 2 // 3


@pytest.mark.bindings
@pytest.mark.parametrize("load", ["", "-plain"], ids=["repacked", "plain"])
def test_without_the_head_every_token_is_scored_and_the_head_picks_its_best_candidate(drafts, load):
    for i, ((h_head, with_head), (h_full, full)) in enumerate(zip(drafts["head" + load], drafts["full" + load])):
        if i % 3:  # chained steps follow each file's own draft; compare each draft's first step
            continue
        np.testing.assert_array_equal(h_head, h_full)  # the same layers, the same hidden state
        assert np.isfinite(full).all() and len(candidates(full)) == VOCAB
        cand = sorted(candidates(with_head))
        pick = int(with_head.argmax())
        if load == "-plain":  # the same rows, the same Q8_0 state, the same vec_dot: the full head's logits
            np.testing.assert_array_equal(with_head[cand], full[cand])
        else:  # the CPU repacked the full head (its gemv sums a block's 32 products before scaling them)
            np.testing.assert_allclose(with_head[cand], full[cand], rtol=1e-6, atol=1e-6 * np.abs(full).max())
        assert pick == cand[int(np.argmax(full[cand]))], f"step {i}"


@pytest.mark.bindings
@pytest.mark.skipif(not PARITY_PYTHON.is_file(), reason="transformers runs in the parity venv: make parity builds it")
def test_transformers_gemma4_assistant_agrees(drafts, tmp_path):
    hidden = np.stack([h for h, _ in drafts["head"]])
    np.savez(tmp_path / "in.npz", hidden=hidden)
    proc = subprocess.run(
        [
            str(PARITY_PYTHON),
            str(REPO / "scripts/head_parity_hf.py"),
            str(drafts["hf"]),
            tmp_path / "in.npz",
            tmp_path / "out.npz",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = np.load(tmp_path / "out.npz")
    assert int(theirs["top_k"]) == TOP_K
    decided = 0
    for i, ((hidden, ours), row) in enumerate(zip(drafts["head"], theirs["logits"])):
        fill = row.min()  # transformers fills with min(selected) - 1
        assert candidates(ours) == set(np.flatnonzero(row > fill).tolist()), f"step {i}"
        decided += assert_same_draft(ours, row.astype(np.float64), drafts["tied_head"], hidden, i)
        # transformers multiplies the bf16 source rows, llama.cpp the exact Q4_0 ones: equal in bf16
        scale = np.abs(row[row > fill]).max()
        np.testing.assert_allclose(ours[row > fill], row[row > fill], rtol=0, atol=1e-2 * scale)
    assert decided >= len(STEPS) - 2  # here steps 0 and 10 are near-ties, as in numpy's transcription
