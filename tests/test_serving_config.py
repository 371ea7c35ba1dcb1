"""One typed serving configuration: each knob declared once (engines/shared/knobs.py), parsed once
(serving_config), rendered for llama-server, the Python engine and the memory plan; serve's
options generated from the declarations; no other module reads a profile's tables."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import gguf_exact
from gguf_exact.cli.options import knob_options, overrides_option, settings_options
from gguf_exact.cli.serving import SERVE_SETTINGS, serve
from gguf_exact.engines.shared.engine_options import EngineOptions
from gguf_exact.engines.shared.knobs import ALL_LAYERS, AUTO_LAYERS, BY_KEY, KNOBS
from gguf_exact.engines.shared.memory_plan import MemoryInputs
from gguf_exact.engines.shared.profiles import load_profile
from gguf_exact.engines.shared.serving_config import serving_config
from gguf_exact.engines.shared.settings import ServeSettings
from gguf_exact.errors import GgufExactError

ROOT = Path(gguf_exact.__file__).parent


def test_the_three_renderings_of_a_shipped_profile():
    rtx = serving_config(load_profile("rtx3050"), with_draft=True)
    assert rtx.server_args() == [
        "--n-gpu-layers", "99", "--flash-attn", "on", "--ctx-size", "8192", "--parallel", "1",
        "--spec-type", "draft-mtp", "--spec-draft-adaptive", "--spec-draft-adaptive-warmup", "--spec-draft-shadow",
        "--spec-draft-n-max", "4", "--spec-rejection-sampling", "--n-gpu-layers-draft", "all",
    ]  # fmt: skip
    assert rtx.engine_options() == (
        EngineOptions(n_ctx=8192, n_max=4, adaptive=True, adaptive_warmup=True, shadow=True, p_min=0.0, rejection_sampling=True,
                      n_gpu_layers=99,
                      n_gpu_layers_draft=-1, flash_attn=True, n_threads=None, n_threads_batch=None, n_batch=512,
                      n_ubatch=512),
        [],
    )  # fmt: skip
    assert rtx.memory_inputs() == MemoryInputs(
        n_ctx=8192, n_parallel=1, kv_unified=False, n_batch=2048, n_ubatch=512, type_k="f16", type_v="f16",
        flash_attn="on", swa_full=False, n_gpu_layers=99, n_gpu_layers_draft=ALL_LAYERS, kv_offload=True,
        n_draft_max=4, gpu=True,
    )  # fmt: skip
    assert rtx.memory_inputs("python") == dataclasses.replace(rtx.memory_inputs(), n_batch=512, swa_full=True)
    alone = serving_config(load_profile("rtx3050"), with_draft=False)
    assert "--spec-type" not in alone.server_args() and alone.memory_inputs().n_draft_max == 0


def test_one_default_for_both_engines_where_the_profile_says_nothing():
    bare = serving_config(load_profile("cpu").with_overrides(["spec-draft-n-max=false"]), with_draft=True)
    assert bare.options.n_max is None
    assert bare.n_max == bare.engine_options()[0].n_max == bare.memory_inputs().n_draft_max == 3  # llama-server's
    # where the engines differ, the knob says so once: the context and the GPU layers
    assert (bare.value("ctx_size"), bare.value("ctx_size", "python")) == (4096, 4096)
    plain = serving_config(load_profile("cpu").with_overrides(["ctx-size=false"]), with_draft=True)
    assert (plain.value("ctx_size"), plain.value("ctx_size", "python")) == (0, 4096)
    assert (plain.value("n_gpu_layers"), plain.value("n_gpu_layers", "python")) == (AUTO_LAYERS, 0)


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.flag)
def test_every_spelling_of_a_knob_is_one_option(knob):
    value = {"int": 2, "float": 0.5, "bool": True, "layers": 7, "switch": "off", "choice": "q8_0", "str": "x"}[knob.kind]
    configs = [serving_config(load_profile("cpu").with_overrides([f"{key}={value}"]), True) for key in knob.keys]
    assert {getattr(c.options, knob.name) for c in configs} == {value}
    # set twice in two spellings: one option, the last value, one flag on llama-server's line
    if knob.aliases:
        twice = load_profile("cpu").with_overrides([f"{knob.flag}={value}", f"{knob.aliases[-1]}={value}"])
        assert serving_config(twice, True).server_args().count(f"--{knob.flag}") == (knob.engines != {"python"})


def test_an_alias_replaces_the_profiles_own_spelling():
    p = load_profile("cpu").with_overrides(["draft-max=2", "c=1024"])
    config = serving_config(p, True)
    assert config.n_max == 2 and config.value("ctx_size") == 1024
    args = config.server_args()
    assert args.count("--spec-draft-n-max") == 1 and args[args.index("--spec-draft-n-max") + 1] == "2"
    assert args.count("--ctx-size") == 1 and args[args.index("--ctx-size") + 1] == "1024"


@pytest.mark.parametrize(
    "pair, line",
    [
        ("ctx-size=abc", "overrides: ctx-size = 'abc': expected a whole number"),
        ("ctx-size=-5", "overrides: ctx-size = -5: expected a number at least 0"),
        ("spec-draft-p-min=1.5", "overrides: spec-draft-p-min = 1.5: expected a number 0 to 1"),
        ("flash-attn=maybe", "overrides: flash-attn = 'maybe': expected on, off or auto"),
        ("n-gpu-layers=most", "overrides: n-gpu-layers = 'most': expected a number of layers, auto or all"),
        ("ngl=-3", "overrides: ngl = -3: expected a number of layers, auto or all"),
        ("cache-type-k=q3_k", "overrides: cache-type-k = 'q3_k': expected one of f32, f16, bf16, q8_0, q4_0"),
        ("spec-draft-adaptive=yes", "overrides: spec-draft-adaptive = 'yes': expected true or false"),
        ("threads=0", "overrides: threads = 0: expected a number at least 1"),
        ("draft.spec-draft-n-max=2.5", "overrides: spec-draft-n-max = 2.5: expected a whole number"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(pair, line):
    with pytest.raises(GgufExactError) as err:
        load_profile("cpu").with_overrides([pair])
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_a_bad_value_in_a_profile_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('build = "cpu"\n[server]\nflash-attn = "sometimes"\n')
    with pytest.raises(GgufExactError, match=rf"^profile {bad}: flash-attn = 'sometimes': expected on, off or auto$"):
        load_profile(bad)


def test_options_the_python_engine_does_not_apply_are_named():
    p = load_profile("cpu").with_overrides(["cache-type-k=q8_0", "mlock=true", "no-warmup=true", "threads=2"])
    options, ignored = serving_config(p, True).engine_options()
    assert ignored == ["cache-type-k", "mlock"]  # no-warmup: nothing to do in-process, not named
    assert (options.n_threads, options.n_threads_batch) == (2, 2)
    assert serving_config(p, True).server_args() == [
        "--ctx-size", "4096", "--parallel", "1", "--cache-type-k", "q8_0", "--no-warmup", "--threads", "2",
        "--spec-type", "draft-mtp", "--spec-draft-adaptive", "--spec-draft-adaptive-warmup", "--spec-draft-shadow", "--spec-draft-n-max", "4",
        "--spec-rejection-sampling", "--mlock",  # mlock: a llama-server option no knob declares: passed through as written
    ]  # fmt: skip


def test_rejection_sampling_applies_to_both_engines():
    on = serving_config(load_profile("cpu").with_overrides(["spec-rejection-sampling=true", "logprobs=true"]), True)
    options, ignored = on.engine_options()
    assert options.rejection_sampling is True and ignored == []
    # llama-server takes the option since patch 38; logprobs is silent there (it returns them on request)
    args = on.server_args()
    assert args.count("--spec-rejection-sampling") == 1 and "--logprobs" not in args
    assert on.not_applied("llama-server") == []
    shipped = serving_config(load_profile("cpu"), True)  # the shipped profiles turn it on
    assert shipped.engine_options()[0].rejection_sampling is True and "--spec-rejection-sampling" in shipped.server_args()
    off = serving_config(load_profile("cpu").with_overrides(["spec-rejection-sampling=false"]), True)
    assert off.engine_options()[0].rejection_sampling is False and "--spec-rejection-sampling" not in off.server_args()
    # a [draft] knob: without a drafter the table is not read
    alone = serving_config(load_profile("cpu").with_overrides(["spec-rejection-sampling=true"]), False)
    assert "--spec-rejection-sampling" not in alone.server_args() and not alone.engine_options()[0].rejection_sampling


def test_a_drafter_serving_more_than_one_slot_shares_one_cache_each_slot_capped_at_its_share():
    # a cache per slot splits a batch whose slots bring unequal rows into several passes (ServingConfig.kv_unified)
    four = serving_config(load_profile("cpu").with_overrides(["parallel=4"]), True)
    assert four.kv_unified and four.kv_unified_per_slot == 1024  # ctx-size 4096 / 4
    args = four.server_args()
    assert args[args.index("--kv-unified") :][:3] == ["--kv-unified", "--kv-unified-per-slot", "1024"]
    assert "--no-kv-unified" not in args and four.memory_inputs().kv_unified is True
    # the target alone brings one row a slot, never split: each slot keeps its own cache
    alone = serving_config(load_profile("cpu").with_overrides(["parallel=4"]), False)
    assert not alone.kv_unified and alone.kv_unified_per_slot == 0 and "-kv-unified" not in " ".join(alone.server_args())
    assert alone.memory_inputs().kv_unified is False
    # two slots: their unequal rows make at most two passes, and one cache's attention over both costs more
    two = serving_config(load_profile("cpu").with_overrides(["parallel=2"]), True)
    assert not two.kv_unified and "-kv-unified" not in " ".join(two.server_args())
    three = serving_config(load_profile("cpu").with_overrides(["parallel=3"]), True)
    assert three.kv_unified and three.kv_unified_per_slot == 1365  # 4096 // 3
    # one slot: nothing to share, nothing said
    one = serving_config(load_profile("cpu"), True)
    assert not one.kv_unified and "--kv-unified" not in one.server_args() and one.memory_inputs().kv_unified is False
    # false is a value here (llama-server's --no-kv-unified), not "left out": a cache per slot, no cap
    apart = serving_config(load_profile("cpu").with_overrides(["parallel=4", "kvu=false"]), True)
    assert apart.options.kv_unified is False and apart.kv_unified_per_slot == 0
    assert "--no-kv-unified" in apart.server_args() and "--kv-unified" not in apart.server_args()
    assert apart.memory_inputs().kv_unified is False
    # a cap given stands, said once; the model's own context (ctx-size 0) leaves the slots uncapped
    capped = serving_config(load_profile("cpu").with_overrides(["parallel=4", "kv-unified-per-slot=512"]), True)
    assert capped.server_args().count("--kv-unified-per-slot") == 1 and capped.kv_unified_per_slot == 512
    whole = serving_config(load_profile("cpu").with_overrides(["parallel=4", "ctx-size=false"]), True)
    assert whole.kv_unified and whole.kv_unified_per_slot == 0 and "--kv-unified-per-slot" not in whole.server_args()
    with pytest.raises(GgufExactError, match="kv-unified-per-slot = -1"):
        load_profile("cpu").with_overrides(["kv-unified-per-slot=-1"])


def test_the_slots_keep_a_cache_each_where_the_shared_cache_weighs_against_the_weights(tmp_path):
    """The tiny target's cache at 4 x 512 cells is 0.55 of its weights (lavapipe ran one cache at 0.88x a cache
    each there); a full-size one's is 0.011 (E2B): the rule reads the target's header, as `serve` has it."""
    from gguf_exact.engines.shared.memory_plan import kv_caches
    from gguf_exact.engines.shared.serving_config import SHARED_CACHE_MAX_SHARE
    from gguf_exact.pair.checks import read_model
    from gguf_exact.tiny.hidden_pair import write_hidden_state_pair

    target = read_model(write_hidden_state_pair(tmp_path)[0], "target")
    profile = load_profile("cpu").with_overrides(["parallel=4", "ctx-size=2048"])
    tiny = serving_config(profile, True, target)
    shared = sum(c.bytes for c in kv_caches(target.geometry(), dataclasses.replace(tiny.memory_inputs(), kv_unified=True)))
    assert tiny.shared_cache_share == shared / target.weight_bytes and tiny.shared_cache_share > 0.5
    assert not tiny.kv_unified and "-kv-unified" not in " ".join(tiny.server_args()) and tiny.kv_unified_per_slot == 0
    assert tiny.memory_inputs().kv_unified is False
    # the same cells beside weights ten times their bytes: shared, at the bound and not past it
    at_bound = dataclasses.replace(target, weight_bytes=round(shared / SHARED_CACHE_MAX_SHARE))
    big = serving_config(profile, True, at_bound)
    assert big.shared_cache_share <= SHARED_CACHE_MAX_SHARE and big.kv_unified and big.kv_unified_per_slot == 512
    past = serving_config(profile, True, dataclasses.replace(at_bound, weight_bytes=at_bound.weight_bytes - 1))
    assert past.shared_cache_share > SHARED_CACHE_MAX_SHARE and not past.kv_unified
    # the profile's word stands; without a drafter, or the target unknown, the rule is the slots'
    assert serving_config(profile.with_overrides(["kv-unified=true"]), True, target).kv_unified
    assert not serving_config(profile, False, target).kv_unified
    assert serving_config(profile, True).shared_cache_share is None and serving_config(profile, True).kv_unified


def test_knob_options_become_overrides_after_set():
    seen = {}

    @click.command()
    @overrides_option
    @knob_options
    def command(overrides):
        seen["overrides"] = overrides

    result = CliRunner().invoke(
        command, ["--set", "ctx-size=1", "--ctx-size", "2048", "--no-spec-draft-adaptive", "--flash-attn", "off"]
    )
    assert result.exit_code == 0, result.output
    assert seen["overrides"] == ("ctx-size=1", "ctx-size=2048", "flash-attn=off", "spec-draft-adaptive=false")
    config = serving_config(load_profile("cpu").with_overrides(list(seen["overrides"])), True)
    assert (config.value("ctx_size"), config.adaptive, config.flash_attn) == (2048, False, "off")
    bad = CliRunner().invoke(command, ["--spec-draft-p-min", "2"])
    assert bad.exit_code != 0 and "--spec-draft-p-min" in bad.output


def test_serve_options_are_generated_from_the_settings_model():
    declared = {f.name: f for f in dataclasses.fields(ServeSettings)}
    params = {p.name: p for p in serve.params}
    for name in SERVE_SETTINGS:
        f, p = declared[name], params[name]
        assert p.help == f.metadata["help"] and p.opts == [f"--{name.replace('_', '-')}"]
        assert p.default == f.default, name
    assert params["api_key"].envvar == "GGUF_EXACT_API_KEY" and list(params["engine"].type.choices) == ["llama-server", "python"]
    seen = {}

    @click.command()
    @settings_options(ServeSettings, *SERVE_SETTINGS)
    def command(**given):
        seen.update(given)

    assert CliRunner().invoke(command, ["--port", "9000", "--rpc", "a:1,b:2", "--insecure"]).exit_code == 0
    s = ServeSettings(target="t.gguf", **seen)
    assert (s.port, s.rpc, s.insecure, s.host, s.engine) == (9000, ("a:1", "b:2"), True, "127.0.0.1", "llama-server")


# --- no module reads a profile's tables but the configuration -----------------------------------

READERS = {"engines/shared/profiles.py", "engines/shared/serving_config.py", "engines/shared/knobs.py"}
# Knob keys that are also a request's or settings.json's field names: their tables are reached
# only through .server_table/.draft_table, which the scan finds wherever they are read.
COMMON_WORDS = {"rpc", "logprobs"}


def raw_reads(source: str) -> list[str]:
    """What in ``source`` reads a profile's options around the configuration: its tables, or
    a knob's key used as an index, a ``.get``/``.pop`` key or an ``in`` test."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("server_table", "draft_table"):
            found.append(f"line {node.lineno}: .{node.attr}")
        keys: list[ast.AST] = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop"):
            keys = node.args[:1]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            keys = [node.left]
        for key in keys:
            if isinstance(key, ast.Constant) and key.value in BY_KEY and key.value not in COMMON_WORDS:
                found.append(f"line {node.lineno}: {key.value!r}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        'threads = prof.server_table.get("threads")',
        'n = opts["spec-draft-n-max"]',
        'fa = table.get("fa", "auto")',
        'if "spec-draft-device" not in launch.profile.draft_table: pass',
    ],
)
def test_the_scan_finds_a_raw_read(source):
    assert raw_reads(source)


def test_no_module_reads_a_raw_profile_key():
    found = [
        f"{path.relative_to(ROOT)} {hit}"
        for path in sorted(ROOT.rglob("*.py"))
        if str(path.relative_to(ROOT)) not in READERS
        for hit in raw_reads(path.read_text())
    ]
    assert not found, "\n".join(found)
