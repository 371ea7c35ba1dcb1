"""A user's walk-through of the CLI (issue 41): one-line errors for click's usage errors and
bad values, one default draft length in chat, generate and serve, Ctrl-C in chat, the Python
engine's context bound."""

import pytest
from click.testing import CliRunner

from gguf_exact.cli import load_groups, main


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="gguf-exact", env=env)


def one_error_line(r) -> str:
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


# --- click's usage errors read as every other failure: one `error:` line, exit status 1 ------


def test_an_unknown_option_is_one_error_line_in_every_command():
    for name in sorted(load_groups()):
        line = one_error_line(run(name, "--no-such-option"))
        assert line.startswith("error: No such option '--no-such-option'"), line
        assert line.endswith(f"(see `gguf-exact {name} --help`)"), line


def test_usage_errors_keep_clicks_hint():
    cases = {
        ("--bogus",): "error: No such option '--bogus' (see `gguf-exact --help`)",
        ("nope",): "error: No such command 'nope' (see `gguf-exact --help`)",
        ("convert",): "error: Missing argument 'SRC_DIR' (see `gguf-exact convert --help`)",
        ("convert", "a", "b", "--off-grid", "q9"): "error: Invalid value for '--off-grid': 'q9' is not one of "
        "'q8_0', 'f16', 'bf16', 'f32' (see `gguf-exact convert --help`)",
        ("generate", "--model", "t.gguf", "--prompt", "hi", "--n-predict", "-5"): "error: Invalid value for "
        "'--n-predict': -5 is not in the range x>=1 (see `gguf-exact generate --help`)",
        ("chat", "--model", "t.gguf", "--n-max", "-1"): "error: Invalid value for '--n-max': -1 is not in the "
        "range x>=0 (see `gguf-exact chat --help`)",
    }
    for args, expected in cases.items():
        assert one_error_line(run(*args)) == expected


def test_a_word_for_a_count_in_set_is_one_error_line(tiny, tmp_path):
    env = {"GGUF_EXACT_RUN_DIR": str(tmp_path / "run")}
    base = ["serve", "--model", tiny / "target.gguf", "--no-draft", "--profile", "cpu", "--dry-run"]
    line = one_error_line(run(*base, "--set", "ctx-size=abc", env=env))
    assert line == "error: --set: [server] ctx-size = 'abc': expected a whole number"
    line = one_error_line(run(*base, "--set", "draft.spec-draft-n-max=1.5", env=env))
    assert line == "error: --set: [draft] spec-draft-n-max = 1.5: expected a whole number"
    assert run(*base, "--set", "ctx-size=512", env=env).exit_code == 0


# --- the Python engine's context: the size asked for, not llama.cpp's padded one -------------


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    """The agreeing pair: the target repeats its last token, the drafter says so too."""
    from gguf_exact.drafter.convert import convert_drafter
    from gguf_exact.tiny.models import write_agreeing_pair

    target, hf = write_agreeing_pair(tmp_path_factory.mktemp("agreeing"))
    return target, convert_drafter(hf, hf.parent / "drafter.gguf", target).path


@pytest.mark.bindings
def test_a_prompt_over_a_small_context_is_refused_naming_it(agreeing):
    """llama.cpp pads ctx-size=64 to 256 and llama-cpp-python keeps a 64-token buffer: a
    112-token prompt passed the check against 256 and broke in the generation loop (HTTP
    500, `could not broadcast input array from shape (64,) into shape (62,)`)."""
    from gguf_exact.speculative.engine import MtpLlama

    llm = MtpLlama(*agreeing, n_ctx=64)
    try:
        assert (llm.context_size, llm.n_ctx()) == (64, 256)
        with pytest.raises(ValueError, match=r"^Requested tokens \(113\) exceed context window of 64$"):
            llm.create_completion("x " * 111, max_tokens=4)
        usage = llm.create_completion("x " * 50, max_tokens=0)["usage"]  # 0: up to the end of the context
        assert usage == {"prompt_tokens": 52, "completion_tokens": 12, "total_tokens": 64}
    finally:
        llm.close()
