"""The import layers hold without function-level imports hiding an edge.

``lint-imports`` (in the test command) checks the layers contract; this test pins the second
half of the rule in docs/architecture.md: no first-party import is placed inside a function,
where it would read as a lazy import while quietly running back up the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = ("gpufrag", "scheduler", "defrag", "node", "serving", "simulations", "devkit",
               "benchmarks")


def _function_level_imports(path: Path) -> list[str]:
    found = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                      if name.split(".")[0] in FIRST_PARTY]
    return found


@pytest.mark.parametrize("package", FIRST_PARTY)
def test_no_first_party_import_inside_a_function(package: str) -> None:
    found = [hit for path in sorted((ROOT / package).rglob("*.py"))
             for hit in _function_level_imports(path)]
    assert found == []
