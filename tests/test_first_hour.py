"""A newcomer's first hour (issue 19): README and CLI agree, the offline loops run as the
README writes them, tables fit 80 columns, names and defaults say what they do."""

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFReader
from helpers import compact_names, off_grid_checkpoint
from rich.console import Console

from gguf_exact.cli import console, load_groups, main, options
from gguf_exact.core import bf16
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.formats.checkpoint import Checkpoint

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# README.md and docs/*.md: where the README sends the reader for the rest
DOCS = README + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def readme_block(heading: str, lang: str = "sh") -> str:
    """The first ```lang block after ``heading`` in README.md."""
    start = README.index(heading)
    m = re.compile(rf"```{lang}\n(.*?)```", re.S).search(README, start)
    assert m is not None, heading
    return m.group(1)


@pytest.fixture
def narrow(monkeypatch):
    """The CLI's console as an 80-column terminal prints to (what CliRunner captures)."""
    monkeypatch.setattr(console, "out", Console(highlight=False, width=80))


# --- the offline loop, as README's "Try it offline" writes it -------------------------


def test_readme_offline_loop_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = [ln for ln in readme_block("### Try it offline").splitlines() if ln.strip()]
    assert [shlex.split(ln)[1] for ln in lines] == [
        "make-tiny", "inspect", "convert", "verify", "repack", "verify", "compare",
    ]  # fmt: skip
    results = {}
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "gguf-exact"
        r = CliRunner().invoke(main, argv[1:])
        assert r.exit_code == 0, (line, r.output)
        results.setdefault(argv[1], []).append(r.stdout)
    tiny = tmp_path / "build" / "tiny"
    assert sorted(p.name for p in tiny.iterdir()) == [
        "drafter-hf", "drafter.gguf", "main-exact.gguf", "main-hf", "main-q4_0.gguf", "target.gguf",
    ]  # fmt: skip
    with Checkpoint(tiny / "main-hf") as ckpt:
        assert ckpt.config["architectures"] == ["Gemma4ForConditionalGeneration"]
    donor = GGUFReader(tiny / "main-q4_0.gguf")
    types = {t.name: t.tensor_type for t in donor.tensors}
    assert types["token_embd.weight"] == GGMLQuantizationType.Q6_K  # made as Google makes its QAT GGUFs
    assert types["per_layer_model_proj.weight"] == GGMLQuantizationType.F16
    assert types["blk.0.attn_q.weight"] == GGMLQuantizationType.Q4_0
    assert "QAT 4-bit: all 23 weight matrices are on the Q4_0 grid" in results["inspect"][0]
    assert "67 tensors re-packed as exact Q4_0, 63 copied" in results["repack"][0]
    # compare on main models (it refused them before): the donor and the re-pack, measured
    rows = {
        n: ln for ln in results["compare"][0].splitlines() for n in ("main-q4_0.gguf", "main-exact.gguf") if n in ln
    }
    size = {n: (tiny / n).stat().st_size for n in ("main-q4_0.gguf", "main-exact.gguf")}
    assert f"{size['main-q4_0.gguf']:,}" in rows["main-q4_0.gguf"]
    assert "60.6091%" in rows["main-q4_0.gguf"] and "Q6_K x2" in rows["main-q4_0.gguf"]
    assert f"{size['main-exact.gguf']:,}" in rows["main-exact.gguf"]
    assert "99.9017%" in rows["main-exact.gguf"] and "Q4_0 x67" in rows["main-exact.gguf"]


