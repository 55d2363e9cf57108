"""The pool-disruption hold in Redis: which pools' leases wait instead of expiring, and for how long.

One script (`scripts/disruption.lua`) counts each pool's workers that could still come back, decides, and keeps
each hold in `keys.disruption()`, so that two passes at once begin a hold (and its one inbox item) once, and a
restarted daemon finds the hold where it was. The numbers are the caller's (`Policy`); docs/faults.md has them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.lease import KINDS
from piloop_server.state.scripts import EventCap, Fence, Scripts


@dataclass(frozen=True)
class Policy:
    """When a pool is held, for how long, and when a silent worker is forgotten (all in ms)."""

    fewest_workers: int  # a pool with fewer counted workers is never held
    share: float  # held when more than this share of its counted workers is silent
    hold_ms: int  # the longest a hold lasts from its start
    forget_ms: int  # a silent worker holding no lease whose last heartbeat is older than this leaves the workers set
    absent_ms: int  # a gap since the last pass longer than this is the daemon's own absence
    settle_ms: int  # after such a gap no hold begins and none ends `recovered` for this long
    gone_ms: int = (
        0  # a worker that cannot come back (revoked, departed, stopped) is forgotten this long after (0: forget_ms)
    )


@dataclass(frozen=True)
class Hold:
    """One pool's hold as Redis keeps it; `ended` is '' while it holds, `timeout` once its length has passed."""

    pool: str
    since_ms: int
    until_ms: int
    silent: int
    total: int
    escalation: str  # the inbox item's id
    ended: str


@dataclass(frozen=True)
class Decision:
    held: tuple[str, ...]  # the pools whose leases the pass must not expire now
    began: tuple[str, ...]
    ended: tuple[tuple[str, str], ...]  # (pool, reason): `recovered` or `timeout`
    forget: tuple[str, ...]  # workers silent past `forget_ms` with no lease


class DisruptionState:
    def __init__(self, client: redis.Redis, keys: Keys, cap: EventCap | None = None) -> None:
        self.r = client
        self.k = keys
        self.scripts = Scripts(client, cap)

    def decide(self, policy: Policy, fence: Fence | None = None) -> Decision:
        """One pass's decision: begins, keeps and ends holds in Redis, and says which pools are held now."""
        k = self.k
        held, began, ended, forget = self.scripts.run(
            "disruption",
            [k.workers(), k.disruption(), k.daemon(), k.tokens(), k.inbox(), k.events()],
            [
                k.prefix(),
                policy.fewest_workers,
                repr(policy.share),
                policy.hold_ms,
                policy.forget_ms,
                policy.absent_ms,
                policy.settle_ms,
                uuid.uuid4().hex,
                int(time.time() * 1000),  # a token's expiry is by the daemon's clock, which set it
                policy.gone_ms or policy.forget_ms,
            ],
            fence,
        )
        pairs = [_s(x) for x in ended]
        return Decision(
            tuple(_s(p) for p in held),
            tuple(_s(p) for p in began),
            tuple(zip(pairs[::2], pairs[1::2], strict=True)),
            tuple(_s(w) for w in forget),
        )

    def holds(self) -> dict[str, Hold]:
        """Every hold Redis keeps, by pool (those that timed out included, until their pool is back)."""
        out = {}
        for field, raw in self.r.hgetall(self.k.disruption()).items():
            name = _s(field)
            if name.startswith("hold:"):
                h = json.loads(raw)
                out[name[5:]] = Hold(
                    name[5:],
                    int(h["since_ms"]),
                    int(h["until_ms"]),
                    int(h["silent"]),
                    int(h["total"]),
                    str(h["escalation"]),
                    str(h["ended"]),
                )
        return out

    def forget(self, names: tuple[str, ...], by: str, fence: Fence | None = None) -> list[str]:
        """Forget these workers (forget_worker.lua: not one that holds a lease by then); the names forgotten."""
        k = self.k
        calls: list[tuple[list[str], list[Any]]] = [
            (
                [
                    k.worker(n),
                    k.worker_alive(n),
                    k.workers(),
                    *(k.worker_leases(n, kind) for kind in KINDS),
                    k.events(),
                ],
                [n, by],
            )
            for n in names
        ]
        replies = self.scripts.run_many("forget_worker", calls, fence) if calls else []
        return [n for n, r in zip(names, replies, strict=True) if r == 1]
