"""Lua scripts shipped as package files, loaded once, called by SHA with one retry on NOSCRIPT.

Each script's header declares what a caller passes it on one line, `-- @call KEYS <k> ARGV <a>`: a count is a number
(exactly that many) or `<a>+<b>n` (a, then b more per item, for any number of items; `+n`: one more each). The
counts are what the caller gives `Scripts.run`, before the pass's fence and the event cap that `Scripts` appends; a
call that does not match is refused before Redis sees it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis

from piloop_common.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    LeaseLost,
    NotFound,
    PiloopError,
    Refused,
    TooLarge,
    Unavailable,
)
from piloop_server.state import retry
from piloop_server.state.records.job import lua_include as job_fields_include

# `PILOOP_<CODE> message` replies from the scripts, and the errors they stand for.
_ERRORS: dict[str, type[PiloopError]] = {
    "PILOOP_BAD_REQUEST": BadRequest,
    "PILOOP_CONFLICT": Conflict,
    "PILOOP_FORBIDDEN": Forbidden,
    "PILOOP_LEASE_LOST": LeaseLost,
    "PILOOP_REFUSED": Refused,
    "PILOOP_TOO_LARGE": TooLarge,
    "PILOOP_UNKNOWN_WORKER": NotFound,
}


class GenerationMissing(PiloopError):
    """Redis no longer holds the generation marker: it lost its data under us."""

    code = "generation_missing"
    status = 503


_ERRORS["PILOOP_NO_GENERATION"] = GenerationMissing


class Fenced(PiloopError):
    """A pass's write under a fencing token that no longer leads (include/fence.lua): nothing was written."""

    code = "fenced"
    status = 409


_ERRORS["PILOOP_FENCED"] = Fenced


@dataclass(frozen=True)
class Fence:
    """What a pass's scripts check (include/fence.lua): the leader lease's key and the token this server holds."""

    key: str
    token: str


_INCLUDE = re.compile(r"^-- @include ([a-z_]+)$", re.MULTILINE)
# includes made from Python, so a name is written once: the job hash's field names
_GENERATED = {"job_fields": job_fields_include}


@cache
def source(name: str) -> str:
    """A script's text with its includes resolved: each `-- @include <fragment>` line becomes
    `scripts/include/<fragment>.lua` (or a generated fragment), itself resolved the same way; a fragment is
    included once, where it is first asked for. An unknown fragment fails loudly."""
    scripts = resources.files("piloop_server.state").joinpath("scripts")
    done: set[str] = set()

    def resolve(text: str, where: str) -> str:
        def fragment(m: re.Match[str]) -> str:
            frag = m.group(1)
            if frag in done:
                return f"-- ({frag} is included above)"
            done.add(frag)
            if frag in _GENERATED:
                return _GENERATED[frag]()
            path = scripts.joinpath("include", f"{frag}.lua")
            if not path.is_file():
                raise FileNotFoundError(f"{where} includes {frag}, which is not in scripts/include/")
            return resolve(path.read_text(), f"include/{frag}.lua")

        return _INCLUDE.sub(fragment, text)

    return resolve(scripts.joinpath(f"{name}.lua").read_text(), f"{name}.lua")


_CALL = re.compile(r"^-- @call KEYS (\d+)(?:\+(\d*)n)? ARGV (\d+)(?:\+(\d*)n)?$", re.MULTILINE)


@dataclass(frozen=True)
class Count:
    """How many KEYS or ARGV a script takes: `base`, plus `step` more per item when `step` is not 0."""

    base: int
    step: int = 0

    def allows(self, n: int) -> bool:
        if not self.step:
            return n == self.base
        return n >= self.base and (n - self.base) % self.step == 0

    def __str__(self) -> str:
        return str(self.base) if not self.step else f"{self.base}+{'' if self.step == 1 else self.step}n"


@cache
def counts(name: str) -> tuple[Count, Count]:
    """The (KEYS, ARGV) counts the script's header declares on its `-- @call` line; a header without one fails."""
    text = resources.files("piloop_server.state").joinpath("scripts", f"{name}.lua").read_text()
    m = _CALL.search(_header(text))
    if m is None:
        raise ValueError(f"{name}.lua's header has no `-- @call KEYS <k> ARGV <a>` line")
    kb, ks, ab, as_ = m.groups()
    return Count(int(kb), _step(ks)), Count(int(ab), _step(as_))


def _step(text: str | None) -> int:
    return 0 if text is None else int(text or 1)


def _header(text: str) -> str:
    """The comment lines a script starts with."""
    lines = text.splitlines(keepends=True)
    end = next((i for i, line in enumerate(lines) if not line.startswith("--")), len(lines))
    return "".join(lines[:end])