def test_readme_repack_table_is_what_repack_prints(tmp_path, narrow):
    """The per-kind table in docs/repack.md is the command's own output at 80 columns."""
    assert run("make-tiny", tmp_path).exit_code == 0
    r = run(
        "repack", "--donor", tmp_path / "main-q4_0.gguf", "--source", tmp_path / "main-hf", tmp_path / "main-exact.gguf"
    )
    assert r.exit_code == 0, r.output
    repack_doc = (ROOT / "docs" / "repack.md").read_text()
    start = repack_doc.index('The tiny main model of "Try it offline", on an 80-column terminal')
    block = re.search(r"```\n(.*?)```", repack_doc[start:], re.S).group(1)
    expected = [ln.removeprefix("  ").rstrip() for ln in block.splitlines() if ln.strip()]
    printed = [ln.rstrip() for ln in r.stdout.splitlines()]
    assert printed[: len(expected)] == expected
    assert all(len(ln) <= 80 for ln in printed[: len(expected)])


# --- tables at 80 columns ----------------------------------------------------------------


def test_inspect_fits_80_columns_and_keeps_every_name(tiny, tmp_path, narrow):
    from gguf_exact.tiny.main_model import TINY, write_main_checkpoint

    main_hf = write_main_checkpoint(tmp_path / "main-hf", TINY)
    for src in (tiny / "drafter-fp32", main_hf):
        r = run("inspect", src)
        assert r.exit_code == 0, r.output
        assert max(len(ln) for ln in r.stdout.splitlines()) <= 80
        prefix = re.search(r"\(… =\s+(\S+)\)", r.stdout).group(1)  # the title may wrap
        shown = [n.replace("…", prefix, 1) if n.startswith("…") else n for n in compact_names(r.stdout, "tensor")]
        with Checkpoint(src) as ckpt:
            assert shown == sorted(ckpt.tensors)  # every name whole on a line: nothing cut with an ellipsis
    assert prefix == "model.language_model.layers."


def test_wide_console_keeps_the_full_table(tiny):
    r = run("inspect", tiny / "drafter-fp32")  # off a terminal: 160 columns
    assert "┃ tensor" in r.stdout and "model.layers.0.mlp.down_proj.weight" in r.stdout and "100.0000%" in r.stdout


def test_console_width_off_a_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert console.width() == 80
    monkeypatch.delenv("COLUMNS")
    assert console.width() == 160


# --- README and CLI agree ---------------------------------------------------------------


def test_off_grid_f32_as_the_readme_says(tiny, tmp_path):
    from gguf_exact.drafter.convert import OFF_GRID_TYPES
    from gguf_exact.repack.pipeline import OFF_GRID_CHOICES

    assert "`--off-grid q8_0|f16|bf16|f32`" in DOCS and "`q8_0|f16|bf16|f32` (the source in that type)" in DOCS
    params = {c.name: c for c in load_groups().values()}
    for command, api in (("convert", OFF_GRID_TYPES), ("repack", OFF_GRID_CHOICES)):
        choice = next(p for p in params[command].params if p.name == "off_grid").type.choices
        assert tuple(choice) == api, command
    src = off_grid_checkpoint(tmp_path / "src")
    out = tmp_path / "d.gguf"
    r = run("convert", src, out, "--vocab-from", tiny / "target.gguf", "--off-grid", "f32")
    assert r.exit_code == 0, r.output
    # the ordered head's off-grid centroids keep their own bf16 whatever --off-grid says
    assert "off grid, stored as: masked_embd_centroids.weight (bf16), blk.2.ffn_up.weight (f32)" in r.stdout
    t = {t.name: t for t in GGUFReader(out).tensors}["blk.2.ffn_up.weight"]
    assert t.tensor_type == GGMLQuantizationType.F32
    with Checkpoint(src) as ckpt:
        source = bf16.to_f32(ckpt.read("model.layers.2.mlp.up_proj.weight"))
    assert np.array_equal(np.asarray(t.data).reshape(source.shape), source)  # bf16 -> f32 keeps every bit


def test_stop_escapes():
    from gguf_exact.cli.inprocess import unescape

    assert unescape(r"\n\n") == "\n\n" and unescape(r"a\tb\r") == "a\tb\r"
    assert unescape(r"\\n") == "\\n" and unescape(r"C:\q") == r"C:\q"
    assert '--stop "\\n\\n"' in DOCS


