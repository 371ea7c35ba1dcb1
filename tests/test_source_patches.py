"""The changes carried onto the pinned llama.cpp: the series' files, which backends get them, that
they apply exactly to the pinned sdist and change what they say, and how a build names them."""

from __future__ import annotations

import hashlib
import re
import shutil

import pytest
from helpers import sdist_files

from gguf_exact.builds import llama_build, source_patches
from gguf_exact.builds.cpu_features import cpu_target
from gguf_exact.errors import BuildError

CPU = cpu_target("flags\t\t: sse4_2 avx f16c fma bmi2 avx2\n", "x86_64", None)
CONTEXT = "src/llama-context.cpp"
ASSISTANT = "src/models/gemma4-assistant.cpp"
SYNC = "ggml_backend_sched_synchronize(sched.get());"
SET_INPUTS = "res->set_inputs(&ubatch);"
UPSTREAM = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"  # vendor/llama.cpp's gitlink in the sdist's git metadata
ADAPTIVE = ["23a", "23b", "23c", "23d", "23e", "23f", "23g"]  # the adaptive draft length, one commit per concern
BINDINGS = ["24", "38m", "38n", "38o", "39f", "39g", "39h", "39i", "39j", "39m", "39n", "39o"]  # every wheel's: the ordered head, ggml-cpu's rows alike in every pass
SERVER = ["24", *ADAPTIVE, "22142", "42", "42r", "38", "39", "38p", "38s", "39s", "38e", "39d", "39k", "39t", "39u", "39v", "39w", "39x", "39y", "39z", "39za", "39zb", "39zc", "39zd", "38m", "38n", "38o", "39f", "39g", "39h", "39i", "39j", "39m", "39n", "39o"]  # every llama-server build's
GPU_SERVER = ["24", "27572", *SERVER[1:]]  # and 27572 on GPUs, after 24


@pytest.fixture(scope="module")
def sdist():
    return llama_build.fetch_sdist(llama_build.pinned_sdist(), log=lambda _m: None)


def patched_files() -> list[str]:
    """Every file of the sdist the carried patches change, relative to vendor/llama.cpp
    (not those a patch creates: a hunk that starts at line 0; nor a later patch's edits of them)."""
    files, created = set(), set()
    for p in source_patches.PATCHES:
        lines = p.path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("+++ b/"):
                (created if lines[i + 1].startswith("@@ -0,0 ") else files).add(line[6:].strip())
    return sorted(files - created)


