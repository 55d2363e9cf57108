"""One name, one thing: no two classes of the three packages share a name (a reader who meets `Held` or `Worker`
knows which one without looking at the import)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("piloop_common", "piloop_server", "piloop_worker")


def _shared(modules: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Each class name defined more than once (nested and private classes too) -> where each one is."""
    where: dict[str, list[str]] = defaultdict(list)
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path}:{node.lineno}")
    return {name: places for name, places in where.items() if len(places) > 1}


def test_no_two_classes_share_a_name() -> None:
    modules = {
        str(path.relative_to(ROOT)): ast.parse(path.read_text(), str(path))
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
    }
    assert len(modules) > 100
    assert _shared(modules) == {}


def test_the_rule_finds_a_shared_name() -> None:
    modules = {
        "a.py": ast.parse("class Held:\n    pass\n"),
        "b.py": ast.parse("def f():\n    class Held:\n        pass\n"),
        "c.py": ast.parse("class Lease:\n    pass\n"),
    }
    assert _shared(modules) == {"Held": ["a.py:1", "b.py:2"]}