def test_one_file_name_per_model():
    """README and docs/ call the E2B target by one name (the recipe's target file), the drafter by one."""
    from gguf_exact.hub.recipes import load_recipe

    r = load_recipe("e2b-assistant")
    target, drafter = r.part("target").files[0], r.part("exact").files[0]
    names = set(re.findall(r"gemma-4-E2B[\w.-]*\.gguf", DOCS))
    assert names == {target, drafter, load_recipe("e2b").output}, names
    assert target == "gemma-4-E2B_q4_0-it.gguf"


def test_recipes_and_fetch_of_a_missing_part():
    r = run("recipes")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    at = lines.index("e2b-assistant  (drafter for E2B targets) Gemma 4 E2B QAT MTP drafter, exact Q4_0")
    at = lines.index("  exact   xbill9/gemma-4-E2B-it-qat-assistant-q4_0-exact-gguf", at)
    assert lines[at + 1] == "          sha256 pinned, commit not pinned (from main), 1 file"
    at = lines.index("  source  google/gemma-4-E4B-it-qat-q4_0-unquantized-assistant")
    assert lines[at + 1] == "          not pinned: `gguf-exact pin e4b-assistant --what source` first"
    r = run("fetch", "e2b")
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        f"error: recipe e2b has no exact section ({ROOT / 'convert' / 'e2b.toml'}), so there is no exact file "
        "to fetch; it has source: `gguf-exact fetch e2b --what source`"
    ]


def test_tune_has_no_no_draft_and_names_its_profile():
    tune = load_groups()["tune"]
    names = {p.name for p in tune.params}
    assert "no_draft" not in names and "save_as" in names
    r = run("tune", "--model", "x.gguf", "--no-draft")
    assert r.exit_code == 1 and "No such option '--no-draft'" in r.stderr


def test_tuned_names():
    from gguf_exact.bench.tune import shadows_builtin, tuned_name
    from gguf_exact.engines.shared.profiles import load_profile
    from gguf_exact.errors import GgufExactError

    cpu = load_profile("cpu")
    assert tuned_name(cpu) == "cpu-tuned" and tuned_name(cpu, "laptop") == "laptop"
    assert shadows_builtin("cpu") and not shadows_builtin("cpu-tuned")
    with pytest.raises(GgufExactError, match="a profile name is letters"):
        tuned_name(cpu, "../cpu")


def test_bench_and_tune_write_under_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GGUF_EXACT_CACHE", str(tmp_path))
    for kind in ("bench", "tune"):
        d = options.results_dir(kind)
        assert d.parent == tmp_path / kind and re.fullmatch(r"\d{8}-\d{6}", d.name)
    for command in ("bench", "tune"):
        out = next(p for p in load_groups()[command].params if p.name == "out_dir")
        assert not isinstance(out.default, (str, Path)) and "~/.cache/gguf-exact" in out.help  # no cwd-relative default


def test_generate_defaults_as_chat_and_the_cpu_profile():
    from gguf_exact.engines.shared.engine_options import NO_PROFILE
    from gguf_exact.engines.shared.profiles import load_profile
    from gguf_exact.engines.shared.sampling_defaults import SERVER_SAMPLING

    # generate and chat draft as the cpu profile (and serve) by default: adaptive up to n-max 4
    assert load_profile("cpu").draft_table["spec-draft-n-max"] == 4 and load_profile("cpu").draft_table["spec-draft-adaptive"]
    assert (NO_PROFILE.n_max, NO_PROFILE.adaptive) == (4, True)
    for command in ("generate", "chat"):
        params = {p.name: p.default for p in load_groups()[command].params}
        assert params["temperature"] == 0.0
        assert [params[k] for k in ("top_k", "top_p", "min_p", "repeat_penalty")] == [40, 0.95, 0.05, 1.0]
    assert SERVER_SAMPLING == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}
    assert "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.0 (off)" in DOCS