@pytest.fixture
def context_tree(sdist, tmp_path):
    """Only the files the patches touch (src/llama-context.cpp, the drafter's sources) of the
    sdist's vendor/llama.cpp, in a tree of their own."""
    wanted = patched_files()
    sdist_files(sdist, wanted, tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == wanted
    return tmp_path


def digest(*ids: str) -> str:
    """The cache key's patch digest, computed here from the patch files' bytes."""
    h = hashlib.sha256()
    for i in ids:
        (p,) = [p for p in source_patches.PATCHES if p.id == i]
        h.update(f"{i}\0{hashlib.sha256((source_patches.PATCH_DIR / p.file).read_bytes()).hexdigest()}\0".encode())
    return h.hexdigest()[:6]


def test_the_series_is_the_registry_in_order_each_with_its_message_id_and_base():
    """patches/ is a git format-patch series: the registry's files and no other, numbered in its
    order, each a commit with a message that says why, its id, and the pinned upstream commit as
    its base (the patches before it as prerequisites)."""
    assert sorted(p.name for p in source_patches.PATCH_DIR.iterdir()) == [p.file for p in source_patches.PATCHES]
    for n, p in enumerate(source_patches.PATCHES, 1):
        assert p.file.startswith(f"{n:04d}-{p.id}-"), p.file
        text = p.path.read_text()
        head, sep, diff = text.partition("\n---\n")
        assert sep and head.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
        assert re.search(r"^Subject: \[PATCH\] [a-z0-9-]+ : ", head, re.M), p.file
        message = head.partition("\n\n")[2]
        assert message.endswith(f"\n\nGguf-exact-id: {p.id}") and len(message.split()) > 40, p.file
        assert diff.count("\ndiff --git a/") >= 1 and "\n-- \n" not in diff  # no signature (git's version)
        tail = diff.rpartition("\n\nbase-commit: ")[2].splitlines()
        assert tail[0] == UPSTREAM, p.file
        assert [line.split(": ")[0] for line in tail[1:]] == ["prerequisite-patch-id"] * (n - 1), p.file


def test_which_backends_carry_which_patch_and_the_cache_keys_say_so():
    # 27572 is for asynchronous (GPU) backends; the ordered head (24) is in every build; the
    # adaptive draft (23a-23g), the perplexity log flush (22142), the request guard (42), the RPC client's
    # timeout (42r) and speculative sampling (38), the batch-aware policy (39), its speed-now pricing (38p) and start-up exploration (38s) and batch seeds (39s) change only llama-server's programs and its RPC backend:
    # every server build has them, no wheel does; 38m, 38n and 38o (ggml-cpu) are in every build, wheels too
    assert [p.id for p in source_patches.patches_for("cpu")] == SERVER
    assert [p.id for p in source_patches.patches_for("cpu", bindings=True)] == BINDINGS
    # llama-server's ids are too many for a folder name (NAME_MAX): its key counts them
    server = f"0c1e57098+{len(SERVER)}patches.{digest(*SERVER)}+rpc-cpu-avx.avx2.bmi2.f16c.fma.sse42"
    assert server.startswith("0c1e57098+41patches.")
    assert llama_build.build_key("cpu", CPU) == server
    assert (
        llama_build.build_key("cpu", CPU, bindings=True)
        == f"0c1e57098+24+38m+38n+38o+39f+39g+39h+39i+39j+39m+39n+39o.{digest(*BINDINGS)}-cpu-avx.avx2.bmi2.f16c.fma.sse42"
    )
    for backend in ("cuda75", "cuda86", "vulkan"):
        assert [p.id for p in source_patches.patches_for(backend)] == GPU_SERVER
        assert [p.id for p in source_patches.patches_for(backend, bindings=True)] == ["24", "27572", "38m", "38n", "38o", "39f", "39g", "39h", "39i", "39j", "39m", "39n", "39o"]
        tag = digest(*GPU_SERVER)
        assert (
            llama_build.build_key(backend, CPU)
            == f"0c1e57098+{len(GPU_SERVER)}patches.{tag}+rpc-{backend}-avx.avx2.bmi2.f16c.fma.sse42"
        )
        assert (
            llama_build.build_key(backend, CPU, bindings=True)
            == f"0c1e57098+24+27572+38m+38n+38o+39f+39g+39h+39i+39j+39m+39n+39o.{digest('24', '27572', '38m', '38n', '38o', '39f', '39g', '39h', '39i', '39j', '39m', '39n', '39o')}-{backend}-avx.avx2.bmi2.f16c.fma.sse42"
        )


def test_every_cache_key_and_its_build_log_fit_a_file_name_and_each_patch_id_is_one_patch():
    """A folder or file name has at most 255 bytes: with 39 ids spelled out, llama-server's key and its
    build log (``logs/llama.cpp-<key>.log``) passed that on a CPU with every x86 feature ggml builds for
    (an AMX Xeon's), and the build stopped with "File name too long". Ids name one patch each: two
    patches once shared "39k"."""
    ids = [p.id for p in source_patches.PATCHES]
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    every_feature = cpu_target(
        "flags\t\t: sse4_2 avx f16c fma bmi2 avx2 avx_vnni avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi"
        " avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16\n",
        "x86_64",
        None,
    )
    assert len(every_feature.features) == 11
    for backend in ("cpu", "cuda75", "cuda86", "vulkan"):
        for bindings in (False, True):
            key = llama_build.build_key(backend, every_feature, bindings=bindings)
            assert len(f"llama.cpp-{key}.log".encode()) <= 200, key  # room for more features and patches
            tag = source_patches.patch_tag(backend, bindings)
            assert ("patches." in tag) == (not bindings), tag  # a wheel's few ids spelled out, a server's counted
            assert "-" not in tag  # doctor reads a key as <commit>[+fixes]-<backend>-<cpu>


def test_an_edited_patch_is_a_new_cache_key_and_its_sha256_is_recorded(tmp_path, monkeypatch):
    # a build of an older revision of a patch must never be taken for the current one
    before = llama_build.build_key("cpu", CPU), llama_build.build_key("cpu", CPU, bindings=True)
    for p in source_patches.PATCHES:
        (tmp_path / p.file).write_bytes(p.path.read_bytes())
    monkeypatch.setattr(source_patches, "PATCH_DIR", tmp_path)
    assert (llama_build.build_key("cpu", CPU), llama_build.build_key("cpu", CPU, bindings=True)) == before
    edited = tmp_path / "0004-23b-draft-policy-header.patch"
    edited.write_bytes(edited.read_bytes().replace(b"cost_max_age       = 128", b"cost_max_age       = 256"))
    after = llama_build.build_key("cpu", CPU), llama_build.build_key("cpu", CPU, bindings=True)
    assert (
        after[0] != before[0]
        and after[0].startswith(f"0c1e57098+{len(SERVER)}patches.")
        and after[0].endswith("+rpc-cpu-" + CPU.tag)
    )
    assert after[1] == before[1]  # the bindings do not carry 23b: their wheel stays
    record = {r["id"]: r for r in source_patches.patch_record("cpu")}
    assert record["23b"] == {
        "id": "23b",
        "file": "0004-23b-draft-policy-header.patch",
        "sha256": hashlib.sha256(edited.read_bytes()).hexdigest(),
    }
    assert [r["id"] for r in source_patches.patch_record("cpu", bindings=True)] == BINDINGS


def test_the_27572_fix_synchronizes_before_every_set_inputs(context_tree):
    before = (context_tree / CONTEXT).read_text()
    # At the pinned commit the only synchronize before set_inputs is the pipeline-parallel one.
    assert before.count("if (cparams.pipeline_parallel) {\n            " + SYNC) == 1
    # process_ubatch's, then ggml_opt's (training): the fix is for the first
    assert before.count(SET_INPUTS) == 2
    assert "llm_graph_result * llama_context::process_ubatch(" in before.partition(SET_INPUTS)[0]

    assert source_patches.apply_patches(context_tree, "cuda86", bindings=True) == ["24", "27572", "38m", "38n", "38o", "39f", "39g", "39h", "39i", "39j", "39m", "39n", "39o"]

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
    assert source_patches.apply_patches(context_tree, "vulkan", bindings=True) == ["24", "27572", "38m", "38n", "38o", "39f", "39g", "39h", "39i", "39j", "39m", "39n", "39o"]
    with pytest.raises(BuildError) as e:  # already applied: --forward refuses it
        source_patches.apply_patches(context_tree, "cpu", bindings=True)
    assert str(e.value) == (
        f"{source_patches.PATCH_DIR}/0001-24-ordered-embedding-head.patch: src/llama-arch.cpp is patched "
        f"already (or the patch is reversed) in {context_tree}"
    )


@pytest.fixture
def series_copy(tmp_path, monkeypatch):
    """The series copied to a folder of its own, which the build then applies (to edit one)."""
    copy = tmp_path / "patches"
    shutil.copytree(source_patches.PATCH_DIR, copy)
    monkeypatch.setattr(source_patches, "PATCH_DIR", copy)
    return copy


def test_a_hunk_whose_context_differs_stops_the_build_in_one_line_naming_it(context_tree, series_copy):
    """No fuzz: one context line of the request guard's third hunk of server-http.cpp changed in a
    copy of its patch, and the build stops at that hunk, in one line naming the file and the hunk."""
    patch = series_copy / "0011-42-request-guard.patch"
    text = patch.read_text()
    hunk = text.index("@@ -209,10 +229,23 @@")
    end = text.index("\n", text.index("\n ", hunk) + 1)  # the end of the hunk's first context line
    patch.write_text(text[:end] + "  // edited" + text[end:])
    with pytest.raises(BuildError) as e:
        source_patches.apply_patches(context_tree, "cpu")
    assert str(e.value) == (
        f"{patch}: hunk #3 of tools/server/server-http.cpp does not apply (at line 229) in {context_tree}"
    )
    assert "\n" not in str(e.value)
    assert not list(context_tree.rglob("*.rej")) and not list(context_tree.rglob("*.orig"))


def test_a_hunk_that_matches_only_lines_off_its_place_stops_the_build(context_tree, series_copy):
    """No offsets either: a hunk whose line numbers say 10 lines earlier than where its context
    stands (a series made for another tree) stops the build, though patch would place it."""
    patch = series_copy / "0002-27572-sync-before-set-inputs.patch"
    patch.write_text(patch.read_text().replace("@@ -1452,6 +1445,13 @@", "@@ -1442,6 +1435,13 @@"))
    with pytest.raises(BuildError) as e:
        source_patches.apply_patches(context_tree, "cuda86", bindings=True)
    assert str(e.value) == (
        f"{patch}: hunk #2 of src/llama-context.cpp matched 10 lines off its place (at line 1445) in {context_tree}"
    )


def test_the_bindings_build_from_the_sdist_with_the_same_fix(sdist, tmp_path):
    root = llama_build.unpack_patched_sdist(sdist, tmp_path, "cuda75")
    assert (root / "pyproject.toml").is_file()
    text = (root / "vendor" / "llama.cpp" / CONTEXT).read_text()
    assert "(ref: #27572)" in text
    assert "build_ordered_head" in (root / "vendor" / "llama.cpp" / ASSISTANT).read_text()
    assert not (root / "vendor" / "llama.cpp" / "common" / "draft-policy.h").exists()  # llama-server's only
    assert not list(root.rglob("*.orig")) and not list(root.rglob("*.rej"))


def test_a_gpu_build_without_the_patch_tool_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError) as e:
        source_patches.require_patch_tool("cuda86", bindings=True)
    assert str(e.value) == (
        "patch not found on PATH; the cuda86 build carries fixes for llama.cpp (#24, #27572, #38m, #38n, #38o, #39f, #39g, #39h, #39i, #39j, #39m, #39n, #39o); "
        "install it (Debian: apt-get install patch)"
    )


