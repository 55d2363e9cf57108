"""The one rule for token and worker names: they become parts of Redis keys, work dirs and log lines.

Lowercase letters, digits, then `.`, `_`, `-`, at most 63 characters, so a name can never contain a key's `:` or
hash tag braces, a path's `/`, or a glob's `*`. `serve` (the daemon's own worker) and names beginning `piloop` are
reserved.
"""

from __future__ import annotations

import re

from piloop_common.errors import BadRequest

ROLES = ("viewer", "operator", "admin")  # a person's token's roles, lowest first (piloop_server.auth.Role)
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
ALLOWED = "a name is 1-63 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit"
RESERVED = "`serve` and names beginning `piloop` are reserved"


def problem(value: str, *, reserved_ok: bool = False) -> str:
    """Why `value` is not a name, or '' when it is one."""
    if not NAME.fullmatch(value):
        return ALLOWED
    if not reserved_ok and (value == "serve" or value.startswith("piloop")):
        return RESERVED
    return ""


def check_name(kind: str, value: str, *, reserved_ok: bool = False) -> str:
    """`value` when it is a valid name, else BadRequest naming the `kind` (`token`, `worker`), what was given
    and what is allowed. `reserved_ok`: the daemon's own callers (the unix socket) may use the reserved names."""
    why = problem(value, reserved_ok=reserved_ok)
    if why:
        shown = repr(value) if len(value) <= 70 else f"{value[:60]!r}… ({len(value)} characters)"
        raise BadRequest(f"{kind} name {shown} is refused: {why}")
    return value
