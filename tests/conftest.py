import os
import shutil
from pathlib import Path

import pytest

# pytest-xdist sets COLUMNS and LINES in its worker to the controller's terminal size, before
# the commands' console is made; commands read COLUMNS off a terminal, so a test sets it itself.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

from gguf_exact.tiny.models import write_tiny_drafter, write_tiny_target


@pytest.fixture(scope="session", autouse=True)
def _own_user_config(tmp_path_factory):
    """The user's ~/.config/gguf-exact (tuned profiles, recipes, pins) never reaches a test:
    every test, and every command it starts, sees an empty config folder of its own."""
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    yield
    if old is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = old


@pytest.fixture(scope="session")
def aot_cache(tmp_path_factory) -> Path:
    """A cache folder (``GGUF_EXACT_CACHE``) holding this machine's kernels compiled ahead of
    time, built once per session by the build ``make setup`` runs (numba.pycc: seconds)."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("aot-cache")
    done = subprocess.run(
        [sys.executable, "-m", "gguf_exact.builds.aot_kernels_build"],
        capture_output=True, text=True, timeout=900, env=os.environ | {"GGUF_EXACT_CACHE": str(root)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder of the test module's own (``GGUF_EXACT_RUN_DIR``: the servers' pid files
    and logs), so no test sees another module's servers."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("run")
    mp.setenv("GGUF_EXACT_RUN_DIR", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A tiny gemma4 target GGUF and QAT drafter checkpoints (fp32 and bf16 steps)."""
    root = tmp_path_factory.mktemp("tiny")
    write_tiny_target(root / "target.gguf", seed=0)
    write_tiny_drafter(root / "drafter-fp32", seed=1, step_kind="fp32")
    write_tiny_drafter(root / "drafter-bf16", seed=1, step_kind="bf16")
    write_tiny_drafter(root / "drafter-sharded", seed=1, step_kind="fp32", shards=3)
    return root


@pytest.fixture
def drafter_copy(tiny, tmp_path) -> Path:
    """A writable copy of the fp32-step drafter, for tests that break it."""
    dst = tmp_path / "drafter"
    shutil.copytree(tiny / "drafter-fp32", dst)
    return dst


# What `generate --json` must report (issue 4), checked on the CLI and the API alike.
GENERATION_JSON_KEYS = {
    "tokens", "text", "target_passes", "drafts_generated", "drafts_accepted", "acceptance_rate",
    "mean_accepted_length", "tokens_per_target_pass", "wall_seconds", "tokens_per_second",
    "overhead_per_step_us",  # the Generation attribute's name (docs/python-engine.md), not python_overhead_...
}  # fmt: skip


# --- make test-quick: the tests that need no build ------------------------------------------

BUILD_MARKS = ("llama_server", "bindings", "vulkan")


def module_marks(path: Path) -> set[str]:
    """The marks a test module sets for every test in it (``pytestmark = pytest.mark.X`` or a list)."""
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute) and n.attr in BUILD_MARKS}
    return set()


def pytest_ignore_collect(collection_path, config):
    """A module marked whole for a build is not imported at all where ``-m`` deselects
    its marks (``make test-quick``): its imports need the bindings. Everywhere else
    (``make test``) it is collected, and fails when its build is missing."""
    expr = config.getoption("markexpr")
    if not expr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    marks = module_marks(collection_path)
    if not marks:
        return None
    from _pytest.mark.expression import Expression  # how pytest itself evaluates -m

    return True if not Expression.compile(expr).evaluate(lambda name, **_: name in marks) else None
