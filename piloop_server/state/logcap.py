"""A report's log and a task's result held to [plugins.state] log_max_bytes and result_max_bytes.

A report names its whole log again, and the bytes of a chunk are known only to the CAS: the chunks the job's live
log already holds were sized when they were appended (`append_log.lua`), so only the report's tail past them is
looked up. The live log's bytes bound those of the report's first chunks, whichever attempt they are of: the cap is
the job's, like `log_chunks_max`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from piloop_common.bytecaps import LOG_MARKER_ROOM, result_refusal, task_result
from piloop_server.state.records.codec import text
from piloop_server.state.records.lease import Caps, Report

Sizes = Callable[[list[str]], dict[str, int]]  # addresses -> their sizes in the CAS (one it lacks is left out)
MATCH_TRIES = 8  # the places a report's log is tried against the live one's end (a worker's log matches at the first)


def live_prefix(log: list[str], live: list[str]) -> int:
    """How many of the report's first chunks are the live log's last ones: those were sized at their append."""
    if not live:
        return 0
    tries = 0
    for p in range(min(len(log), len(live)), 0, -1):
        if log[p - 1] != live[-1]:
            continue
        if log[:p] == live[len(live) - p :]:
            return p
        tries += 1
        if tries >= MATCH_TRIES:
            break
    return 0


@dataclass(frozen=True)
class Live:
    """What Redis holds of a job's log when it is reported: its last chunks, their bytes, whether it was cut (a chunk
    dropped: nothing after it is kept) and whether past the byte cap."""

    chunks: list[str]
    bytes: int = 0
    cut: bool = False
    truncated: bool = False

    @classmethod
    def of(cls, fields: list[Any], chunks: list[Any]) -> Live:
        """From the job hash's `log_bytes`, `log_dropped` and `log_truncated`, and the live log's last chunks."""
        n = [int(v) if v is not None and text(v).isdigit() else 0 for v in fields]
        return cls([text(c) for c in chunks], n[0], n[1] > 0, n[2] > 0)


@dataclass(frozen=True)
class LogCut:
    log: list[str]  # the chunks kept
    dropped: int  # chunks not kept, past either cap
    truncated: bool  # past the byte cap: cut there, or ended by the worker's marker


def tail(log: list[str], live: Live, most_chunks: int) -> list[str]:
    """The chunks of a report's log whose sizes the CAS must tell: past the live log, within the count cap."""
    if live.cut:
        return []
    p = live_prefix(log, live.chunks)
    return log[p : max(p, most_chunks)]


def spec_of(raw: Any) -> dict[str, Any]:
    """A job's spec from its hash (empty where it does not parse)."""
    try:
        got = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def cut_log(log: list[str], live: Live, sizes: dict[str, int], most_chunks: int, most_bytes: int) -> LogCut:
    """The report's log as the job keeps it: its first chunks within both caps (a chunk the CAS lacks counts 0: such
    a report ends the job `lost` anyway)."""
    p = live_prefix(log, live.chunks)
    kept, added, cut = list(log[: min(p, most_chunks)]), 0, False
    if not live.cut:
        for a in log[p:]:
            size = sizes.get(a, 0)
            if len(kept) >= most_chunks:
                break
            if live.bytes + added + size > most_bytes + LOG_MARKER_ROOM:
                cut = True
                break
            kept.append(a)
            added += size
    return LogCut(kept, len(log) - len(kept), cut or live.truncated or live.bytes + added > most_bytes)


def unsized(rep: Report, spec: Any, live: Live, caps: Caps) -> list[str]:
    """The blobs of a report whose sizes the CAS must tell: its log's tail, and a task's result."""
    ask = tail(rep.result.log, live, caps.log_chunks)
    outputs = rep.result.outputs
    if (name := task_result(spec_of(spec), outputs)) is not None:
        ask.append(outputs[name])
    return ask


def inline_size(data: str) -> int:
    """The bytes of an inline output (base64, checked at the door)."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def bounded(rep: Report, spec: dict[str, Any], live: Live, sizes: dict[str, int], caps: Caps) -> Report:
    """The report as the job keeps it: its log within both caps (saying how many chunks it dropped, and where it
    was truncated), and a task whose result (in the CAS or inline) is over its cap failed, the result not kept."""
    outcome, reason = rep.outcome, rep.reason
    update: dict[str, Any] = {}
    cut = cut_log(rep.result.log, live, sizes, caps.log_chunks, caps.log_bytes)
    if cut.dropped or cut.truncated:
        update["log"] = cut.log
    if cut.dropped:
        update["log_dropped"] = cut.dropped
    if cut.truncated:
        update["log_truncated"] = caps.log_bytes
    outputs = rep.result.outputs
    if (name := task_result(spec, outputs)) is not None:
        why = result_refusal(sizes.get(outputs[name], 0), caps.result_bytes)
        if why:
            update["outputs"] = {n: a for n, a in outputs.items() if n != name}
            if outcome == "succeeded":
                outcome, reason = "failed", why
    carried = rep.result.inline_outputs
    if (name := task_result(spec, carried)) is not None:
        why = result_refusal(inline_size(carried[name]), caps.result_bytes)
        if why:
            update["inline_outputs"] = {n: a for n, a in carried.items() if n != name}
            if outcome == "succeeded":
                outcome, reason = "failed", why
    result = rep.result.model_copy(update=update) if update else rep.result
    return replace(rep, result=result, outcome=outcome, reason=reason)
