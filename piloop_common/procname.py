"""Name a process for `ps -o comm`, `top` and `perf` (Linux's 15-byte comm), so a piloop shim is not "python"."""

from __future__ import annotations

import contextlib
import ctypes

PR_SET_NAME = 15


def set_name(name: str) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
