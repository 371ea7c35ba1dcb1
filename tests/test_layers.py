"""The package's layers: no module imports (at module or function level) from its own layer's siblings or a layer above."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import gguf_exact

ROOT = Path(gguf_exact.__file__).parent

# From the bottom; a unit is a subpackage or a top-level module. A unit may import from
# units in earlier layers only (and from itself); units in one layer are independent.
LAYERS: list[set[str]] = [
    {"errors", "progress", "malloc_tuning", "constants", "version"},
    {"resources"},
    {"core"},
    {"formats"},
    {"gemma4"},
    {"stream"},
    {"hub"},
    {"drafter", "repack"},
    {"rebuild", "tiny", "verify", "compare"},
    {"builds", "pair"},
    {"engines.shared"},  # settings, the serving configuration, memory plan, run folder, HTTP, status
    {"engines.llama_server", "engines.python"},  # the two engines: neither imports the other
    {"engines"},  # launch (either engine), serve, the drafter lookup, llama-server's logged buffers
    {"bench", "doctor", "quality"},
    {"publish"},
    {"demo_generate"},
    {"demo"},
    {"cli"},
    {"__init__", "__main__"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
# engines/ holds three layers: shared/ (what both engines use), one per engine (llama_server.py,
# python/) and the modules that drive either.
ENGINE_UNITS = {"shared": "engines.shared", "python": "engines.python", "llama_server": "engines.llama_server"}


def unit_of_module(parts: list[str]) -> str:
    """The unit of module ``gguf_exact.<parts...>`` (parts without ``gguf_exact``)."""
    if not parts:
        return "__init__"
    if parts[0] == "engines":
        return ENGINE_UNITS.get(parts[1] if len(parts) > 1 else "", "engines")
    return parts[0]


def unit_of(path: Path) -> str:
    return unit_of_module(list(path.relative_to(ROOT).with_suffix("").parts))


def is_module(name: str) -> bool:
    """``gguf_exact.a.b`` names a module or package of this package."""
    rel = ROOT.joinpath(*name.split(".")[1:])
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (text about modules, not a use of them)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def imported_units(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, unit) of every gguf_exact import in ``path``, wherever it stands, and of every
    string naming one of its modules (``python -m gguf_exact.x``, ``importlib``): a module
    started or imported by name is a dependency all the same."""
    module = ["gguf_exact", *path.relative_to(ROOT).with_suffix("").parts]
    package = module[:-1]  # what a relative import starts from (a package's __init__ included)
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{a.name}" if is_module(f"{target}.{a.name}") else target for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            names = [m for m in re.findall(r"\bgguf_exact(?:\.\w+)+", node.value) if is_module(m)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "gguf_exact":
                found.append((node.lineno, unit_of_module(parts[1:])))
    return found


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {unit_of(p) for p in MODULES}
    assert units <= set(RANK), f"not in LAYERS: {sorted(units - set(RANK))}"


def upward_imports(path: Path, source: str | None = None) -> list[str]:
    unit = unit_of(path)
    return [
        f"{path.relative_to(ROOT)}:{line} imports {target} (layer {RANK.get(target)} >= {RANK[unit]})"
        for line, target in imported_units(path, source)
        if target != unit and RANK.get(target, len(LAYERS)) >= RANK[unit]
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    upward = upward_imports(path)
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    "module, source, other",
    [
        # the dodge the old launcher used: the other engine started by a module string
        (
            "engines/llama_server.py",
            'CMD = ["python", "-m", "gguf_exact.engines.python.openai_server"]',
            "engines.python",
        ),
        ("engines/llama_server.py", "from gguf_exact.engines.python import engine", "engines.python"),
        (
            "engines/python/server_main.py",
            "import importlib\nimportlib.import_module('gguf_exact.engines.llama_server')",
            "engines.llama_server",
        ),
        ("engines/python/server_main.py", "from gguf_exact.engines import llama_server", "engines.llama_server"),
        ("engines/shared/process.py", "from gguf_exact.engines.launch import plan_launch", "engines"),
    ],
)
def test_no_way_around_the_engine_rule(module, source, other):
    """Neither engine reaches the other, by import or by a module named in a string."""
    found = upward_imports(ROOT / module, source)
    assert len(found) == 1 and f"imports {other} " in found[0], found


def test_a_docstring_may_name_a_module():
    assert upward_imports(ROOT / "engines/llama_server.py", '"""Unlike gguf_exact.engines.python.engine."""') == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_first_docstring_line_says_what_it_is(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and doc.strip().splitlines()[0].strip(), f"{path.relative_to(ROOT)}: no module docstring"


MAX_PARAMETERS = 10  # more: pass a request or settings object (ServeSettings, BenchRequest, TuneRequest)
WIDE_FUNCTIONS: set[str] = set()


def wide_functions(path: Path, source: str | None = None) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            if len(names) > MAX_PARAMETERS:
                found.append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_no_function_outside_the_cli_takes_more_than_ten_parameters():
    wide = {f for p in MODULES if unit_of(p) != "cli" for f in wide_functions(p)}
    assert wide == WIDE_FUNCTIONS
    eleven = "def f(" + ", ".join(f"a{i}" for i in range(11)) + "): pass\nclass C:\n    def m(self, a, b): pass\n"
    assert wide_functions(ROOT / "bench" / "run.py", eleven) == ["bench/run.py:f"]


MAX_LINES = 450  # a module past this is two concepts: split it


def test_no_module_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


ENV_READ = re.compile(r"""(environ\.get|environ\[|getenv)\(?\s*["']GGUF_EXACT_""")


def test_every_environment_variable_is_read_in_constants():
    reads = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in MODULES
        if p.name != "constants.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if ENV_READ.search(line)
    ]
    assert reads == []
    assert ENV_READ.search('key = os.environ.get("GGUF_EXACT_API_KEY")') and ENV_READ.search(
        "os.environ['GGUF_EXACT_CACHE']"
    )
