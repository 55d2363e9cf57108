"""One name, one thing: no two classes of the three packages share a name (a reader who meets `Held` or `Worker`
knows which one without looking at the import), and the state facades are named one way (docs/architecture.md,
"Names")."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("piloop_common", "piloop_server", "piloop_worker")
STATE = ROOT / "piloop_server" / "state"
LOCKS = {"LeaderLease", "GcLock"}  # a lock one server holds, named for the lock
STORE = {"generation.py"}  # the store itself, not a concept's records: functions that take a client


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


def _on_the_store(tree: ast.Module) -> tuple[list[str], list[str]]:
    """(classes built on a client and keys, public module functions that take a client and keys) of one module."""
    classes, functions = [], []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            fields = [a.arg for a in init.args.args[1:3]] if init else []
            if not init:  # a dataclass: the types of its first two attributes
                fields = [ast.unparse(f.annotation) for f in node.body if isinstance(f, ast.AnnAssign)][:2]
            if fields in (["client", "keys"], ["Client", "Keys"]):
                classes.append(node.name)
        elif isinstance(node, ast.FunctionDef) and [a.arg for a in node.args.args[:2]] == ["client", "keys"]:
            functions.append(node.name)
    return classes, functions


def test_every_state_facade_is_a_class_named_for_its_concept_and_state() -> None:
    misnamed, functions = [], []
    for path in sorted(STATE.glob("*.py")):
        classes, funcs = _on_the_store(ast.parse(path.read_text(), str(path)))
        misnamed += [f"{path.name}:{c}" for c in classes if not c.endswith("State") and c not in LOCKS]
        if path.name not in STORE:
            functions += [f"{path.name}:{f}" for f in funcs]
    assert misnamed == [] and functions == []


def test_the_facade_rule_finds_a_misnamed_facade_and_a_function() -> None:
    tree = ast.parse(
        "class Leases:\n    def __init__(self, client, keys): ...\n"
        "@dataclass\nclass Sessions:\n    r: Client\n    k: Keys\n"
        "def every(client, keys): ...\n"
    )
    assert _on_the_store(tree) == (["Leases", "Sessions"], ["every"])