def test_the_ordered_head_patch_loads_the_head_and_scores_only_its_candidates(context_tree):
    """What #24 changes in the drafter: the loader's empty expected shapes (which refused any real
    centroids) become the real ones, the two config keys are read, the tensors sit beside the
    output head, and the graph scores the top-k clusters' tokens, -INF elsewhere."""
    before = (context_tree / ASSISTANT).read_text()
    assert before.count("{}, TENSOR_NOT_REQUIRED") == 2 and "ggml_top_k" not in before
    assert source_patches.apply_patches(context_tree, "cpu") == SERVER
    after = (context_tree / ASSISTANT).read_text()
    assert "{}, TENSOR_NOT_REQUIRED" not in after
    assert "{ n_embd, n_c }, 0)" in after and "{ n_vocab }, 0)" in after
    assert "ml.get_key(LLM_KV_NUM_CENTROIDS,  n_centroids,    false);" in after
    assert "ml.get_key(LLM_KV_CENTROID_TOP_K, centroid_top_k, false);" in after
    graph = after.partition("static ggml_tensor * build_ordered_head(")[2].partition("\n}\n")[0]
    ops = [op for op in ("ggml_mul_mat", "ggml_top_k", "ggml_get_rows", "ggml_fill", "ggml_set_rows") if op in graph]
    assert ops == ["ggml_mul_mat", "ggml_top_k", "ggml_get_rows", "ggml_fill", "ggml_set_rows"]
    assert "-INFINITY" in graph
    # the candidates' rows gathered as bytes (the tied head viewed as I32) and multiplied in its own type
    assert "ggml_get_rows(ctx0, whole_words ? view_row_bytes_as(ctx0, head, GGML_TYPE_I32) : head, ids)" in graph
    assert "rows = view_row_bytes_as(ctx0, rows, head->type);" in graph
    assert "static ggml_tensor * view_row_bytes_as(ggml_context * ctx0, ggml_tensor * a, enum ggml_type type)" in after
    arch = (context_tree / "src/llama-arch.cpp").read_text()
    assert '"%s.num_centroids"' in arch and '"%s.centroid_intermediate_top_k"' in arch
    assert "{LLM_TENSOR_MASKED_EMBD_CENTROIDS,      {LLM_TENSOR_LAYER_OUTPUT,    GGML_OP_MUL_MAT}}" in arch
    assert "{LLM_TENSOR_MASKED_EMBD_ORDERING,       {LLM_TENSOR_LAYER_OUTPUT,    GGML_OP_GET_ROWS}}" in arch


