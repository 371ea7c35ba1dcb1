"""Typed errors: the API names its parameters, the CLI names the flags the user typed."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import gguf_exact
from gguf_exact.cli import load_groups, main
from gguf_exact.errors import (
    ArgumentError,
    GgufExactError,
    InputError,
    Message,
    OffGridError,
    PairError,
    Param,
    param_name,
    render,
)


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


def test_message_is_the_python_text_and_renders_flags():
    import json

    m = Message("give ", Param("vocab_from", value="TARGET.gguf"), " to compare")
    assert m == "give vocab_from=TARGET.gguf to compare" and isinstance(m, str)
    assert m.render(lambda p: p.spelled("--vocab-from")) == "give --vocab-from TARGET.gguf to compare"
    both = Message.joined("; ", ["plain", m])
    assert both == "plain; give vocab_from=TARGET.gguf to compare" and json.dumps([both]) == json.dumps([str(both)])
    assert render(both, lambda p: "--x") == "plain; give --x to compare" and render("plain", lambda p: "--x") == "plain"
    e = InputError("d.gguf: ", both)  # an error brings in a Message's parameters
    assert (
        e.params == ("vocab_from",)
        and e.render(lambda p: p.spelled("--v")) == "d.gguf: plain; give --v TARGET.gguf to compare"
    )


def test_api_names_parameters_cli_names_flags(tmp_path):
    from gguf_exact.engines.drafter_lookup import resolve_drafter

    with pytest.raises(ArgumentError) as api:
        resolve_drafter(tmp_path / "t.gguf", "d.gguf", no_draft=True)
    assert str(api.value) == "give draft FILE or no_draft, not both" and "--" not in str(api.value)
    r = CliRunner().invoke(main, ["serve", "--model", "t.gguf", "--draft", "d.gguf", "--no-draft", "--dry-run"])
    assert r.exit_code == 1 and r.stderr == "error: give --draft FILE or --no-draft, not both\n"


def test_cli_flag_of_a_renamed_option(tmp_path):
    """``save_as`` is tune's ``--as``; ``n_values`` its ``--n-max``."""
    from gguf_exact.bench.tune import tuned_name
    from gguf_exact.engines.shared.profiles import load_profile

    with pytest.raises(ArgumentError, match=r"^save_as '\.\./x': a profile name"):
        tuned_name(load_profile("cpu"), "../x")
    r = CliRunner().invoke(main, ["tune", "--model", str(Path("t.gguf")), "--profile", "cpu", "--as", "../x"])
    assert r.exit_code == 1 and r.stderr.startswith("error: --as '../x': a profile name")


def _raised(fn):
    try:
        fn()
    except GgufExactError as e:
        return e
    raise AssertionError("nothing raised")


def _text(x, name) -> str:
    """``x`` (an error, a Message or plain text) as the front end whose spelling is ``name`` says it."""
    return x.render(name) if isinstance(x, GgufExactError) else render(x, name)


def _spelled_cases():
    """(command, text as spelled by ``name``, the API's words, the CLI's words) for each
    message of the library that names a parameter."""
    from gguf_exact.drafter.verify import NO_TARGET
    from gguf_exact.engines.drafter_lookup import resolve_drafter
    from gguf_exact.engines.shared.memory_plan import MemoryPlan, PlanItem
    from gguf_exact.engines.shared.profiles import load_profile
    from gguf_exact.repack.check import NO_DONOR
    from gguf_exact.stream.verify import Verification

    v = Verification(Path("d.gguf"), Path("src"), unchecked=[Message("10 keys (tokenizer.*): ", NO_TARGET)])
    big = MemoryPlan([PlanItem("model", 8 << 30, 0)], gpu=True, n_ctx=4096)

    def overrides(pair):
        return _raised(lambda: load_profile("cpu").with_overrides([pair]))

    return [
        ("verify", lambda n: _text(NO_TARGET, n), "by convert; give vocab_from=TARGET.gguf",
         "by convert --vocab-from; give --vocab-from TARGET.gguf"),
        ("verify", lambda n: _text(NO_DONOR, n), "give donor=DONOR.gguf", "give --donor DONOR.gguf"),
        ("verify", lambda n: v.verdict(False, n), "; allow_unchecked=True accepts that", "; --allow-unchecked accepts that"),
        ("verify", lambda n: v.verdict(True, n), "not judged (allow_unchecked=True): 10 keys",
         "not judged (--allow-unchecked): 10 keys"),
        ("verify", lambda n: _text(v.error(), n), "; pass allow_unchecked=True to accept that",
         "give --vocab-from TARGET.gguf to compare them as bytes; pass --allow-unchecked to accept that"),
        ("serve", lambda n: _text(overrides("api-key=x"), n), "overrides: [server] api-key is set by gguf-exact serve; use api_key or",
         "--set: [server] api-key is set by gguf-exact serve; use --api-key or"),
        ("serve", lambda n: _text(overrides("model=x"), n), "use target instead", "use --model instead"),
        ("serve", lambda n: _text(overrides("no-mmap=true"), n), "overrides: no-mmap = True turns mmap off",
         "--set: no-mmap = True turns mmap off"),
        ("serve", lambda n: _text(big.warning(4096), n), "lower ctx-size or n-gpu-layers",
         "lower ctx-size (--set ctx-size=N) or n-gpu-layers"),
        ("serve", lambda n: _text(resolve_drafter(Path("t.gguf"), None, no_draft=True).how, n),
         "no_draft=True: the target alone", "--no-draft: the target alone"),
        ("serve", lambda n: _text(resolve_drafter(Path("t.gguf"), None, default_auto=False).how, n),
         "no draft: the target alone", "no --draft: the target alone"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(len(_spelled_cases())))
def test_library_messages_name_parameters_the_cli_names_flags(case):
    """What the library says names no ``--flag`` (``str()`` of a Message or error is the
    Python spelling); the CLI renders the same message with the command's flags."""
    from gguf_exact.cli.app import flags

    command, text, api_words, cli_words = _spelled_cases()[case]
    api, cli = text(param_name), text(flags(load_groups()[command]))
    assert api_words in api and not re.search(r"(?<![\w-])--[a-z]", api), api
    assert cli_words in cli, cli
