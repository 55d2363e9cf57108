"""The page's logins: a one-time link of `piloop ui` or a posted token becomes a session; its cookie names it and
a CSRF value derived from it guards every write the page makes (csrf.py checks it).

The link works once, within ONCE_SECONDS; a session ends after SESSION_SECONDS without a request (each one renews
it) or at logout. Redis keeps only the sha256 of each secret, so a copy of Redis logs no one in."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from piloop_server.state.records.uisession import UiSession
from piloop_server.state.uisessions import UiSessionsState

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime

ONCE_SECONDS = 120
SESSION_SECONDS = 3600
SESSION_COOKIE = "piloop_session"
CSRF_COOKIE = "piloop_csrf"  # readable by the page's script, which sends it back in CSRF_HEADER
CSRF_HEADER = "x-piloop-csrf"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def store(rt: Runtime) -> UiSessionsState:
    return UiSessionsState(rt.redis, rt.keys)


def mint_once(rt: Runtime, kind: str, name: str) -> str:
    """A one-time login secret for this caller, good for ONCE_SECONDS."""
    secret = secrets.token_urlsafe(32)
    rec = UiSession(kind=kind, name=name, created_ms=int(time.time() * 1000))
    store(rt).put_once(_hash(secret), rec, ONCE_SECONDS * 1000)
    return secret


def redeem_once(rt: Runtime, secret: str) -> UiSession | None:
    """The caller the link was made for, once; None when it was used, ran out, or never existed."""
    if not secret or len(secret) > 200:
        return None
    return store(rt).take_once(_hash(secret))


def start(rt: Runtime, rec: UiSession) -> str:
    """A new session for this record: its id, which only the cookie holds."""
    sid = secrets.token_urlsafe(32)
    store(rt).put(_hash(sid), rec, SESSION_SECONDS * 1000)
    return sid


def lookup(rt: Runtime, sid: str) -> UiSession | None:
    """The session's record, its idle time renewed; None when it ended."""
    if not sid or len(sid) > 200:
        return None
    return store(rt).touch(_hash(sid), SESSION_SECONDS * 1000)


def end(rt: Runtime, sid: str) -> None:
    store(rt).drop(_hash(sid))


def csrf_for(sid: str) -> str:
    """The CSRF value of a session: derived from its id, so a page of another site can neither read nor make it."""
    return hmac.new(sid.encode(), b"piloop-ui-csrf", hashlib.sha256).hexdigest()


def cookie(headers: Mapping[str, str], name: str) -> str | None:
    """One cookie's value from the request's Cookie header, None when absent."""
    raw = headers.get("cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"')
    return None
