"""`verify` under attack (issue 16 §6): single changes to correct files, each of which
must make it exit 1 with the failure named exactly, figures and all, for a drafter
(`convert`'s output) and a main model (`repack`'s output, judged with and without its
donor). Unchanged files rewritten by gguf-py must pass, and so must a block stored with
another scale that is exactly as exact (counted, not failed).

Every expected Q4_0 figure comes from the oracle in tests/gguf_edit.py (gguf-py's
dequantizer and ml_dtypes' rounding), not from the code under test. The number of
mutations of each kind is fixed and asserted, so a change that drops cases fails."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFValueType, quants
from gguf_edit import (
    BF16,
    F16,
    F32,
    Q4_0,
    Q8_0,
    block_message,
    key_of,
    oracle_figures,
    read_all,
    rewrite,
    rewrite_with_gguf_py,
    set_key,
)
from rich.console import Console

from gguf_exact.cli import console, main
from gguf_exact.core import bf16
from gguf_exact.drafter.convert import convert_drafter
from gguf_exact.formats.checkpoint import Checkpoint
from gguf_exact.formats.gguf_file import encode
from gguf_exact.formats.gguf_layout import encode_array_kv, encode_kv
from gguf_exact.gemma4 import names as gemma4_names
from gguf_exact.gemma4.assistant import gguf_tensor_name
from gguf_exact.repack.pipeline import repack_model
from gguf_exact.tiny.main_model import TINY, write_donor, write_main_checkpoint

U32, U64, STRING, BOOL = GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.STRING, GGUFValueType.BOOL
I32 = GGMLQuantizationType.I32


@dataclass
class Mutation:
    name: str
    path: Path
    failure: str | None  # the first failure verify must print, exactly; None: an equally exact file that must pass
    failures: int = 1
    args: list = field(default_factory=list)


@dataclass
class Case:
    """A correct file, what it was made from, and the arguments that verify it."""

    root: Path
    good: Path
    args: list  # --source ... (and --vocab-from or --donor)
    tensors: dict  # name -> (data, type) of the good file
    sources: dict  # GGUF name -> source bf16 bits (rows, cols)
    writer: str

    def path(self, name: str) -> Path:
        return self.root / (name.replace("/", "÷").replace(" ", "_") + ".gguf")


@pytest.fixture(autouse=True)
def whole_lines(monkeypatch):
    """verify's lines whole, as a terminal wider than them shows them (a narrower one gets them wrapped)."""
    monkeypatch.setattr(console, "out", Console(highlight=False, width=2000))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def judge(case: Case, mutations: list[Mutation]) -> list[str]:
    """Every mutation through the CLI; the ways verify's answers differ from the expected."""
    problems = []
    for m in mutations:
        result = run("verify", m.path, *case.args, *m.args)
        if m.failure is None:
            if result.exit_code != 0:
                problems.append(f"{m.name}: exit {result.exit_code}, expected a pass: {result.stderr.strip()}")
            continue
        more = f" (and {m.failures - 1} more failure{'s' if m.failures > 2 else ''})" if m.failures > 1 else ""
        want = f"error: {m.path}: verification failed: {m.failure}{more}"
        if result.exit_code != 1 or result.stderr.strip() != want:
            problems.append(f"{m.name}: exit {result.exit_code}\n  got:  {result.stderr.strip()}\n  want: {want}")
        elif not result.stdout.strip().splitlines()[-1].startswith(f"verify: FAIL — {m.path}: "):
            problems.append(f"{m.name}: the last line is not the FAIL verdict")
    return problems


# --- the correct files ----------------------------------------------------------------------


def load(case_root: Path, good: Path, args: list, source: Path, hf_of, writer: str) -> Case:
    _, tensors = read_all(good)
    sources = {}
    with Checkpoint(source) as ckpt:
        for name, _, qtype in tensors:
            hf = hf_of(name)
            if qtype == Q4_0 and hf is not None:
                bits = np.array(ckpt.read(hf))
                sources[name] = bits.reshape(-1, bits.shape[-1])
    return Case(case_root, good, args, {n: (d, q) for n, d, q in tensors}, sources, writer)