# --- the memory plan is the chosen engine's ------------------------------------------------


def test_memory_plan_of_the_python_engine(tmp_path):
    from gguf_exact.engines.shared.memory_plan import plan_memory
    from gguf_exact.engines.shared.profiles import load_profile
    from gguf_exact.tiny.full_size import write_full_size_drafter, write_full_size_target

    t = write_full_size_target(tmp_path / "E2B.gguf")
    d = write_full_size_drafter(tmp_path / "E2B-drafter.gguf", "E2B", t)
    rtx = load_profile("rtx3050")
    server = plan_memory(t, d, serving_config(rtx, True).memory_inputs())
    python = plan_memory(t, d, serving_config(rtx, True).memory_inputs("python"))
    kv = {p: next(i for i in plan.items if i.what == "KV cache") for p, plan in (("s", server), ("p", python))}
    assert kv["s"].device_bytes == 60 << 20 and kv["p"].device_bytes == 144 << 20
    assert kv["p"].note == "context 8,192: non-SWA 8,192 cells x 3 layers, SWA 8,192 cells x 12 layers"
    # the same caches llama-server would make with the python engine's settings
    same = plan_memory(t, d, serving_config(rtx.with_overrides(["swa-full=true", "parallel=1", "batch-size=512"]), True).memory_inputs())
    assert [c.bytes for c in same.kv] == [c.bytes for c in python.kv]
    # what serve prints for each engine
    base = ["serve", "--model", t, "--draft", d, "--profile", "rtx3050", "--dry-run"]
    env = {"GGUF_EXACT_RUN_DIR": str(tmp_path / "run")}
    for engine, mib in (("llama-server", "60.00"), ("python", "144.00")):
        r = run(*base, "--engine", engine, env=env)
        assert r.exit_code == 0, r.output
        assert re.search(rf"\n  KV cache +{mib} MiB GPU  \(context 8,192", r.stdout), r.stdout
    assert "memory plan (GPU, python engine: one sequence, the whole SWA cache; estimated from the GGUF" in r.stdout
    readme = " ".join(DOCS.split())
    assert (
        "`KV cache 144.00 MiB GPU (context 8,192: non-SWA 8,192 cells x 3 layers, SWA 8,192 cells x 12 layers)`"
        in readme
    )


# --- serving safety: --host off loopback needs a key ----------------------------------------


def test_non_loopback_host_needs_a_key(tiny, tmp_path):
    from gguf_exact.engines.shared.settings import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.20", "::", "desktop.lan"]))
    env = {"GGUF_EXACT_RUN_DIR": str(tmp_path / "run"), "GGUF_EXACT_API_KEY": ""}
    base = ["serve", "--model", tiny / "target.gguf", "--no-draft", "--profile", "cpu", "--dry-run"]
    r = run(*base, "--host", "0.0.0.0", env=env)
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        "error: --host 0.0.0.0 lets other machines reach the server, which answers anyone without a key: give one "
        "with --api-key KEY (or $GGUF_EXACT_API_KEY; clients send it as the OpenAI api_key), or pass --insecure "
        "to serve without one"
    ]
    r = run(*base, "--host", "0.0.0.0", "--insecure", env=env)
    assert r.exit_code == 0 and "warning: --insecure: anyone who can reach 0.0.0.0 may use this server" in r.stderr
    r = run(*base, "--host", "0.0.0.0", env=env | {"GGUF_EXACT_API_KEY": "k3y-from-env-0123"})
    assert r.exit_code == 0, r.output
    assert "api key  required from clients" in r.stdout and "k3y-from-env" not in r.output
    for bad, where in (
        (["--set", "api-key=abc"], "error: --set: [server] api-key is set by gguf-exact serve; use --api-key"),
        (
            ["--", "--api-key", "abc"],
            "error: llama-server arguments: --api-key is set by gguf-exact serve; use --api-key",
        ),
    ):
        r = run(*base, *bad, env=env)
        assert r.exit_code == 1 and r.stderr.startswith(where), r.output
        assert len(r.stderr.strip().splitlines()) == 1


