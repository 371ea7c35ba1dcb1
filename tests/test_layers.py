"""The package's layers: no module imports (at module or function level) from its own layer's siblings or a layer above."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gguf_exact

ROOT = Path(gguf_exact.__file__).parent

# From the bottom; a unit is a subpackage or a top-level module. A unit may import from
# units in earlier layers only (and from itself); units in one layer are independent.
LAYERS: list[set[str]] = [
    {"errors", "progress", "malloc_tuning", "resources", "version"},
    {"core"},
    {"formats"},
    {"gemma4"},
    {"stream"},
    {"hub"},
    {"drafter", "repack"},
    {"rebuild", "tiny", "verify", "compare"},
    {"builds", "pair"},
    {"runtime"},
    {"serving", "speculative"},  # the two engines: neither imports the other
    {"bench", "doctor", "quality"},
    {"publish"},
    {"demo_generate"},
    {"demo"},
    {"cli"},
    {"__init__", "__main__"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def unit_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(path: Path) -> list[tuple[int, str]]:
    """(line, unit) of every gguf_exact import in ``path``, wherever it stands."""
    module = ["gguf_exact", *path.relative_to(ROOT).with_suffix("").parts]
    package = module[:-1]  # what a relative import starts from (a package's __init__ included)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [f"{target}.{a.name}" for a in node.names] if target == "gguf_exact" else [target]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "gguf_exact":
                found.append((node.lineno, parts[1] if len(parts) > 1 else "__init__"))
    return found


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {unit_of(p) for p in MODULES}
    assert units <= set(RANK), f"not in LAYERS: {sorted(units - set(RANK))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    unit = unit_of(path)
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {target} (layer {RANK.get(target)} >= {RANK[unit]})"
        for line, target in imported_units(path)
        if target != unit and RANK.get(target, len(LAYERS)) >= RANK[unit]
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_first_docstring_line_says_what_it_is(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and doc.strip().splitlines()[0].strip(), f"{path.relative_to(ROOT)}: no module docstring"
