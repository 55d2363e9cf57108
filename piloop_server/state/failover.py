"""A failover seen from the daemon: a new primary that may lack the last writes it acknowledged.

Redis replicates asynchronously: a replica promoted by Sentinel (or by a managed service behind one address) may
not have received the last writes. Each process watches its Redis's replication id and offset (`INFO
replication`): at each pass, and on each new connection (redis-py's connect hook, so a claim on the new primary is
held before the next pass). A new primary whose `master_replid2` is the id last seen was promoted from a replica of
the old one; its `second_repl_offset` says how much of the old stream it has, so the bytes known lost are the
offset last seen past it (writes after the last look may be lost too: it is treated as a loss either way). Over
Sentinel any change of id counts, since the daemon cannot tell a promotion it did not watch from a restart. The
daemon's record keeps the id last watched, so a daemon started after a failover still sees it.

On a failover (failover.lua, once per new primary): the generation moves up (tokens start with it, so none is
issued again, whatever sequence the new primary lost), claims are held for grace (`recovering`) while workers
re-announce their leases (a lease the new primary lacks is answered `lost` and its job stopped), and the daemon
escalates `redis.failover`. `WAIT 1` then makes the marker reach a replica before work goes out again.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.scripts import Scripts

WAIT_MS = 1000  # WAIT 1 after the marker: how long it may hold the pass (once per failover)


@dataclass(frozen=True)
class Replication:
    role: str
    replid: str
    replid2: str
    offset: int
    second_offset: int  # where the promoted primary's own history begins (-1: not promoted)

    @classmethod
    def of(cls, info: dict[str, Any]) -> Replication:
        return cls(
            role=str(info.get("role", "")),
            replid=str(info.get("master_replid", "")),
            replid2=str(info.get("master_replid2", "")),
            offset=int(info.get("master_repl_offset", 0)),
            second_offset=int(info.get("second_repl_offset", -1)),
        )


@dataclass(frozen=True)
class Failover:
    generation: int
    marked: bool  # False: another server marked this primary already
    promoted: bool  # the new primary was a replica of the one last seen
    lost_bytes: int  # of the replication stream last seen that the new primary lacks (-1: unknown)


def replication(client: redis.Redis) -> Replication | None:
    """`INFO replication`, or None where Redis refuses INFO."""
    try:
        return Replication.of(client.info("replication"))
    except redis.exceptions.ResponseError:
        return None


class Watch:
    """What one process last saw of its Redis's replication, and whether a connection since met another id."""

    def __init__(self, sentinel: bool) -> None:
        self.sentinel = sentinel
        self.seen: Replication | None = None
        self.suspect = False
        self.lock = threading.Lock()

    def connected(self, conn: Any) -> None:
        """redis-py's `redis_connect_func`: the usual handshake, then the new connection's replication id."""
        conn.on_connect()
        conn.send_command("INFO", "replication")
        try:
            raw = conn.read_response()
        except redis.exceptions.ResponseError:
            return  # INFO refused: the pass cannot watch either (it says so)
        rep = Replication.of(dict(_fields(_s(raw))))
        with self.lock:
            if self.seen is None:
                self.seen = rep  # a server that does not run the pass (a follower) watches from its first connection
            elif rep.replid and rep.replid != self.seen.replid:
                self.suspect = True

    def seed(self, replid: str) -> None:
        """The primary a daemon watched before it started (its record): a start on another one is a failover."""
        with self.lock:
            if replid and (self.seen is None or self.seen.replid != replid):
                self.seen = Replication(role="master", replid=replid, replid2="", offset=-1, second_offset=-1)

    def claims_may_go(self, client: redis.Redis, keys: Keys) -> bool:
        """Called while suspect: False until this primary is the one seen, or a server marked its failover."""
        rep = replication(client)
        with self.lock:
            seen = self.seen
            if rep is None or seen is None or not self._failed_over(seen, rep):
                self.seen, self.suspect = rep or seen, False
                return True
        if _s(client.hget(keys.daemon(), "failover_replid")) != rep.replid:
            return False  # the pass (on whichever server runs it) has yet to mark it
        with self.lock:
            self.seen, self.suspect = rep, False
        return True

    def check(self, client: redis.Redis, keys: Keys, record_generation: int, hold_ms: int) -> Failover | None:
        """The pass's look: None while the primary is the one seen; a Failover when a new one may lack writes."""
        rep = replication(client)
        if rep is None:
            return None
        with self.lock:
            seen = self.seen
            if seen is None or not self._failed_over(seen, rep):
                self.seen, self.suspect = rep, False
                return None
        promoted = _promoted(seen, rep)
        lost = max(0, seen.offset - (rep.second_offset - 1)) if promoted else -1
        # raises while Redis is out of reach: `seen` stays the old primary's, and the next pass tries again
        marked, gen = Scripts(client).run(
            "failover", [keys.generation(), keys.daemon()], [rep.replid, record_generation, hold_ms]
        )
        # the marker and the hold on a replica before claims go out again; a Redis without a replica answers 0 after
        # WAIT_MS, one that refuses WAIT (an ACL) or fails again is past helping here: the pass goes on either way
        with contextlib.suppress(redis.exceptions.RedisError):
            client.wait(1, WAIT_MS)
        with self.lock:
            self.seen, self.suspect = rep, False
        return Failover(generation=int(gen), marked=bool(marked), promoted=promoted, lost_bytes=lost)

    def _failed_over(self, seen: Replication, rep: Replication) -> bool:
        """Whether `rep` is a new primary that may lack writes made on the one `seen`: promoted from its replica, or
        over Sentinel any other id (a plain URL's restart of the same Redis is the generation marker's to tell)."""
        if rep.replid == seen.replid or rep.role != "master":
            return False
        return _promoted(seen, rep) or self.sentinel


def _promoted(seen: Replication, rep: Replication) -> bool:
    return rep.replid2 == seen.replid and rep.second_offset > 0


def _fields(info: str) -> list[tuple[str, str]]:
    """INFO's `key:value` lines."""
    out = []
    for line in info.splitlines():
        key, colon, value = line.partition(":")
        if colon and not key.startswith("#"):
            out.append((key, value.strip()))
    return out