def test_a_short_key_is_refused_off_loopback_only(tiny, tmp_path):
    env = {"GGUF_EXACT_RUN_DIR": str(tmp_path / "run"), "GGUF_EXACT_API_KEY": ""}
    base = ["serve", "--model", tiny / "target.gguf", "--no-draft", "--profile", "cpu", "--dry-run"]
    r = run(*base, "--host", "0.0.0.0", "--api-key", "x" * 15, env=env)
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [
        "error: --api-key (or $GGUF_EXACT_API_KEY) has 15 characters; a server other machines reach (0.0.0.0) needs "
        "a key of at least 16, e.g. from `openssl rand -hex 24`"
    ]
    assert run(*base, "--host", "0.0.0.0", "--api-key", "x" * 16, env=env).exit_code == 0
    assert run(*base, "--api-key", "x", env=env).exit_code == 0  # loopback: only this machine's users


def test_every_option_serve_owns_is_refused_after_the_double_dash(tiny, tmp_path):
    """llama-server takes an option's last value: any of serve's own options after `--`
    would override the one serve checked (`-- --host 0.0.0.0` bound every interface with no
    key). Each reserved option, in each spelling, is refused in one line; others pass."""
    from gguf_exact.engines.shared.profiles import RESERVED
    from gguf_exact.engines.shared.request_guard import llama_server_args

    assert {a.removeprefix("--") for a in llama_server_args() if a.startswith("--")} <= set(RESERVED)
    env = {"GGUF_EXACT_RUN_DIR": str(tmp_path / "run"), "GGUF_EXACT_API_KEY": ""}
    base = ["serve", "--model", tiny / "target.gguf", "--no-draft", "--profile", "cpu", "--dry-run", "--"]
    assert len(RESERVED) == 15
    for key in RESERVED:
        dashes = "-" if len(key) <= 2 else "--"
        for extra in (
            [f"{dashes}{key}", "0.0.0.0"],
            [f"{dashes}{key}=0.0.0.0"],
            ["--ctx-size", "64", f"{dashes}{key}"],
        ):
            r = run(*base, *extra, env=env)
            assert r.exit_code == 1, (extra, r.output)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                f"error: llama-server arguments: {dashes}{key} is set by gguf-exact serve; use "
            ), (extra, lines)
    r = run(*base, "--host", "0.0.0.0", env=env)
    assert "0.0.0.0" not in r.stdout and r.exit_code == 1
    r = run(*base, "--ctx-size", "-1", "--temp", "0.5", env=env)
    assert r.exit_code == 0, r.output
    assert "--ctx-size -1 --temp 0.5" in " ".join(r.stdout.split())


def test_scratch_run_roots_are_removed(tmp_path):
    from gguf_exact.engines.shared.process import scratch_run_root
    from gguf_exact.errors import GgufExactError

    with scratch_run_root("tune") as root:
        (root / "18000").mkdir()
        (root / "18000" / "server.json").write_text("{}")
    assert not root.exists()
    with pytest.raises(GgufExactError), scratch_run_root("tune") as kept:
        raise GgufExactError("llama-server exited; log: ...")
    assert kept.is_dir()  # the error names its log: kept for the user to read
    kept.rmdir()
    with pytest.raises(KeyboardInterrupt), scratch_run_root("bench") as gone:
        raise KeyboardInterrupt
    assert not gone.exists()


