"""Typed errors: the API names its parameters, the CLI names the flags the user typed."""

from pathlib import Path

import pytest
from click.testing import CliRunner

import gguf_exact
from gguf_exact.cli import main
from gguf_exact.errors import ArgumentError, GgufExactError, InputError, OffGridError, PairError, Param


def test_hierarchy():
    for name in ("ArgumentError", "BuildError", "HubError", "InputError", "NotExactError", "PairError", "ServerError"):
        assert issubclass(getattr(gguf_exact, name), GgufExactError) and name in gguf_exact.__all__
    assert issubclass(OffGridError, InputError) and issubclass(PairError, InputError)


def test_param_parts():
    e = ArgumentError(Param("off_grid"), " zz: expected one of q8_0, f16")
    assert str(e) == "off_grid zz: expected one of q8_0, f16" and e.params == ("off_grid",)
    assert e.render(lambda p: p.spelled("--off-grid")) == "--off-grid zz: expected one of q8_0, f16"
    aside = ArgumentError("raise n_ctx", Param("n_ctx", aside=" ({})"), " or shorten it")
    assert str(aside) == "raise n_ctx or shorten it"
    assert aside.render(lambda p: p.spelled("--n-ctx")) == "raise n_ctx (--n-ctx) or shorten it"
    assert str(ArgumentError("drop ", Param("chat", api="chat=True"))) == "drop chat=True"
    assert str(GgufExactError("one\n  line")) == "one line"  # a plain message, as before


def test_api_names_parameters_cli_names_flags(tmp_path):
    from gguf_exact.serving.drafter_lookup import resolve_drafter

    with pytest.raises(ArgumentError) as api:
        resolve_drafter(tmp_path / "t.gguf", "d.gguf", no_draft=True)
    assert str(api.value) == "give draft FILE or no_draft, not both" and "--" not in str(api.value)
    r = CliRunner().invoke(main, ["serve", "--model", "t.gguf", "--draft", "d.gguf", "--no-draft", "--dry-run"])
    assert r.exit_code == 1 and r.stderr == "error: give --draft FILE or --no-draft, not both\n"


def test_cli_flag_of_a_renamed_option(tmp_path):
    """``save_as`` is tune's ``--as``; ``n_values`` its ``--n-max``."""
    from gguf_exact.bench.tune import tuned_name
    from gguf_exact.runtime.profiles import load_profile

    with pytest.raises(ArgumentError, match=r"^save_as '\.\./x': a profile name"):
        tuned_name(load_profile("cpu"), "../x")
    r = CliRunner().invoke(main, ["tune", "--model", str(Path("t.gguf")), "--profile", "cpu", "--as", "../x"])
    assert r.exit_code == 1 and r.stderr.startswith("error: --as '../x': a profile name")
