"""Nested work: a job queues, reads and cancels child jobs of its own through its worker's relay.

Each call is checked against the caller's lease in the script that acts (`relay_guard`), as the relay's other
calls are. A child is in the caller's pool and campaign, names the caller as its `parent`, and is in the caller's
`children` set, which the pass reads when the caller ends: a cancelled caller's children are cancelled
(`dependencies.lua`).
"""

from __future__ import annotations

import json
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.relay import RelayCaller
from piloop_server.state.scripts import EventCap, Scripts

CHILDREN_MOST = 1000  # the jobs one job may queue from inside itself (the campaign evaluations it queued count)
DEPTH_MOST = 8  # levels of nested work: a job, its child, its grandchild, …
LIMITS = (CHILDREN_MOST, DEPTH_MOST)


class NestedState:
    def __init__(self, client: redis.Redis, keys: Keys, cap: EventCap | None = None) -> None:
        self.r = client
        self.k = keys
        self.scripts = Scripts(client, cap)

    def submit(self, c: RelayCaller, job_id: str, kind: str, pool: str, spec: dict[str, Any]) -> str:
        """Queue `job_id` as `c`'s child; its state (queued, or waiting on its `after`). Forbidden when the caller
        may not (another pool, too deep, too many), LeaseLost when its lease does not allow it."""
        k = self.k
        return _s(
            self.scripts.run(
                "relay_child",
                [k.lease(c.job), k.job(c.job), k.events(), k.job(job_id), k.queue(pool, kind), k.jobs(), k.ended()],
                [
                    c.job,
                    c.token,
                    c.worker,
                    job_id,
                    kind,
                    pool,
                    json.dumps(spec),
                    c.signed,
                    k.prefix(),
                    *LIMITS,
                    c.owner,
                ],
            )
        )

    def cancel(self, c: RelayCaller, child: str, pool: str, kind: str) -> str:
        """Cancel `c`'s child `child` (of `pool` and `kind`); its state after."""
        k = self.k
        return _s(
            self.scripts.run(
                "relay_cancel",
                [k.lease(c.job), k.job(c.job), k.events(), k.job(child), k.queue(pool, kind), k.delayed(), k.ended()],
                [c.job, c.token, c.worker, child, c.signed, c.owner],
            )
        )

    def children(self, job_id: str) -> list[str]:
        """The jobs `job_id` queued from inside itself or that wait on it, while it has not ended."""
        return sorted(_s(x) for x in self.r.smembers(self.k.job_children(job_id)))
