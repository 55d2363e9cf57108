"""Durations as people write them: `90`, `90s`, `15m`, `2h`, `30d`, `1h30m`."""

from __future__ import annotations

import re

from piloop_common.errors import BadRequest

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str, what: str = "duration") -> float:
    t = text.strip().lower()
    try:
        return float(t)
    except ValueError:
        pass
    parts = _PART.findall(t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise BadRequest(f"{what} {text!r}: write it like 90s, 15m, 2h, 30d or 1h30m")
    return sum(float(n) * _UNITS[u] for n, u in parts)
