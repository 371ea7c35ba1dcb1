"""A user's walk-through of the CLI (issue 41): one-line errors for click's usage errors and
bad values, one default draft length in chat, generate and serve, Ctrl-C in chat, the Python
engine's context bound."""

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
