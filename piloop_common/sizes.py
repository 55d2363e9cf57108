"""Memory sizes as people write them: `4G`, `512M`, `1.5GiB`, `4096` (MiB), in MiB as grants are counted."""

from __future__ import annotations

import math
import re

from piloop_common.errors import BadRequest

# binary units, as cgroups, Docker (`-m 4g`) and Kubernetes' Gi count memory
_UNITS = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?)?")


def parse_memory(text: str | int, what: str = "--memory") -> int:
    """MiB for `text` (`4G`, `512M`, `1.5GiB`; a bare number is MiB), rounded up; BadRequest naming `what`."""
    if isinstance(text, int) and not isinstance(text, bool):
        mb = float(text)
    else:
        m = _SIZE.fullmatch(str(text).strip().lower())
        if m is None:
            raise BadRequest(f"{what} {text!r}: write a size like 4G, 512M or 1.5GiB (a bare number is MiB)")
        mb = float(m.group(1)) * _UNITS[m.group(2) or "m"]
    if mb <= 0:
        raise BadRequest(f"{what} {text!r}: a memory size must be more than 0")
    return math.ceil(mb)


def format_memory(mb: int | None) -> str:
    """`4.0 GiB` / `512 MiB` for a column; `-` for none."""
    if not mb:
        return "-"
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb} MiB"


def format_bytes(n: int) -> str:
    """`64 MiB` for a whole number of a unit, `80.0 MiB` otherwise, `512 bytes` under a KiB: a size in a message."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{n} bytes"