def test_the_request_guard_patch_bounds_requests_and_compares_keys_in_constant_time(context_tree):
    """What #42 changes in llama-server: the limits as options whose defaults are the Python
    guard's, a body checked before the handlers parse it, a body that is not JSON answered as the
    client's fault, and the API key compared byte by byte over its whole length (llama.cpp's
    std::find stopped at the first differing byte)."""
    from gguf_exact.engines.shared.request_guard import LIMITS

    http_file = context_tree / "tools/server/server-http.cpp"
    before = http_file.read_text()
    assert "std::find(api_keys.begin(), api_keys.end(), req_api_key)" in before
    source_patches.apply_patches(context_tree, "cpu")
    after = http_file.read_text()
    assert "std::find(api_keys.begin(), api_keys.end(), req_api_key)" not in after
    assert "valid |= api_key_matches(req_api_key, key);" in after
    assert "srv->set_payload_max_length(params.request_max_body);" in after
    assert after.count("if (refused_by_request_guard(body, res)) {") == 1  # in post(), before the handler
    common = (context_tree / "common/common.h").read_text()
    assert f"size_t  request_max_body  = {LIMITS.body_bytes // 1024 // 1024}u * 1024 * 1024;" in common
    assert f"int32_t request_max_depth = {LIMITS.json_depth};" in common
    assert f"int32_t grammar_max_depth = {LIMITS.grammar_depth};" in common
    assert f"size_t  grammar_max_bytes = {LIMITS.grammar_bytes // 1024}u * 1024;" in common
    assert "catch (const common_json_error & e) {" in (context_tree / "tools/server/server.cpp").read_text()


