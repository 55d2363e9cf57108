"""The pass leader's lease: of the servers on one namespace, the one that holds it runs the pass.

The lease is a key with a TTL (leader.lua: SET NX PX to take it, PEXPIRE to renew it) holding a fencing token from
a counter that only goes up. The pass's scripts check that token (include/fence.lua), so a server that lost the
lease while it was stopped writes nothing when it wakes, whatever it still believes.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.scripts import EventCap, Fence, Scripts


@dataclass(frozen=True)
class LeaderHold:
    token: str  # "" when another server leads
    holder: str  # the instance that leads now ("" when nobody does)

    @property
    def leading(self) -> bool:
        return bool(self.token)


class LeaderLease:
    def __init__(self, client: redis.Redis, keys: Keys, instance: str, cap: EventCap | None = None) -> None:
        self.r = client
        self.k = keys
        self.instance = instance
        self.scripts = Scripts(client, cap)

    def hold(self, token: str, ttl_ms: int) -> LeaderHold:
        """Renew the lease under `token` when this instance holds it, else take it when it is free."""
        if ttl_ms <= 0:
            raise ValueError("the leader lease's TTL must be positive")
        return self._call(token, ttl_ms)

    def resign(self, token: str) -> None:
        """Give the lease up at once (a clean stop), so another server takes the pass without waiting its TTL."""
        self._call(token, 0)

    def fence(self, token: str) -> Fence:
        return Fence(self.k.leader(), token)

    def current(self) -> LeaderHold:
        """Who leads now, as Redis says."""
        raw = _s(self.r.get(self.k.leader()))
        token, _, holder = raw.partition(" ")
        return LeaderHold(token, holder)

    def _call(self, token: str, ttl_ms: int) -> LeaderHold:
        k = self.k
        got, holder = self.scripts.run(
            "leader", [k.leader(), k.leader_seq(), k.events()], [self.instance, token, ttl_ms]
        )
        return LeaderHold(_s(got), _s(holder))
