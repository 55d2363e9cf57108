"""Human output that lines up, and JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import click


def table(headers: list[str], rows: Iterable[list[Any]]) -> str:
    """Columns left-aligned, two spaces apart, one space before the first (as the docs print them)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join((" " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False))).rstrip() for r in cells)


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(seconds)
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    if s < 172800:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


def when(ms: int | None) -> str:
    if not ms:
        return "-"
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")


def value_text(value: Any) -> str:
    """A setting's value as TOML writes it: a whole float as `100000` (TOML and the limits read it back the same), a
    string bare, anything else as JSON (`null`, `true`, `["process"]`)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def progress(line: str) -> None:
    """A progress line that rewrites itself on a terminal, and is quiet elsewhere."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + line)
        sys.stderr.flush()


class WaitNote:
    """A wait's progress line, and why it waits: on a terminal one line that rewrites itself; elsewhere (a script,
    `make demo`) a `waiting: …` line each time the reason changes, so a log says why nothing moved."""

    def __init__(self) -> None:
        self.said = ""

    def show(self, line: str, why: str = "") -> None:
        progress((line + (f"; waiting: {why}" if why else ""))[:300])
        if why and why != self.said and not sys.stderr.isatty():
            click.echo(f"waiting: {why}", err=True)
        self.said = why


def progress_done() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def parse_env(pairs: Iterable[str], flag: str = "--env") -> dict[str, str]:
    """`K=V` flags as a dict; a usage error naming the flag for one without `=`."""
    env = {}
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise click.UsageError(f"{flag} {kv!r}: write K=V")
        env[k] = v
    return env
