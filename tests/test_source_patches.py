"""The fixes carried onto the pinned llama.cpp: which backends get them, that they apply to the
pinned sdist and change exactly what they say, and how a build names them."""

from __future__ import annotations

import tarfile

import pytest

from gguf_exact.builds import llama_build, source_patches
from gguf_exact.builds.cpu_features import cpu_target
from gguf_exact.errors import BuildError

CPU = cpu_target("flags\t\t: sse4_2 avx f16c fma bmi2 avx2\n", "x86_64", None)
CONTEXT = "src/llama-context.cpp"
SYNC = "ggml_backend_sched_synchronize(sched.get());"
SET_INPUTS = "res->set_inputs(&ubatch);"


@pytest.fixture(scope="module")
def sdist():
    return llama_build.fetch_sdist(llama_build.pinned_sdist(), log=lambda _m: None)


@pytest.fixture
def context_tree(sdist, tmp_path):
    """Only src/llama-context.cpp of the sdist's vendor/llama.cpp, in a tree of its own."""
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/vendor/llama.cpp/" + CONTEXT))
        text = tar.extractfile(member).read()
    (tmp_path / "src").mkdir()
    (tmp_path / CONTEXT).write_bytes(text)
    return tmp_path


def test_only_gpu_backends_carry_the_27572_fix_and_their_cache_keys_say_so():
    # the adaptive draft (23) is llama-server's alone: every server build has it, no wheel does
    assert [p.id for p in source_patches.patches_for("cpu")] == ["23"]
    assert source_patches.patches_for("cpu", bindings=True) == ()
    assert llama_build.build_key("cpu", CPU) == "0c1e57098+23-cpu-avx.avx2.bmi2.f16c.fma.sse42"
    assert llama_build.build_key("cpu", CPU, bindings=True) == "0c1e57098-cpu-avx.avx2.bmi2.f16c.fma.sse42"
    for backend in ("cuda75", "cuda86", "vulkan"):
        assert [p.id for p in source_patches.patches_for(backend)] == ["27572", "23"]
        assert [p.id for p in source_patches.patches_for(backend, bindings=True)] == ["27572"]
        assert llama_build.build_key(backend, CPU) == f"0c1e57098+27572+23-{backend}-avx.avx2.bmi2.f16c.fma.sse42"
        assert (
            llama_build.build_key(backend, CPU, bindings=True)
            == f"0c1e57098+27572-{backend}-avx.avx2.bmi2.f16c.fma.sse42"
        )


def test_the_27572_fix_synchronizes_before_every_set_inputs(context_tree):
    before = (context_tree / CONTEXT).read_text()
    # At the pinned commit the only synchronize before set_inputs is the pipeline-parallel one.
    assert before.count("if (cparams.pipeline_parallel) {\n            " + SYNC) == 1
    # process_ubatch's, then ggml_opt's (training): the fix is for the first
    assert before.count(SET_INPUTS) == 2
    assert "llm_graph_result * llama_context::process_ubatch(" in before.partition(SET_INPUTS)[0]

    assert source_patches.apply_patches(context_tree, "cuda86", bindings=True) == ["27572"]

    after = (context_tree / CONTEXT).read_text()
    assert "if (cparams.pipeline_parallel) {\n            " + SYNC not in after
    head, _, _ = after.partition(SET_INPUTS)
    last_statement = [line.strip() for line in head.splitlines() if line.strip() and not line.strip().startswith("//")][
        -1
    ]
    assert last_statement == SYNC  # the statement right before set_inputs, unconditional
    assert after.count(SYNC) == before.count(SYNC)  # moved, not added: one call per ubatch
    removed = [line for line in before.splitlines() if line not in after.splitlines()]
    assert [line.strip() for line in removed if line.strip()] == [
        "// with pipeline parallelism, the previous graph_compute_async may still be running",
        "// on the GPU. we must synchronize before set_inputs to avoid overwriting input tensors",
        "// that the previous compute is still reading.",
        SYNC,  # at its old indent, inside the if (other pipeline_parallel ifs stay)
    ]


def test_a_fix_that_does_not_apply_stops_the_build(context_tree):
    source_patches.apply_patches(context_tree, "vulkan", bindings=True)
    with pytest.raises(BuildError) as e:  # already applied: --forward refuses it
        source_patches.apply_patches(context_tree, "vulkan", bindings=True)
    assert str(e.value).startswith(f"{source_patches.PATCH_DIR}/27572-sync-before-set-inputs.patch: does not apply to ")
    assert source_patches.apply_patches(context_tree, "cpu", bindings=True) == []  # nothing to apply
    with pytest.raises(BuildError) as e:  # llama-server's sources are not in this tree
        source_patches.apply_patches(context_tree, "cpu")
    assert str(e.value).startswith(f"{source_patches.PATCH_DIR}/23-adaptive-draft.patch: does not apply to ")


def test_the_bindings_build_from_the_sdist_with_the_same_fix(sdist, tmp_path):
    root = llama_build.unpack_patched_sdist(sdist, tmp_path, "cuda75")
    assert (root / "pyproject.toml").is_file()
    text = (root / "vendor" / "llama.cpp" / CONTEXT).read_text()
    assert "(ref: #27572)" in text
    assert not (root / "vendor" / "llama.cpp" / "common" / "draft-policy.h").exists()  # llama-server's only
    assert not list(root.rglob("*.orig")) and not list(root.rglob("*.rej"))


def test_a_gpu_build_without_the_patch_tool_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    source_patches.require_patch_tool("cpu", bindings=True)  # the CPU wheel carries nothing: no tool needed
    with pytest.raises(BuildError) as e:
        source_patches.require_patch_tool("cuda86", bindings=True)
    assert str(e.value) == (
        "patch not found on PATH; the cuda86 build carries fixes for llama.cpp (#27572); "
        "install it (Debian: apt-get install patch)"
    )
    with pytest.raises(BuildError) as e:
        source_patches.require_patch_tool("cpu")
    assert str(e.value) == (
        "patch not found on PATH; the cpu build carries fixes for llama.cpp (#23); "
        "install it (Debian: apt-get install patch)"
    )