def check_call(name: str, keys: list[str], args: list[Any]) -> None:
    """Refuse a call whose KEYS or ARGV count is not what the script's header declares (`-- @call`)."""
    nkeys, nargs = counts(name)
    if not nkeys.allows(len(keys)) or not nargs.allows(len(args)):
        raise ValueError(
            f"{name}.lua takes {nkeys} KEYS and {nargs} ARGV (its header's @call line); "
            f"this call gave {len(keys)} KEYS and {len(args)} ARGV"
        )


@cache
def fenced(name: str) -> bool:
    """Whether the script includes the pass's fence, and so takes the lease key and a token after its own."""
    return "-- @include fence" in resources.files("piloop_server.state").joinpath("scripts", f"{name}.lua").read_text()


def _fence_call(name: str, keys: list[str], args: list[Any], fence: Fence | None) -> tuple[list[str], list[Any]]:
    if not fenced(name):
        if fence is not None:
            raise ValueError(f"{name}.lua does not include the fence: a fencing token would not be checked")
        return keys, args
    if fence is None:
        return keys, [*args, ""]
    return [*keys, fence.key], [*args, fence.token]


@dataclass(frozen=True)
class EventCap:
    """The events stream's bound, appended by `Scripts` as the last ARGV of every call (include/events.lua reads
    it there): about `most` entries, each value cut past `value_bytes`; and the inbox's, `inbox_most` items (kept by
    `EventsState`, not sent to the scripts)."""

    most: int = 100_000
    value_bytes: int = 1024
    inbox_most: int = 10_000

    def arg(self) -> str:
        return f"{self.most} {self.value_bytes}"


class Scripts:
    """Runs the named scripts on one Redis client, caching their SHAs."""

    def __init__(self, client: redis.Redis, cap: EventCap | None = None) -> None:
        self.client = client
        self.cap = (cap or EventCap()).arg()
        self._sha: dict[str, str] = {}

    def _load(self, name: str) -> str:
        sha = self.client.script_load(source(name))
        self._sha[name] = sha
        return sha

    def _sender(self, name: str) -> redis.Redis:
        """The client that sends this script: one whose lost connection is not retried for a script that is not safe
        to run twice (state.retry)."""
        once = getattr(self.client, "once", None)
        return once if name in retry.ONCE and isinstance(once, redis.Redis) else self.client

    def run(self, name: str, keys: list[str], args: list[Any], fence: Fence | None = None) -> Any:
        check_call(name, keys, args)
        sha = self._sha.get(name) or self._load(name)
        keys, args = _fence_call(name, keys, args, fence)
        args = [*args, self.cap]
        sender = self._sender(name)
        try:
            try:
                return sender.evalsha(sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                # Redis restarted or SCRIPT FLUSH: load again, once.
                return sender.evalsha(self._load(name), len(keys), *keys, *args)
        except redis.exceptions.RedisError as e:
            err = _translated(e)
            if err is e:
                raise
            raise err from e

    def run_many(self, name: str, calls: list[tuple[list[str], list[Any]]], fence: Fence | None = None) -> list[Any]:
        """`run` for each (keys, args), in order, in one round trip: each reply, or the PiloopError a call raised
        (the others stand). Redis out of reach raises `Unavailable` for all of them."""
        for keys, args in calls:
            check_call(name, keys, args)
        sha = self._sha.get(name) or self._load(name)
        calls = [_fence_call(name, keys, args, fence) for keys, args in calls]
        out: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (0, 1):
            pipe = self._sender(name).pipeline(transaction=False)
            for i in todo:
                keys, args = calls[i]
                pipe.evalsha(sha, len(keys), *keys, *args, self.cap)
            try:
                replies = pipe.execute(raise_on_error=False)
            except redis.exceptions.RedisError as e:
                err = _translated(e)
                if err is e:
                    raise
                raise err from e
            again = []
            for i, reply in zip(todo, replies, strict=True):
                if isinstance(reply, redis.exceptions.NoScriptError) and attempt == 0:
                    again.append(i)  # Redis restarted or SCRIPT FLUSH: this call never ran; load again, once
                elif isinstance(reply, redis.exceptions.RedisError):
                    err = _translated(reply)
                    if not isinstance(err, PiloopError):
                        raise err
                    out[i] = err
                else:
                    out[i] = reply
            if not again:
                break
            todo, sha = again, self._load(name)
        return out


def _translated(e: redis.exceptions.RedisError) -> Exception:
    """A script's `PILOOP_<CODE> message` reply as its PiloopError, Redis out of reach as Unavailable; else `e`."""
    if isinstance(e, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return Unavailable(f"Redis cannot be reached: {e}")
    if isinstance(e, redis.exceptions.ResponseError):
        code, _, message = str(e).partition(" ")
        cls = _ERRORS.get(code)
        if cls is not None:
            return cls(message or code)
    return e
