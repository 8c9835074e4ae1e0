"""House rules checked on the source: no function over 100 lines in snapver/, and no ops module
taking another ops module's private name."""

from __future__ import annotations

import ast
from pathlib import Path

SNAPVER = Path(__file__).resolve().parent.parent / "snapver"
MAX_FUNCTION_LINES = 100


def _modules() -> list[Path]:
    return sorted(SNAPVER.rglob("*.py"))


def _long_functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = path.relative_to(SNAPVER.parent).with_suffix("").as_posix().replace("/", ".")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append((f"{module}.{node.name}", length))
    return found


def test_no_function_is_over_100_lines() -> None:
    too_long = [f"{name} ({length} lines)" for path in _modules() for name, length in _long_functions(path)]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(too_long)}"


def _private_imports_across_ops(path: Path) -> list[str]:
    """``from snapver.ops.other import _name`` (or ``from .other import _name``) in an ops module."""
    own = path.stem
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level == 1:
            source = module.split(".")[0]
        elif node.level == 0 and module.startswith("snapver.ops."):
            source = module.split(".")[2]
        else:
            continue
        found += [f"{own} takes {source}.{alias.name}" for alias in node.names
                  if source != own and alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_ops_module_takes_another_ops_modules_private_name() -> None:
    found = [item for path in sorted((SNAPVER / "ops").rglob("*.py")) for item in _private_imports_across_ops(path)]
    assert not found, "; ".join(found)
