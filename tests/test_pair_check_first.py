"""A drafter given as the target: every entry point says the same one line (check_pair's),
before anything is loaded in llama.cpp."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from gguf_exact.cli import main
from gguf_exact.errors import PairError
from gguf_exact.tiny.pairs import write_runner_pairs


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return write_runner_pairs(tmp_path_factory.mktemp("pairs"))["agreeing"]


def expected(drafter: Path) -> str:
    return (
        f"error: target {drafter}: general.architecture is 'gemma4-assistant', expected 'gemma4' "
        "(that is a drafter: pass it as --draft)"
    )


def last_line(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(main, args, input="")
    return res.exit_code, res.output.strip().splitlines()[-1]


def test_serve_refuses_a_drafter_as_target(pair):
    _, drafter = pair
    for extra in ([], ["--no-draft"], ["--draft", str(drafter)]):
        assert last_line(["serve", "--model", str(drafter), "--dry-run", *extra]) == (1, expected(drafter))


@pytest.mark.bindings
def test_generate_and_chat_refuse_a_drafter_as_target_before_loading(pair):
    _, drafter = pair
    for args in (
        ["generate", "--model", str(drafter), "--prompt", "x"],
        ["generate", "--model", str(drafter), "--no-draft", "--prompt", "x"],
        ["generate", "--model", str(drafter), "--draft", str(drafter), "--prompt", "x"],
        ["chat", "--model", str(drafter)],
        ["chat", "--model", str(drafter), "--no-draft"],
    ):
        assert last_line(args) == (1, expected(drafter)), args
    from gguf_exact.engines.python.runner import Runner

    with pytest.raises(PairError, match="that is a drafter"):
        Runner(drafter)  # the Python API: the same check, target alone