@pytest.fixture(scope="module")
def drafter(tiny, tmp_path_factory) -> Case:
    root = tmp_path_factory.mktemp("mutate-drafter")
    good = root / "good.gguf"
    convert_drafter(tiny / "drafter-fp32", good, tiny / "target.gguf")
    with Checkpoint(tiny / "drafter-fp32") as ckpt:
        hf_of = {gguf_tensor_name(hf): hf for hf in ckpt.tensors}
    args = ["--source", tiny / "drafter-fp32", "--vocab-from", tiny / "target.gguf"]
    return load(root, good, args, tiny / "drafter-fp32", hf_of.get, "convert")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Case:
    root = tmp_path_factory.mktemp("mutate-main")
    write_main_checkpoint(root / "src", TINY, seed=0)
    write_donor(root / "donor.gguf", root / "src", TINY)
    good = root / "good.gguf"
    repack_model(root / "donor.gguf", root / "src", good)

    def hf_of(name):
        for hf in _hf_names(root / "src"):
            m = gemma4_names.gguf_tensor_name(hf)
            if m is not None and m.gguf_name == name:
                return hf
        return None

    args = ["--source", root / "src", "--donor", root / "donor.gguf"]
    return load(root, good, args, root / "src", hf_of, "repack")


def _hf_names(src: Path) -> list[str]:
    with Checkpoint(src) as ckpt:
        return list(ckpt.tensors)


def without_donor(case: Case) -> list:
    return case.args[:2] + ["--allow-unchecked"]


def with_blocks(case: Case, name: str, blocks: np.ndarray, label: str) -> Path:
    """The good file with tensor ``name``'s Q4_0 blocks replaced."""
    data, _ = case.tensors[name]
    new = blocks.reshape(data.shape)
    return rewrite(case.good, case.path(label), lambda n, d: new if n == name else d)


def judged_blocks(case: Case, name: str, stored: np.ndarray) -> tuple[int, int | None]:
    """(less exact blocks, the first of them) of ``stored`` against the good file's
    blocks of ``name``, by the oracle."""
    plan = case.tensors[name][0].reshape(-1, 18)
    bits = case.sources[name].reshape(-1, 32)
    exact, worst = oracle_figures(stored, bits)
    plan_exact, plan_worst = oracle_figures(plan, bits)
    less = np.flatnonzero((exact < plan_exact) | (worst > plan_worst))
    return int(less.size), (int(less[0]) if less.size else None)


def block_mutation(case: Case, name: str, stored: np.ndarray, label: str) -> Mutation:
    """A mutation of one tensor's blocks, with the failure the oracle predicts (None when
    every changed block is as exact as the plan)."""
    stored = stored.reshape(-1, 18)
    n_less, first = judged_blocks(case, name, stored)
    path = with_blocks(case, name, stored, label)
    if first is None:
        return Mutation(label, path, None)
    plan = case.tensors[name][0].reshape(-1, 18)
    cols = case.sources[name].shape[1]
    bits = case.sources[name].reshape(-1, 32)
    return Mutation(
        label, path, block_message(name, cols, first, stored[first], plan[first], bits[first], n_less, len(plan))
    )


# --- Q4_0 blocks: scales, re-quantized blocks, swapped rows -------------------------------------


