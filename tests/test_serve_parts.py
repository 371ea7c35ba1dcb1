"""Serving parts that need no server: profiles, log/metrics parsing, the llama.cpp build plan."""

import time
from pathlib import Path

import pytest
from _llama_server import server_binary

from gguf_exact.builds import llama_build
from gguf_exact.builds.llama_build import (
    COMMIT,
    TARGETS,
    PinnedSdist,
    backend_name,
    cmake_args,
    pinned_sdist,
    verify_sdist,
)
from gguf_exact.engines.shared.profiles import available_profiles, load_profile, parse_value
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.stats import draft_counters, parse_acceptance, parse_metrics
from gguf_exact.errors import GgufExactError

LOG = """\
srv  log_server_r: request: POST /completion 127.0.0.1 200
slot print_timing: id  0 | task 12 | draft acceptance = 0.84656 (  160 accepted /   189 generated), mean len =  2.68
slot      release: id  0 | task 12 | stop processing: n_tokens = 300, truncated = 0
slot print_timing: id  0 | task 20 | draft acceptance = 1.00000 (   14 accepted /    14 generated), mean len =  3.00
"""

METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 42
llamacpp:spec_decode_num_drafts_total 100
llamacpp:spec_decode_num_draft_tokens_total 189
llamacpp:spec_decode_num_accepted_tokens_total 160
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 90
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 70
"""


def test_acceptance_lines():
    lines = parse_acceptance(LOG)
    assert [(a.rate, a.accepted, a.generated, a.mean_len) for a in lines] == [
        (0.84656, 160, 189, 2.68),
        (1.0, 14, 14, 3.0),
    ]
    assert parse_acceptance(LOG, last=1)[0].accepted == 14
    assert parse_acceptance("no such lines\n") == []


def test_metrics_counters():
    m = parse_metrics(METRICS)
    assert m["llamacpp:spec_decode_num_accepted_tokens_per_pos_total"] == 160
    c = draft_counters(m)
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (100, 189, 160)
    assert c.rate == pytest.approx(160 / 189)
    assert c.accepted_per_position == (90, 70) and c.position_rates == pytest.approx((0.9, 0.7))
    assert draft_counters(parse_metrics("llamacpp:prompt_tokens_total 1\n")) is None


def test_shipped_profiles():
    assert {"rtx3050", "gtx1650ti", "cpu"} <= set(available_profiles())
    rtx = load_profile("rtx3050")
    assert rtx.build == "cuda86"
    assert serving_config(rtx, True).server_args() == [
        "--n-gpu-layers",
        "99",
        "--flash-attn",
        "on",
        "--ctx-size",
        "8192",
        "--parallel",
        "1",
        "--spec-type",
        "draft-mtp",
        "--spec-draft-adaptive",
        "--spec-draft-adaptive-warmup",
        "--spec-draft-shadow",
        "--spec-draft-n-max",
        "4",
        "--spec-rejection-sampling",
        "--n-gpu-layers-draft",
        "all",
    ]
    assert "--spec-type" not in serving_config(rtx, False).server_args()
    gtx = load_profile("gtx1650ti")
    assert gtx.build == "cuda75" and gtx.server_table["ctx-size"] < 8192
    assert gtx.draft_table["spec-draft-n-max"] == 4 and gtx.draft_table["spec-draft-adaptive"] is True
    assert "--spec-draft-adaptive" not in serving_config(rtx.with_overrides(["spec-draft-adaptive=false"]), True).server_args()
    assert load_profile("cpu").build == "cpu"
    # every value in a shipped profile carries a comment saying why
    for name in ("rtx3050", "gtx1650ti", "cpu"):
        for line in (Path(llama_build.__file__).parents[2] / "serve" / f"{name}.toml").read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                assert "#" in line, f"{name}.toml: {line}"


def test_overrides_and_user_profiles(tmp_path, monkeypatch):
    p = load_profile("rtx3050").with_overrides(
        ["ctx-size=4096", "spec-draft-n-max=1", "draft.spec-draft-p-min=0.5", "threads=4", "flash-attn=false"]
    )
    args = serving_config(p, True).server_args()
    assert args[args.index("--ctx-size") + 1] == "4096" and args[args.index("--spec-draft-n-max") + 1] == "1"
    assert args[args.index("--spec-draft-p-min") + 1] == "0.5" and "--flash-attn" not in args
    assert "--spec-draft-p-min" not in serving_config(p, False).server_args()
    assert (
        parse_value("true") is True
        and parse_value("12") == 12
        and parse_value("0.5") == 0.5
        and parse_value("on") == "on"
    )
    mine = tmp_path / "mine.toml"
    mine.write_text(
        'description = "mine"\nbuild = "cpu"\n[server]\nctx-size = 1024  # small\n[draft]\nspec-type = "draft-mtp"\n'
    )
    assert load_profile(mine).server_table == {"ctx-size": 1024}
    monkeypatch.setenv("GGUF_EXACT_PROFILES", str(tmp_path))
    assert load_profile("mine").description == "mine"
    for bad, msg in (
        ("port=1", "use port instead"),
        ("model=x", "use target instead"),
        ("no-mmap=true", "mmap"),
        ("oops", "KEY=VALUE"),
        ("build=rocm", "cudaNN"),
    ):
        with pytest.raises(GgufExactError, match=msg):
            p.with_overrides([bad])
    with pytest.raises(GgufExactError, match=r"not found; profiles in .* \(where tune writes\)"):
        load_profile("no-such-card")
    (tmp_path / "bad.toml").write_text("[server\n")
    with pytest.raises(GgufExactError, match="not valid TOML"):
        load_profile(tmp_path / "bad.toml")


def test_build_plan():
    assert backend_name(None) == "cpu" and backend_name("86") == "cuda86"
    with pytest.raises(GgufExactError, match="CUDA architecture number"):
        backend_name("sm86")
    cpu = cmake_args(Path("s"), Path("b"), "cpu")
    assert "-DCMAKE_BUILD_TYPE=Release" in cpu and "-DLLAMA_CURL=OFF" in cpu and f"-DLLAMA_BUILD_COMMIT={COMMIT}" in cpu
    assert not any("CUDA" in a for a in cpu)
    # CUDA and Vulkan arguments: tests/test_gpu_builds.py
    assert TARGETS == ("llama-server", "llama-bench", "llama-perplexity", "llama-quantize", "rpc-server")


def test_pinned_sdist_and_hash_check(tmp_path):
    pin = pinned_sdist()
    assert pin.version == "0.3.36" and pin.filename == "llama_cpp_python-0.3.36.tar.gz"
    assert pin.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    fake = tmp_path / pin.filename
    fake.write_bytes(b"not the sdist")
    with pytest.raises(GgufExactError, match="sha256 .* differs from 832db"):
        verify_sdist(fake, pin)
    sums = tmp_path / "llama-cpp-python.sha256"
    sums.write_text("# pinned\n" + "ab" * 32 + "  llama_cpp_python-9.9.9.tar.gz\n")
    assert pinned_sdist(sums) == PinnedSdist("9.9.9", "ab" * 32, "llama_cpp_python-9.9.9.tar.gz")
    with pytest.raises(GgufExactError, match="missing"):
        pinned_sdist(tmp_path / "none.sha256")


@pytest.mark.llama_server
def test_cached_build_is_instant_and_same_commit():
    binary = server_binary()
    t0 = time.monotonic()
    build = llama_build.build_llama_cpp(log=lambda m: pytest.fail(f"rebuilt: {m}"))
    assert time.monotonic() - t0 < 2.0
    assert build.binary() == binary
    assert all((build.bin_dir / t).is_file() for t in TARGETS)
    assert COMMIT in llama_build.server_version(binary)
    assert build.info["sdist_sha256"] == pinned_sdist().sha256


def test_build_failures_name_the_cause(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("")
    with pytest.raises(GgufExactError, match="no cuBLAS .*full log: .*build.log"):
        llama_build._run(
            ["sh", "-c", "echo 'Target ggml-cuda links to: CUDA::cublas'; exit 1"], log, lambda m: None, "configure"
        )
    log.write_text("")
    with pytest.raises(GgufExactError, match=r"llama.cpp build failed \(x.c:1: error: boom\)"):
        llama_build._run(["sh", "-c", "echo 'x.c:1: error: boom'; echo tail; exit 2"], log, lambda m: None, "build")


def test_build_llama_cli_rejects_bad_arch():
    from click.testing import CliRunner

    from gguf_exact.cli import main

    r = CliRunner().invoke(main, ["build-llama", "--cuda", "sm_86"])
    assert r.exit_code == 1 and "expected a CUDA architecture number" in r.output


@pytest.mark.parametrize("has_filter", [True, False])
def test_sdist_extraction_keeps_members_inside_on_every_python_3_10(tmp_path, monkeypatch, has_filter):
    import io
    import tarfile

    from gguf_exact.builds.llama_build import extract_data

    if not has_filter:  # Python 3.10.0-3.10.11 and 3.11.0-3.11.3 have no tarfile.data_filter
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ("pkg/vendor/llama.cpp/CMakeLists.txt", "../evil.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"ok"))
    dest = tmp_path / "out"
    dest.mkdir()
    with tarfile.open(archive) as tar:
        good = [m for m in tar.getmembers() if m.name.startswith("pkg/")]
        extract_data(tar, dest, good)
        assert (dest / "pkg/vendor/llama.cpp/CMakeLists.txt").read_bytes() == b"ok"
        with pytest.raises(GgufExactError, match="evil"):
            extract_data(tar, dest, tar.getmembers())
    assert not (tmp_path / "evil.txt").exists()
