"""A job as Redis keeps it: one hash per job, its field names written here once.

The Lua scripts read the same names through the generated `job_fields` include (`JF.<name>`), so a rename here
is a rename everywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from piloop_server.state.records.codec import text as _s

# A queue's score is `queued_ms - priority * PRIORITY_STEP`: a higher priority sorts ahead of every lower one queued
# within 2^42 ms (139 years) of it, FIFO within one, and the time is the score modulo the step (include/timing.lua).
PRIORITY_STEP = 2**42
HISTORY_KEEP = 8  # leases a job remembers (each ~100 bytes)
LEASE_STATES = ("leased", "running")


def _i(v: Any) -> int:
    s = _s(v)
    return int(s) if s.lstrip("-").isdigit() else 0


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    pool: str
    state: str
    campaign: str = ""
    image: str = ""
    spec: str = "{}"  # JSON: the JobSpec as submitted
    attempts: int = 0
    lost: int = 0  # lost in a row (expired or fenced), for max_lost
    raises: int = 0  # attempts that ran out of memory and were granted more (not counted)
    score: int = 0  # the queue score (ms): its place in line, kept across requeues
    created: int = 0
    updated: int = 0
    leased: int = 0
    started: int = 0
    ended: int = 0
    by: str = ""
    parent: str = ""
    worker: str = ""  # the lease's holder ('' while queued)
    token: str = ""  # the lease's fencing token ('' while queued)
    owner: str = ""  # the identity of the token its holder's name is bound to (include/lease_check.lua)
    history: str = ""  # the last leases, `worker/token` separated by spaces: a late call is stale, not foreign
    cancel: bool = False  # '1' once a cancel was asked for: cancel wins over every later outcome
    grant_mb: int = 0  # the grant of its next attempt (its spec's, or raised after an out-of-memory one)
    granted_mb: int = 0  # the grant its current lease holds
    retry_at: int = 0
    not_before: int = 0  # a countdown's end (ms): claimable from then (it waits in `delayed` until)
    expires: int = 0  # (ms) not leased by then: it ends `expired`; removed at its first lease
    result: str = ""  # JSON: what the last report said
    reason: str = ""
    log_dropped: int = 0  # log chunks past the cap, not kept
    log_bytes: int = 0  # the bytes of the chunks kept (their sizes as the CAS holds them)
    log_truncated: int = 0  # the byte cap the log was cut at (0: whole)
    campaign_error: str = ""
    relayed: int = 0  # an agent's: the evaluations it queued through its relay (relay_submit.lua caps them)

    @classmethod
    def from_hash(cls, h: dict[Any, Any]) -> Job | None:
        """The record of an HGETALL reply; None for an empty one (no such job)."""
        if not h:
            return None
        f = {_s(k): v for k, v in h.items()}
        out: dict[str, Any] = {}
        for fld in fields(cls):
            raw = f.get(FIELDS[fld.name])
            if fld.type == "int":
                out[fld.name] = _i(raw)
            elif fld.type == "bool":
                out[fld.name] = _s(raw) == "1"
            else:
                out[fld.name] = _s(raw)
        return cls(**out)

    def spec_dict(self) -> dict[str, Any]:
        try:
            got = json.loads(self.spec or "{}")
        except ValueError:
            return {}
        return got if isinstance(got, dict) else {}

    def result_dict(self) -> dict[str, Any]:
        try:
            got = json.loads(self.result) if self.result else {}
        except ValueError:
            return {}
        return got if isinstance(got, dict) else {}


# attribute -> the hash field it is stored under: every field of `Job`, each under its own name
FIELDS: dict[str, str] = {f.name: f.name for f in fields(Job)}
# a report's answer, kept in the job's hash for the report's copies: `answer:<lease token>` (report.lua)
ANSWER_FIELD = "answer:"


def queued_at(score: float) -> int:
    """When a queue score's job was first queued (ms): the score less its priority's steps."""
    return int(score) % PRIORITY_STEP


def lua_include() -> str:
    """The `job_fields` include: `JF.<attribute>` is the hash field's name; `PRIORITY_STEP` the queue score's;
    `JF_ANSWER` the prefix of a report's answer's field."""
    pairs = ", ".join(f"{attr} = '{name}'" for attr, name in FIELDS.items())
    return (
        f"-- job_fields (generated from state/records/job.py): the job hash's field names\nlocal JF = {{{pairs}}}\n"
        f"local PRIORITY_STEP = {PRIORITY_STEP}\n"
        f"local JF_ANSWER = '{ANSWER_FIELD}'\n"
    )