def scale_steps(case: Case, tensors: list[str], n_failing: int, n_passing: int) -> list[Mutation]:
    """One block's scale moved by one fp16 step (levels untouched), blocks taken in order
    until ``n_failing`` are less exact and ``n_passing`` are equally exact alternatives."""
    failing, passing = [], []
    for name in tensors:
        plan = case.tensors[name][0].reshape(-1, 18)
        for b in range(0, len(plan), 7):
            if len(failing) >= n_failing and len(passing) >= n_passing:
                return failing + passing
            stored = plan.copy()
            step = 1 if (b // 7) % 2 == 0 else -1
            d = stored[b, :2].view("<u2")
            if d[0] & 0x7FFF in (0, 0x7BFF):
                continue
            d[0] = np.uint16(int(d[0]) + step)  # the magnitude moves by one fp16 step, whatever the sign
            label = f"scale {'+' if step > 0 else '-'}1 step {name} block {b}"
            n_less, _ = judged_blocks(case, name, stored)
            if (n_less and len(failing) < n_failing) or (not n_less and len(passing) < n_passing):
                (failing if n_less else passing).append(block_mutation(case, name, stored, label))
    return failing + passing


def scaled_file(case: Case, factor: float) -> Mutation:
    """Every Q4_0 scale of the file multiplied by ``factor`` (levels untouched): each
    tensor with a less exact block is one failure, the first in file order named."""
    new, first, n_tensors = {}, None, 0
    for name, (data, qtype) in case.tensors.items():
        if qtype != Q4_0 or name not in case.sources:
            continue
        stored = data.reshape(-1, 18).copy()
        d = stored[:, :2].copy().view(np.float16)
        stored[:, :2] = (d.astype(np.float32) * np.float32(factor)).astype(np.float16).view(np.uint8)
        new[name] = stored.reshape(data.shape)
        n_less, b = judged_blocks(case, name, stored)
        if n_less:
            n_tensors += 1
            if first is None:
                plan, bits = data.reshape(-1, 18), case.sources[name]
                first = block_message(
                    name, bits.shape[1], b, stored[b], plan[b], bits.reshape(-1, 32)[b], n_less, len(plan)
                )
    path = rewrite(case.good, case.path(f"scaled-{factor}"), lambda n, d: new.get(n, d))
    return Mutation(f"every scale x{factor}", path, first, n_tensors)


def requantized(case: Case, tensors: list[str], n_failing: int) -> tuple[list[Mutation], int]:
    """One block re-quantized the llama-quantize way (d = max / -8), blocks taken in order
    until ``n_failing`` differ from the plan; also how many equally exact ones were met."""
    failing, passing = [], 0
    for name in tensors:
        plan = case.tensors[name][0].reshape(-1, 18)
        bits = case.sources[name].reshape(-1, 32)
        for b in range(0, len(plan), 5):
            if len(failing) >= n_failing:
                return failing, passing
            block = quants.quantize(bf16.to_f32(bits[b : b + 1]), Q4_0).reshape(18)
            if np.array_equal(block, plan[b]):
                continue
            stored = plan.copy()
            stored[b] = block
            m = block_mutation(case, name, stored, f"max/-8 {name} block {b}")
            if m.failure is None:
                passing += 1
            else:
                failing.append(m)
    return failing, passing


def swapped_rows(case: Case, name: str, a: int, b: int) -> Mutation:
    data = case.tensors[name][0].copy()
    data[[a, b]] = data[[b, a]]
    return block_mutation(case, name, data, f"rows {a} and {b} of {name} swapped")


# --- header, types, tensor set ------------------------------------------------------------------


def key_mutation(case: Case, label: str, edit, failure: str, args=()) -> Mutation:
    return Mutation(label, rewrite(case.good, case.path(label), kv=edit), failure, args=list(args))


def tokens_edited(pairs: list[bytes]) -> tuple[list[bytes], bytes, bytes]:
    """tokenizer.ggml.tokens with token 300 replaced by another of the same length."""
    from gguf_exact.formats.gguf_layout import parse_pair
    from gguf_exact.formats.kv_judge import array_elements

    raw = next(p for p in pairs if key_of(p) == "tokenizer.ggml.tokens")
    tokens = array_elements(parse_pair(raw))
    old = tokens[300]
    new = bytes(reversed(old)) if old != bytes(reversed(old)) else old[:-1] + b"#"
    edited = [t.decode() for t in tokens[:300]] + [new.decode()] + [t.decode() for t in tokens[301:]]
    changed = encode_array_kv("tokenizer.ggml.tokens", STRING, edited)
    return [changed if p is raw else p for p in pairs], new, old


def retyped(case: Case, label: str, name: str, data, qtype, failure: str, args=()) -> Mutation:
    return Mutation(label, rewrite(case.good, case.path(label), retype={name: (data, qtype)}), failure, args=list(args))


def f32_bytes_differ(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.flatnonzero(a.view(np.uint8).reshape(-1) != b.view(np.uint8).reshape(-1))[0])


# --- the drafter ---------------------------------------------------------------------------------

DRAFTER_MATRICES = [
    "token_embd.weight", "nextn.pre_projection.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight",
    "blk.2.ffn_up.weight", "blk.3.attn_output.weight",
]  # fmt: skip


def test_an_unchanged_drafter_rewritten_by_gguf_py_passes(drafter):
    copy = rewrite_with_gguf_py(drafter.good, drafter.path("gguf-py"))
    assert judge(drafter, [Mutation("rewritten by gguf-py", copy, None)]) == []
    result = run("verify", copy, *drafter.args)
    assert result.stdout.strip().splitlines()[-1].startswith(f"verify: PASS — {copy}: 51 tensors and 36 keys judged")


def test_drafter_scales_one_fp16_step_off_fail_unless_as_exact(drafter):
    mutations = scale_steps(drafter, DRAFTER_MATRICES, n_failing=12, n_passing=3)
    assert sum(m.failure is not None for m in mutations) == 12 and sum(m.failure is None for m in mutations) == 3
    mutations += [scaled_file(drafter, f) for f in (1.001, 0.999, 1.003)]
    assert all(m.failure for m in mutations[-3:])  # each whole-file scaling loses exact values somewhere
    assert judge(drafter, mutations) == []
    # an equally exact alternative is counted as such
    alt = next(m for m in mutations if m.failure is None)
    v = json.loads(run("verify", alt.path, *drafter.args, "--json").stdout)
    assert v["ok"] and v["blocks"]["equally_exact"] == 1 and v["blocks"]["less_exact"] == 0
    assert v["verdict"].endswith(
        "every block as exact as the plan (1 equally exact with another scale, 0 more exact); "
        "1 matrix off the grid, stored as convert defines"  # the ordered head's bf16 centroids
    )


def test_drafter_blocks_requantized_by_max_over_minus_8_fail(drafter):
    mutations, passing = requantized(drafter, DRAFTER_MATRICES, n_failing=10)
    assert len(mutations) == 10
    assert judge(drafter, mutations) == []


def test_drafter_swapped_rows_fail(drafter):
    mutations = [
        swapped_rows(drafter, "token_embd.weight", 0, 5),
        swapped_rows(drafter, "blk.0.ffn_down.weight", 1, 2),
        swapped_rows(drafter, "nextn.pre_projection.weight", 10, 11),
    ]
    assert all(m.failure for m in mutations)
    assert judge(drafter, mutations) == []


def test_drafter_header_edits_fail(drafter):
    a = "gemma4-assistant"
    pairs, new_token, old_token = tokens_edited(read_all(drafter.good)[0])

    def duplicated(p):
        i = next(i for i, x in enumerate(p) if key_of(x) == f"{a}.block_count")
        return p[: i + 1] + [p[i]] + p[i + 1 :]

    def flip_pattern(p):
        raw = encode_array_kv(f"{a}.attention.sliding_window_pattern", BOOL, [False, True, True, False])
        return [raw if key_of(x) == f"{a}.attention.sliding_window_pattern" else x for x in p]

    pattern = "[True, True, True, False] (BOOL array of 4)"
    mutations = [
        key_mutation(drafter, "freq_base", lambda p: set_key(p, f"{a}.rope.freq_base", GGUFValueType.FLOAT32, 1.0),
                     f"key {a}.rope.freq_base is 1.0 (FLOAT32); convert writes 1000000.0 (FLOAT32)"),
        key_mutation(drafter, "block_count", lambda p: set_key(p, f"{a}.block_count", U32, 99),
                     f"key {a}.block_count is 99 (UINT32); convert writes 4 (UINT32)"),
        key_mutation(drafter, "context_length_u64", lambda p: set_key(p, f"{a}.context_length", U64, 4096),
                     f"key {a}.context_length is 4096 (UINT64); convert writes 4096 (UINT32)"),
        key_mutation(drafter, "pattern", flip_pattern,
                     f"key {a}.attention.sliding_window_pattern ([False, True, True, False] (BOOL array of 4)) differs "
                     f"at element 0: False, not True; convert writes {pattern}"),
        key_mutation(drafter, "file_type", lambda p: set_key(p, "general.file_type", U32, 1),
                     "key general.file_type is 1 (UINT32); convert writes 2 (UINT32)"),
        key_mutation(drafter, "architecture", lambda p: set_key(p, "general.architecture", STRING, "gemma4"),
                     "key general.architecture is 'gemma4' (STRING); convert writes 'gemma4-assistant' (STRING)"),
        key_mutation(drafter, "dropped_key", lambda p: [x for x in p if key_of(x) != f"{a}.embedding_length_out"],
                     f"key {a}.embedding_length_out is missing; convert writes it as 128 (UINT32)"),
        key_mutation(drafter, "added_key", lambda p: p + [encode_kv("general.name", STRING, "tiny")],
                     "key general.name ('tiny' (STRING)) is not one convert writes"),
        key_mutation(drafter, "duplicated_key", duplicated, f"key {a}.block_count appears 2 times"),
        key_mutation(drafter, "bos", lambda p: set_key(p, "tokenizer.ggml.bos_token_id", U32, 2),
                     "key tokenizer.ggml.bos_token_id is 2 (UINT32); convert writes 1 (UINT32)"),
        key_mutation(drafter, "token_text", lambda p: pairs,
                     f"key tokenizer.ggml.tokens (an array of 320 STRING) differs at element 300: {new_token!r}, not "
                     f"{old_token!r}; convert writes an array of 320 STRING"),
        key_mutation(drafter, "eps", lambda p: set_key(p, f"{a}.attention.layer_norm_rms_epsilon", GGUFValueType.FLOAT32, 1e-5),
                     f"key {a}.attention.layer_norm_rms_epsilon is {float(np.float32(1e-5))!r} (FLOAT32); convert "
                     f"writes {float(np.float32(1e-6))!r} (FLOAT32)"),
        Mutation("GGUF version 2", rewrite(drafter.good, drafter.path("v2"), version=2), "GGUF version 2; convert writes version 3"),
    ]  # fmt: skip
    assert len(mutations) == 13
    assert judge(drafter, mutations) == []


def test_drafter_types_swapped_fail(drafter):
    norm = drafter.tensors["blk.0.attn_norm.weight"][0]
    embd_bits = drafter.sources["token_embd.weight"]
    rope = drafter.tensors["rope_freqs.weight"][0]
    with np.errstate(over="ignore"):
        rope_f16 = rope.astype(np.float16)  # 1e30 becomes inf
    on_grid = "is on the 4-bit grid: exact Q4_0 expected"
    norm_f32 = "convert writes F32, the source's values, every bit"
    mutations = [
        retyped(drafter, "norm_f16", "blk.0.attn_norm.weight", norm.astype(np.float16), F16,
                f"tensor blk.0.attn_norm.weight: is F16; {norm_f32}"),
        retyped(drafter, "norm_bf16", "blk.0.attn_norm.weight", encode(bf16.from_f32(norm), BF16), BF16,
                f"tensor blk.0.attn_norm.weight: is BF16; {norm_f32}"),
        retyped(drafter, "norm_q8_0_sevens", "output_norm.weight", encode(np.full(64, 7.0, np.float32), Q8_0), Q8_0,
                f"tensor output_norm.weight: is Q8_0; {norm_f32}"),
        retyped(drafter, "scale_f16", "blk.3.layer_output_scale.weight",
                drafter.tensors["blk.3.layer_output_scale.weight"][0].astype(np.float16), F16,
                f"tensor blk.3.layer_output_scale.weight: is F16; {norm_f32}"),
        retyped(drafter, "embd_q8_0", "token_embd.weight", encode(embd_bits, Q8_0), Q8_0,
                f"tensor token_embd.weight: is Q8_0, but its source model.embed_tokens.weight {on_grid}"),
        retyped(drafter, "embd_f16", "token_embd.weight", encode(embd_bits, F16), F16,
                f"tensor token_embd.weight: is F16, but its source model.embed_tokens.weight {on_grid}"),
        retyped(drafter, "embd_bf16", "token_embd.weight", encode(embd_bits, BF16).reshape(320, -1), BF16,
                f"tensor token_embd.weight: is BF16, but its source model.embed_tokens.weight {on_grid}"),
        retyped(drafter, "rope_f16", "rope_freqs.weight", rope_f16, F16,
                "tensor rope_freqs.weight: is F16; convert writes F32, generated from config.json"),
    ]  # fmt: skip
    assert judge(drafter, mutations) == []


def test_drafter_tensor_set_changes_fail(drafter):
    post = drafter.tensors["nextn.post_projection.weight"][0]
    embd = drafter.tensors["token_embd.weight"][0]
    rope = drafter.tensors["rope_freqs.weight"][0]

    def dropped(name, failure):
        return Mutation(f"drop {name}", rewrite(drafter.good, drafter.path(f"drop-{name}"), drop={name}), failure)

    def added(name, data, qtype, failure):
        return Mutation(
            f"add {name}", rewrite(drafter.good, drafter.path(f"add-{name}"), add=[(name, data, qtype)]), failure
        )

    mutations = [
        dropped("blk.3.ffn_down.weight",
                "tensor blk.3.ffn_down.weight is missing; convert writes it (from the source's model.layers.3.mlp.down_proj.weight)"),
        dropped("output_norm.weight",
                "tensor output_norm.weight is missing; convert writes it (from the source's model.norm.weight)"),
        dropped("rope_freqs.weight", "tensor rope_freqs.weight is missing; convert writes it (from the config)"),
        added("blk.9.mystery.weight", np.ones(4, np.float32), F32,
              "tensor blk.9.mystery.weight (F32 [4]) is not one convert writes for this source"),
        added("output.weight", embd, Q4_0, "tensor output.weight (Q4_0 [320, 64]) is not one convert writes for this source"),
        retyped(drafter, "reshaped", "nextn.post_projection.weight", post.reshape(64, -1), Q4_0,
                "tensor nextn.post_projection.weight: shape [64, 128]; convert writes [128, 64] (from the source's post_projection.weight)"),
        Mutation("rope_freqs x3", rewrite(drafter.good, drafter.path("rope3"), lambda n, d: d * 3 if n == "rope_freqs.weight" else d),
                 f"tensor rope_freqs.weight: value 0 is {float(rope[0]) * 3!r}; config.json gives {float(rope[0])!r}"),
    ]  # fmt: skip
    assert judge(drafter, mutations) == []


# --- the main model ------------------------------------------------------------------------------

MAIN_MATRICES = ["blk.0.ffn_gate.weight", "blk.2.attn_q.weight", "per_layer_model_proj.weight", "blk.5.inp_gate.weight"]


def test_an_unchanged_main_model_rewritten_by_gguf_py_passes(model):
    copy = rewrite_with_gguf_py(model.good, model.path("gguf-py"))
    assert judge(model, [Mutation("rewritten by gguf-py", copy, None)]) == []
    assert run("verify", copy, *without_donor(model)).exit_code == 0  # judged from the source alone, donor keys allowed


def test_main_model_blocks_fail(model):
    mutations = scale_steps(model, MAIN_MATRICES, n_failing=4, n_passing=1)
    mutations += [scaled_file(model, 1.001)]
    requant, _ = requantized(model, MAIN_MATRICES, n_failing=3)
    mutations += requant
    mutations += [swapped_rows(model, "blk.0.ffn_gate.weight", 3, 4), swapped_rows(model, "token_embd.weight", 0, 1)]
    assert sum(m.failure is not None for m in mutations) == 4 + 1 + 3 + 2
    assert judge(model, mutations) == []


def test_main_model_header_edits_fail(model):
    g = "gemma4"
    block_count = f"key {g}.block_count is 99 (UINT32); repack writes 8 (UINT32)"
    mutations = [
        key_mutation(model, "block_count", lambda p: set_key(p, f"{g}.block_count", U32, 99), block_count),
        key_mutation(model, "block_count_no_donor", lambda p: set_key(p, f"{g}.block_count", U32, 99), block_count,
                     args=["--allow-unchecked"]),
        key_mutation(model, "freq_base_no_donor", lambda p: set_key(p, f"{g}.rope.freq_base", GGUFValueType.FLOAT32, 1.0),
                     f"key {g}.rope.freq_base is 1.0 (FLOAT32); repack writes 1000000.0 (FLOAT32)", args=["--allow-unchecked"]),
        key_mutation(model, "file_type", lambda p: set_key(p, "general.file_type", U32, 1),
                     "key general.file_type is 1 (UINT32); repack writes 2 (UINT32)"),
        key_mutation(model, "name", lambda p: set_key(p, "general.name", STRING, "gemma-4-tiny-it-qat-x"),
                     "key general.name is 'gemma-4-tiny-it-qat-x' (STRING); repack writes 'gemma-4-tiny-it-qat' (STRING)"),
        key_mutation(model, "bos", lambda p: set_key(p, "tokenizer.ggml.bos_token_id", U32, 2),
                     "key tokenizer.ggml.bos_token_id is 2 (UINT32); repack writes 1 (UINT32)"),
        Mutation("GGUF version 2", rewrite(model.good, model.path("v2"), version=2), "GGUF version 2; repack writes version 3"),
    ]  # fmt: skip
    assert len(mutations) == 7
    no_donor = {"block_count_no_donor", "freq_base_no_donor"}
    assert judge(model, [m for m in mutations if m.name not in no_donor]) == []
    alone = Case(model.root, model.good, model.args[:2], model.tensors, model.sources, "repack")
    assert judge(alone, [m for m in mutations if m.name in no_donor]) == []


def test_main_model_types_tensor_set_and_donor_copies_fail(model):
    norm = model.tensors["blk.0.attn_norm.weight"][0]
    rope = model.tensors["rope_freqs.weight"][0]
    gate_bits = model.sources["blk.0.ffn_gate.weight"]
    scale = model.tensors["blk.3.layer_output_scale.weight"][0]
    ffn_norm = model.tensors["blk.2.ffn_norm.weight"][0]
    up = "model.language_model.layers.2.mlp.up_proj.weight"

    def changed(label, name, fn):
        return rewrite(model.good, model.path(label), lambda n, d: fn(d.copy()) if n == name else d)

    def one_bit(d):
        d.view(np.uint32)[7] ^= 1
        return d

    bit_flipped = changed("norm_bit", "blk.2.ffn_norm.weight", one_bit)
    flipped_value = float(np.array([ffn_norm.view(np.uint32)[7] ^ 1], np.uint32).view(np.float32)[0])
    rope3 = changed("rope3", "rope_freqs.weight", lambda d: d * 3)
    dropped = rewrite(model.good, model.path("drop"), drop={"blk.2.ffn_up.weight"})
    extra = rewrite(model.good, model.path("extra"), add=[("blk.99.extra.weight", np.ones(4, np.float32), F32)])
    norm_f16 = rewrite(
        model.good, model.path("norm_f16"), retype={"blk.0.attn_norm.weight": (norm.astype(np.float16), F16)}
    )
    no_donor = ["--allow-unchecked"]
    mutations = [
        Mutation("drop a Q4_0 matrix", dropped, f"tensor blk.2.ffn_up.weight is missing; repack writes it (from the source's {up})"),
        Mutation("extra tensor", extra, "tensor blk.99.extra.weight (F32 [4]) is not one repack writes for this source"),
        Mutation("rope_freqs x3", rope3,
                 f"tensor rope_freqs.weight: row 0 differs from the donor's (byte {f32_bytes_differ(rope * 3, rope)} of the row)"),
        Mutation("norm one bit", bit_flipped, "tensor blk.2.ffn_norm.weight: row 0 differs from the donor's (byte 28 of the row)"),
        Mutation("layer scale x2", changed("scale2", "blk.3.layer_output_scale.weight", lambda d: d * 2),
                 "tensor blk.3.layer_output_scale.weight: row 0 differs from the donor's "
                 f"(byte {f32_bytes_differ(scale * 2, scale)} of the row)"),
        Mutation("norm F16", norm_f16,
                 "tensor blk.0.attn_norm.weight: is F16; the donor's is F32 (repack copies it byte for byte)"),
        retyped(model, "gate_q8_0", "blk.0.ffn_gate.weight", encode(gate_bits, Q8_0), Q8_0,
                "tensor blk.0.ffn_gate.weight: is Q8_0, but its source "
                "model.language_model.layers.0.mlp.gate_proj.weight is on the 4-bit grid: exact Q4_0 expected"),
    ]  # fmt: skip
    assert judge(model, mutations) == []
    # the same files judged without the donor: from the source and the config
    alone = Case(model.root, model.good, model.args[:2], model.tensors, model.sources, "repack")
    mutations = [
        Mutation("drop a Q4_0 matrix, no donor", dropped,
                 f"tensor blk.2.ffn_up.weight is missing; repack writes it (from the source's {up})", args=no_donor),
        Mutation("extra tensor, no donor", extra,
                 "tensor blk.99.extra.weight (F32 [4]) is not one repack writes for this source", args=no_donor),
        Mutation("rope_freqs x3, no donor", rope3,
                 f"tensor rope_freqs.weight: value 0 is {float(rope[0]) * 3!r}; config.json gives {float(rope[0])!r}", args=no_donor),
        Mutation("norm one bit, no donor", bit_flipped,
                 f"tensor blk.2.ffn_norm.weight: value at row 0, column 7 is {flipped_value!r}; the source's, exactly as "
                 f"F32, is {float(ffn_norm[7])!r}", args=no_donor),
        Mutation("norm F16, no donor", norm_f16,
                 "tensor blk.0.attn_norm.weight: is F16; repack writes F32, the source's values (as llama.cpp's converter "
                 "writes norms); give --donor DONOR.gguf to compare with the donor's bytes", args=no_donor),
    ]  # fmt: skip
    assert judge(alone, mutations) == []


def test_drafter_ordered_head_edits_fail(drafter):
    """The ordered head (issue 24): its token ids, its centroids' bytes and type, its keys, and a
    file that keeps one of its two tensors."""
    a = "gemma4-assistant"
    ordering = drafter.tensors["masked_embd_ordering"][0]
    centroids = drafter.tensors["masked_embd_centroids.weight"][0]
    swapped = ordering.view("<i4").copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    nudged = centroids.view(np.uint16).copy()
    nudged[5, 7] ^= 1  # one bit of one value
    source_ids = "the source's masked_embedding.token_ordering as I32"
    mutations = [
        Mutation("ordering swapped", rewrite(drafter.good, drafter.path("ord-swap"), retype={"masked_embd_ordering": (swapped.view(np.uint8), I32)}),
                 f"tensor masked_embd_ordering: value 3 is {int(swapped[3])}; {source_ids} gives {int(swapped[4])}"),
        Mutation("centroid bit", rewrite(drafter.good, drafter.path("cen-bit"), retype={"masked_embd_centroids.weight": (nudged, BF16)}),
                 f"tensor masked_embd_centroids.weight: value at row 5, column 7 is {float(bf16.to_f32(nudged)[5, 7])!r}; "
                 f"the source's, rounded once as BF16, is {float(bf16.to_f32(centroids.view(np.uint16))[5, 7])!r}"),
        retyped(drafter, "centroids_f32", "masked_embd_centroids.weight", bf16.to_f32(centroids.view(np.uint16)), F32,
                "tensor masked_embd_centroids.weight: is F32, but its source masked_embedding.centroids.weight is off "
                "the 4-bit grid (64 blocks, first at row 0, column 0): convert stores it as BF16"),
        key_mutation(drafter, "top_k", lambda p: set_key(p, f"{a}.centroid_intermediate_top_k", U32, 8),
                     f"key {a}.centroid_intermediate_top_k is 8 (UINT32); convert writes 4 (UINT32)"),
        key_mutation(drafter, "no_num_centroids", lambda p: [x for x in p if key_of(x) != f"{a}.num_centroids"],
                     f"key {a}.num_centroids is missing; convert writes it as 32 (UINT32)"),
        Mutation("drop ordering", rewrite(drafter.good, drafter.path("drop-ord"), drop={"masked_embd_ordering"}),
                 "tensor masked_embd_ordering is missing; convert writes it (from the source's masked_embedding.token_ordering)"),
    ]  # fmt: skip
    assert judge(drafter, mutations) == []
