"""Typed wrappers around the relay scripts: a job's own calls, each checked against its lease in the same script."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.scripts import Scripts

PROGRESS_KEEP = 200  # the newest notes of a job that the server keeps


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


@dataclass(frozen=True)
class Caller:
    """Who relays: the job, the token of its lease, and the worker that holds it."""

    job: str
    token: str
    worker: str

    @property
    def signed(self) -> str:
        return f"worker:{self.worker}/job:{self.job}"


@dataclass(frozen=True)
class LiveJob:
    kind: str
    campaign: str
    pool: str
    spec: dict[str, Any]


class RelayState:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.k = keys
        self.scripts = Scripts(client)

    def _args(self, c: Caller) -> list[str]:
        return [c.job, c.token, c.worker]

    def check(self, c: Caller) -> LiveJob:
        """The caller's job, while its lease is live under its token (else `LeaseLost`)."""
        reply = self.scripts.run("relay_check", [self.k.lease(c.job), self.k.job(c.job)], self._args(c))
        kind, campaign, pool, spec = (_s(x) for x in reply)
        return LiveJob(kind, campaign, pool, json.loads(spec))

    def progress(self, c: Caller, note: str) -> int:
        k = self.k
        return int(self.scripts.run(
            "relay_progress", [k.lease(c.job), k.job(c.job), k.job_progress(c.job)],
            [*self._args(c), json.dumps({"note": note, "by": c.signed}), PROGRESS_KEEP]))

    def submit(self, c: Caller, job_id: str, kind: str, pool: str, spec: dict[str, Any], *, campaign: str,
               image: str) -> int:
        k = self.k
        return int(self.scripts.run(
            "relay_submit",
            [k.lease(c.job), k.job(c.job), k.job(job_id), k.queue(pool, kind), k.jobs(), k.events()],
            [*self._args(c), job_id, kind, pool, campaign, image, json.dumps(spec), c.signed]))
