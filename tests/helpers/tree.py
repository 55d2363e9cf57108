"""The tree's modules, parsed once per test process, and the piloop imports each makes (tests/unit/test_tree.py)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("piloop_common", "piloop_server", "piloop_worker")


@functools.cache
def parsed() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the three packages with its syntax tree, in path order."""
    return tuple(
        (path, ast.parse(path.read_text(), str(path)))
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
    )


def module_name(path: Path) -> str:
    """`piloop_common/sdk/tasks.py` -> `piloop_common.sdk.tasks`; a package's `__init__.py` is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _statements(body: list[ast.stmt], *, top: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `body`: with `top`, those run at import (not inside a function or a class, nor
    under `if TYPE_CHECKING`); else every one, lazy or not."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not top:
            yield from (n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            yield from _statements(node.body + node.orelse, top=True)
        elif isinstance(node, ast.Try):
            yield from _statements(node.body + node.orelse + node.finalbody, top=True)
            for handler in node.handlers:
                yield from _statements(handler.body, top=True)


def imports(name: str, tree: ast.Module, *, top: bool, package: bool = False) -> Iterator[tuple[str, int]]:
    """The modules module `name` imports, absolute, with each line: `from a.b import c` gives `a.b.c` (whether `c`
    is a module or a name in `a.b`: callers match by prefix), `import a.b` gives `a.b`. `top`: only those run at
    import time; else lazy ones too."""
    for node in _statements(tree.body, top=top):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
            continue
        base = node.module or ""
        if node.level:
            here = name.split(".") if package else name.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join([*here, base] if base else here)
        for alias in node.names:
            yield f"{base}.{alias.name}", node.lineno


@functools.cache
def nodes(tree: ast.AST) -> tuple[ast.AST, ...]:
    """`ast.walk(tree)` once: the tests walk the same trees several times, and the walk costs more than a parse."""
    return tuple(ast.walk(tree))
