"""docs/logs.md's schema of the log events, read for the tests that hold the code and the logs to it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LOGS_MD = REPO / "docs" / "logs.md"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
LINE_KEYS = {"ts", "level", "logger", "type", "msg", "exc"}  # every line's own, beside an event's fields
_ROW = re.compile(r"^\| `([a-z0-9_.]+)` \| ([a-z ]+) \| (.*) \|$")
_FIELD = re.compile(r"^`([a-z_][a-z0-9_.]*)` ([a-z|]+)$")
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class Event:
    name: str
    levels: frozenset[str]
    fields: dict[str, tuple[str, ...]]  # key -> the JSON types it may have


def schema() -> dict[str, Event]:
    out: dict[str, Event] = {}
    for line in LOGS_MD.read_text().splitlines():
        m = _ROW.match(line)
        if m is None:
            continue
        name, levels, cells = m.groups()
        fields: dict[str, tuple[str, ...]] = {}
        for cell in [] if cells.strip() == "-" else cells.split(", "):
            f = _FIELD.match(cell.strip())
            assert f is not None, f"docs/logs.md, {name}: a field written `key` type: {cell!r}"
            types = tuple(f.group(2).split("|"))
            assert set(types) <= set(JSON_TYPES), f"docs/logs.md, {name}.{f.group(1)}: unknown type {types}"
            fields[f.group(1)] = types
        assert name not in out, f"docs/logs.md: {name} twice"
        out[name] = Event(name, frozenset(levels.split(" or ")), fields)
    return out


def is_type(value: Any, types: tuple[str, ...]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    return any(isinstance(value, JSON_TYPES[t]) for t in types)


@dataclass(frozen=True)
class Call:
    where: str
    level: str
    fmt: str


def log_calls(*roots: str) -> Iterator[Call]:
    """Every `log.<level>("event=…", …)` call in the packages."""
    for root in roots:
        for p in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr not in LEVELS or not node.args:
                    continue
                first = node.args[0]
                if (
                    isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                    and first.value.startswith("event=")
                ):
                    level = "error" if node.func.attr in ("exception", "critical") else node.func.attr
                    yield Call(f"{p.relative_to(REPO)}:{node.lineno}", level, first.value)
