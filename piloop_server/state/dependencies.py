"""Jobs that wait on other jobs (a spec's `after`): their submit, and the pass's step that settles them.

A child is `waiting` until every parent has succeeded, then queued; a parent that failed, was cancelled, lost or
expired ends it `cancelled` with the reason (`parent j… failed`), and so down the tree, a level a pass. Both sides
are one include (`scripts/include/dependencies.lua`): the submit settles a child whose parents have ended already,
and the pass (`dependencies.lua`) settles the children of each job that ended since its last look, read off the
`ended` index every terminal transition writes (`finish`), so report.lua, cancel.lua and expire.lua stay as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.scripts import EventCap, Fence, Scripts

SETTLE_BATCH = 1000  # ended jobs the pass looks at in one script
OVERLAP_MS = 2000  # it looks again this far back: a job may end in the ms of the last look


@dataclass(frozen=True)
class Settled:
    """What one pass's step did: children queued, and children ended (or told to stop) with their parents."""

    queued: int
    ended: int


class DependenciesState:
    def __init__(self, client: redis.Redis, keys: Keys, cap: EventCap | None = None) -> None:
        self.k = keys
        self.scripts = Scripts(client, cap)

    def submit(
        self, job_id: str, kind: str, pool: str, spec: dict[str, Any], *, by: str, campaign: str = "", image: str = ""
    ) -> str:
        """Write job `job_id` waiting on `spec["after"]` and settle it; its state now (waiting, queued, cancelled).
        BadRequest naming a parent that is no job, Conflict when the id exists (nothing written either way)."""
        k = self.k
        return _s(
            self.scripts.run(
                "depend_submit",
                [k.job(job_id), k.queue(pool, kind), k.jobs(), k.events(), k.ended()],
                [job_id, kind, pool, campaign, image, json.dumps(spec), by, k.prefix()],
            )
        )

    def settle(self, fence: Fence | None = None) -> Settled:
        """The pass's step: settle the children of the jobs that ended since the last look (any daemon's)."""
        k = self.k
        reply = self.scripts.run(
            "dependencies",
            [k.ended(), k.dependencies_cursor(), k.events(), k.delayed()],
            [k.prefix(), SETTLE_BATCH, OVERLAP_MS],
            fence,
        )
        return Settled(int(reply[0]), int(reply[1]))