def test_the_rpc_timeout_patch_bounds_the_clients_sockets_only(context_tree):
    """#42r: llama-server's sockets to its workers (socket_t::connect) get a receive and a send
    timeout from GGML_RPC_TIMEOUT (default 120 s, 0: none); a worker's own sockets (accept,
    create_server) do not, since a head may rightly stay silent for hours between requests."""
    path = context_tree / "ggml/src/ggml-rpc/transport.cpp"
    assert "SO_RCVTIMEO" not in path.read_text()
    source_patches.apply_patches(context_tree, "cpu")
    after = path.read_text()
    assert 'std::getenv("GGML_RPC_TIMEOUT")' in after and "return 120;" in after
    assert "SO_RCVTIMEO" in after and "SO_SNDTIMEO" in after
    bodies = {
        name: after.partition(f"socket_ptr socket_t::{name}(")[2].partition("\n}\n")[0]
        for name in ("connect", "accept", "create_server")
    }
    assert "set_client_timeouts(sockfd, rpc_client_timeout_s())" in bodies["connect"]
    assert "timeout" not in bodies["accept"] and "timeout" not in bodies["create_server"]
    # a timed-out receive or send names the timeout in the server's log, then fails as a lost worker does
    assert after.count("within %d s (GGML_RPC_TIMEOUT): it stopped answering") == 2


def test_patch_ids_fit_the_cache_key():
    """A build folder's name is read back at its first '-' (doctor, the build lookup): an id with
    a '-' in it hid every build that carries it (42r was first named 42-3)."""
    import re

    assert all(re.fullmatch(r"[0-9a-z]+", p.id) for p in source_patches.PATCHES), [p.id for p in source_patches.PATCHES]