def test_status_json_of_the_readme_names_no_key(tiny, tmp_path):
    """server.json and settings.json say whether clients need a key, never the key."""
    from gguf_exact.engines.launch import plan_launch
    from gguf_exact.engines.shared.process import write_state
    from gguf_exact.engines.shared.settings import ServeSettings, read_settings, write_settings

    asked = ServeSettings(
        tiny / "target.gguf", profile="cpu", engine="python", host="0.0.0.0", port=9, api_key="s3cret-0123456789"
    )
    launch = plan_launch(replace(asked, runs=tmp_path / "run"), check_port=False)
    assert "s3cret" not in repr(launch) and "s3cret" not in repr(launch.settings)
    write_state(launch.settings, launch.run_dir, launch.command, 1, True)
    write_settings(launch.settings, launch.run_dir)
    for name in ("server.json", "settings.json"):
        text = (launch.run_dir / name).read_text()
        assert json.loads(text)["api_key"] is True and "s3cret" not in text
    assert launch.run_dir == tmp_path / "run" / "9"
    back = read_settings(launch.run_dir / "settings.json", api_key="from-env")
    assert back.api_key == "from-env" and back.pair_checked and back.engine_options == launch.settings.engine_options
    assert back.loaded_profile == launch.settings.loaded_profile  # rebuilt from its tables, not read again


# --- in-process generation (the llama extra) ------------------------------------------------


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory) -> tuple[Path, Path]:
    """The agreeing pair: the target repeats its last token, the drafter says so too."""
    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.tiny.models import write_agreeing_pair

    target, hf = write_agreeing_pair(tmp_path_factory.mktemp("agreeing"))
    return target, convert_drafter(hf, hf.parent / "drafter.gguf", target).path


@pytest.mark.bindings
def test_generate_stop_at_a_blank_line_as_the_readme_writes_it(agreeing):
    """`--stop "\\n\\n"` reaches the command as backslash-n twice (what a shell passes):
    it stops at the first blank line. The agreeing target repeats a prompt's final newline."""
    target, drafter = agreeing
    base = ["generate", "--model", target, "--draft", drafter, "--prompt", "x y\n", "--n-predict", 8, "--json"]
    free = json.loads(run(*base).stdout)
    assert free["text"] == "\n" * 8 and len(free["tokens"]) == 8
    # the default n-max and adaptive length, as chat and the cpu profile (how much it drafts is the policy's
    # choice on this machine's timings: where a draft cannot pay it learns by shadows, drafting nothing)
    assert free["n_max"] == 4 and free["adaptive"] is True
    assert free["drafts_accepted"] == free["drafts_generated"]  # the agreeing drafter is right when it drafts
    stopped = json.loads(run(*base, "--stop", r"\n\n").stdout)
    assert stopped["text"] == "" and stopped["tokens"] == free["tokens"][:2]


@pytest.mark.bindings
def test_chat_stats_say_one_reply():
    from gguf_exact.engines.python.chat import stats_line
    from gguf_exact.engines.python.engine import SpecTotals

    assert stats_line(SpecTotals(requests=1, tokens=1)).startswith("1 reply, 1 token; ")
    assert stats_line(SpecTotals(requests=2, tokens=40)).startswith("2 replies, 40 tokens; ")


# --- README: short, its links and its Python block --------------------------------------------


def test_readme_is_short_and_its_links_resolve():
    assert len(README.splitlines()) <= 300
    links = re.findall(r"\]\((docs/[\w.-]+\.md)\)", README)
    assert links and all((ROOT / link).is_file() for link in links)
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= set(links)  # every page is reachable
    for page in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / link).is_file(), (page.name, link)


@pytest.mark.bindings
def test_readme_python_block_runs(tmp_path, monkeypatch, capsys):
    """The README's Python API block, as written, on the offline kit's drafter and target."""
    from gguf_exact.tiny.kit import write_tiny_kit

    write_tiny_kit(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = readme_block("## Python API", "python")
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "drafter.gguf").is_file()
    # the drafter is seen drafting (the profile's adaptive length drafted nothing there: `None 1.0`)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "drafted 123, accepted 0, 1.00 tokens/pass" and last in code
