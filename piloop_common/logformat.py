"""How `piloop serve` and `piloop worker` write their logs: `text` (one `event=… key=value` line an event, as
before) or `json` (one JSON object a line, for a log pipeline).

A JSON line has `ts` (UTC, ISO 8601), `level`, `logger`, then the event's own fields under the keys the events
stream uses (`type` for the event's name, `job`, `worker`, `pool`…), and `msg` for any text that is not a field
(a library's line is all `msg`). A field is typed by what the log call passed: `%d` an integer, `%g`/`%.2f` a
number, `%s` of a number, a boolean or None that number, boolean or null, else a string (`typed_fields`); each
event's fields and their types are in docs/logs.md. No line carries a credential: the code logs none, and a field
whose key names one (`authorization`, `password`, `secret`, `credential`) is replaced by `[redacted]` whatever a
caller passed.

The format is `--log-format`, else `PILOOP_LOG_FORMAT`, else the config's `log_format`; `piloop serve` sets
`PILOOP_LOG_FORMAT` for the processes it starts (its worker, its task workers), so they write alike.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
import time
from dataclasses import dataclass
from typing import IO, Any, Literal

LogFormat = Literal["text", "json"]
ENV = "PILOOP_LOG_FORMAT"
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"
REDACTED = "[redacted]"
SECRET_KEYS = re.compile(r"authorization|password|secret|credential|bearer", re.IGNORECASE)

_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)=")
_NEXT_KEY = re.compile(r" (?=[A-Za-z_][A-Za-z0-9_.]*=)")


def fields(message: str) -> dict[str, str]:
    """The `key=value` fields a log line starts with, and the text after them as `msg`. A value runs to the next
    ` key=`; a quoted one (`%r`) is read as the string it quotes. `event=` is the events stream's `type`."""
    out: dict[str, str] = {}
    i, n = 0, len(message)
    while i < n:
        m = _KEY.match(message, i)
        if m is None:
            break
        key, i = m.group(1), m.end()
        if i < n and message[i] in "'\"":
            value, i = _quoted(message, i)
        else:
            nxt = _NEXT_KEY.search(message, i)
            end = nxt.start() if nxt else n
            value, i = message[i:end], end
        out["type" if key == "event" else key] = REDACTED if SECRET_KEYS.search(key) else value
        while i < n and message[i] == " ":
            i += 1
    rest = message[i:].lstrip(" :")
    if rest:
        out["msg"] = rest
    return out


def _quoted(message: str, i: int) -> tuple[str, int]:
    """The Python string literal at `i` (as `%r` wrote it) and where it ends; an unclosed one runs to the end."""
    quote = message[i]
    j = i + 1
    while j < len(message):
        if message[j] == "\\":
            j += 2
            continue
        if message[j] == quote:
            try:
                return str(ast.literal_eval(message[i : j + 1])), j + 1
            except (ValueError, SyntaxError):
                break
        j += 1
    return message[i + 1 :], len(message)


# a printf conversion as logging's `%` formatting takes it (no mapping keys: the log calls pass positional args)
_PLACEHOLDER = re.compile(r"%[-#0 +]*(?:\d+)?(?:\.(?P<precision>\d+))?(?P<conv>[diouxXeEfFgGcrsa%])")
_VALUE_END = " :,"


@dataclass(frozen=True)
class FormatField:
    """One `key=…` of a log call's format: its key, and the one placeholder that is its whole value (None for a
    literal, or text with placeholders inside, like `event=provisioner.%s`: a string)."""

    key: str
    text: str
    placeholder: re.Match[str] | None


def format_fields(fmt: str) -> tuple[list[FormatField], str]:
    """The `key=…` fields a log call's format starts with, and the format's rest (its prose)."""
    out: list[FormatField] = []
    i, n = 0, len(fmt)
    while i < n:
        m = _KEY.match(fmt, i)
        if m is None:
            break
        key, j = m.group(1), m.end()
        p = _PLACEHOLDER.match(fmt, j)
        if p is not None and p["conv"] != "%" and (p.end() == n or fmt[p.end()] in _VALUE_END):
            out.append(FormatField(key, p[0], p))
            i = p.end()
        else:
            end = fmt.find(" ", j)
            i = n if end < 0 else end
            out.append(FormatField(key, fmt[j:i], None))
        while i < n and fmt[i] == " ":
            i += 1
    return out, fmt[i:]


def typed_fields(fmt: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
    """The fields of a log call `log.info("event=x key=%d …", *args)`, each value its argument as JSON would hold it
    (`%d` an int, `%.2f` a float, `%s` of an int, a bool or None that, else the text), and the text after the fields,
    rendered, as `msg`. None when the call has another shape (then `fields` reads the rendered line)."""
    out: dict[str, Any] = {}
    specs, rest = format_fields(fmt)
    k = 0
    try:
        for f in specs:
            if f.placeholder is not None:
                value = _typed(args[k], f.placeholder)
                k += 1
            else:
                used = sum(1 for q in _PLACEHOLDER.finditer(f.text) if q["conv"] != "%")
                value = f.text % tuple(args[k : k + used])
                k += used
            out["type" if f.key == "event" else f.key] = REDACTED if SECRET_KEYS.search(f.key) else value
        rest = rest % tuple(args[k:])
    except (IndexError, TypeError, ValueError):
        return None
    rest = rest.lstrip(" :")
    if rest:
        out["msg"] = rest
    return out


def _typed(arg: Any, p: re.Match[str]) -> Any:
    conv, precision = p["conv"], p["precision"]
    try:
        if conv in "di":
            return int(arg)
        if conv in "eEfFgG":
            got = float(arg)
            if got != got or got in (float("inf"), float("-inf")):
                return str(got)  # JSON has no NaN
            return round(got, int(precision)) if precision is not None else got
    except (TypeError, ValueError):
        return p[0] % (arg,) if conv == "s" else str(arg)
    if conv in "rs" and (arg is None or isinstance(arg, bool | int | str)):
        return arg
    if conv in "rs" and isinstance(arg, float):
        return arg if arg == arg and arg not in (float("inf"), float("-inf")) else str(arg)
    return p[0] % (arg,)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        got = None
        if isinstance(record.msg, str) and isinstance(record.args, tuple):
            got = typed_fields(record.msg, record.args)
        if got is None:
            got = dict(fields(record.getMessage()))
        for k, v in got.items():
            line.setdefault(k, v)  # a field never overrides the line's own keys
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup(fmt: LogFormat, stream: IO[str] | None = None) -> None:
    """The root logger writes `fmt` lines to `stream` (stderr), at INFO; uvicorn's loggers go through it too."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
