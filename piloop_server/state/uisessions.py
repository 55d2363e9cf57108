"""The web page's one-time login secrets and sessions in Redis, each a key with a TTL (policy: ui/sessions.py)."""

from __future__ import annotations

from dataclasses import dataclass

from piloop_server.state.connection import Client
from piloop_server.state.keys import Keys
from piloop_server.state.records.uisession import UiSession


@dataclass(frozen=True)
class UiSessionsState:
    r: Client
    k: Keys

    def put_once(self, secret_hash: str, rec: UiSession, ttl_ms: int) -> None:
        self.r.set(self.k.ui_once(secret_hash), rec.to_redis(), px=ttl_ms)

    def take_once(self, secret_hash: str) -> UiSession | None:
        """The link's record, removed in the same call: a second use finds nothing."""
        raw = self.r.getdel(self.k.ui_once(secret_hash))
        return None if raw is None else UiSession.from_redis(raw)

    def put(self, sid_hash: str, rec: UiSession, ttl_ms: int) -> None:
        self.r.set(self.k.ui_session(sid_hash), rec.to_redis(), px=ttl_ms)

    def touch(self, sid_hash: str, ttl_ms: int) -> UiSession | None:
        """The session's record with its idle TTL renewed (one GETEX), or None once it ended."""
        raw = self.r.getex(self.k.ui_session(sid_hash), px=ttl_ms)
        return None if raw is None else UiSession.from_redis(raw)

    def drop(self, sid_hash: str) -> None:
        self.r.delete(self.k.ui_session(sid_hash))
