"""A job's log and a task's result bounded in bytes ([plugins.state] log_max_bytes, result_max_bytes): the defaults,
the marker a cut log ends with, and the words a task over its cap fails with. The worker and the server both apply
them (`piloop_worker/logs.py`, `piloop_worker/reporting.py`; `piloop_server/state/logcap.py`, `append_log.lua`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from piloop_common.sizes import format_bytes

LOG_MAX_BYTES = 1024**3
RESULT_MAX_BYTES = 64 * 1024**2
LOG_MARKER_ROOM = 256  # the bytes past log_max_bytes the server keeps for the worker's marker (`log_marker`)
RESULT_OUTPUTS = ("result.json", "result.pickle")  # a task's result, as it writes it among its outputs
# A task's arguments up to this many bytes travel inline, in its spec (`JobSpec.inline_inputs`, base64) and so in its
# claim's answer, never through the CAS; larger ones are put in the CAS and named as an input.
INLINE_MAX_BYTES = 64 * 1024


def inline(data: bytes) -> str | None:
    """`data` as a spec carries it inline (base64), or None when it is over INLINE_MAX_BYTES (the CAS takes it)."""
    import base64

    return base64.b64encode(data).decode() if len(data) <= INLINE_MAX_BYTES else None


def log_marker(cap: int) -> bytes:
    """The last chunk of a log the worker stopped shipping at `cap` bytes."""
    return f"\n[piloop: log truncated at {cap} bytes: [plugins.state] log_max_bytes]\n".encode()


def task_result(spec: dict[str, Any], outputs: Iterable[str]) -> str | None:
    """Which of `outputs` is a task's result, where the job is a Python task that wrote one."""
    if spec.get("runner") != "task":
        return None
    return next((name for name in RESULT_OUTPUTS if name in outputs), None)


def result_refusal(size: int, cap: int) -> str:
    """Why a task whose result is `size` bytes fails ([plugins.state] result_max_bytes `cap`), or '' within it."""
    if size <= cap:
        return ""
    return f"the task's result is {format_bytes(size)}, over [plugins.state] result_max_bytes = {format_bytes(cap)}"
