"""How `piloop serve` and `piloop worker` write their logs: `text` (one `event=… key=value` line an event, as
before) or `json` (one JSON object a line, for a log pipeline).

A JSON line has `ts` (UTC, ISO 8601), `level`, `logger`, then the event's own fields under the keys the events
stream uses (`type` for the event's name, `job`, `worker`, `pool`…), and `msg` for any text that is not a field
(a library's line is all `msg`). Values stay strings, as in the events stream. No line carries a credential: the
code logs none, and a field whose key names one (`authorization`, `password`, `secret`, `credential`) is
replaced by `[redacted]` whatever a caller passed.

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
from typing import IO, Literal

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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        for k, v in fields(record.getMessage()).items():
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
