"""A task's options in Celery's words (`@task(retries=…)`, `.apply_async(countdown=…)`), checked before anything is
submitted and turned into the job spec's fields (`JobSpec`: max_attempts, backoff_seconds, retry_on, timeout_seconds,
memory_mb, priority, countdown_seconds, expires_seconds).

Times: `countdown` and `expires` as numbers are seconds from when the server queues the job, counted on Redis's clock;
`eta` and `expires` as datetimes are turned into seconds from now by this machine's clock, once, at submit. A
datetime must say its zone: a naive one is refused (Celery reads it in its app's zone, UTC by default; Python in the
local one), so nobody's job runs an hour off.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, fields, replace
from typing import Any

from piloop_common.exceptionnames import qualified

PRIORITY_MOST = 9  # 0..9, 9 first (JobSpec.priority)
RETRIES_MOST = 99  # JobSpec.max_attempts is at most 100
CELERY_BACKOFF_SECONDS = 1.0  # retry_backoff=True: Celery's first wait


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what}={value!r}: give a number of seconds or a datetime with a timezone")
    return float(value)


def _at(value: dt.datetime, what: str, now: float) -> float:
    """Seconds from `now` (a Unix time) to the aware datetime `value`."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{what}={value.isoformat()}: a datetime without a timezone is ambiguous; "
            "give an aware one, like datetime.now(timezone.utc) + timedelta(minutes=5)"
        )
    return value.timestamp() - now


@dataclass(frozen=True)
class TaskOptions:
    """What `@task` and `.apply_async` take beside the arguments; None: not given (the next layer's, else the
    spec's default). Checked as it is made: a bad value is a ValueError naming it."""

    pool: str | None = None
    retries: int | None = None  # retried this many times after the first attempt: max_attempts = retries + 1
    retry_backoff: float | bool | None = None  # the first retry's wait (s), doubling; True: 1 s; False: none
    retry_on: tuple[type[BaseException], ...] | None = None  # only these (and subclasses) are retried
    timeout: float | None = None
    memory_gb: float | None = None
    priority: int | None = None
    countdown: float | None = None
    eta: dt.datetime | None = None
    expires: float | dt.datetime | None = None

    def __post_init__(self) -> None:
        if self.pool is not None and (not isinstance(self.pool, str) or not self.pool):
            raise ValueError(f"pool={self.pool!r}: give a pool's name")
        if self.retries is not None and (
            isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= RETRIES_MOST
        ):
            raise ValueError(f"retries={self.retries!r}: give a whole number from 0 to {RETRIES_MOST}")
        backoff = self.retry_backoff
        if (
            backoff is not None
            and not isinstance(backoff, bool)
            and not 0 <= _seconds(backoff, "retry_backoff") <= 86400
        ):
            raise ValueError(f"retry_backoff={self.retry_backoff!r}: give 0 to 86400 seconds (or True)")
        if self.retry_on is not None:
            got: Any = self.retry_on
            if isinstance(got, type):
                got = (got,)
            if not isinstance(got, tuple | list | set | frozenset):
                raise ValueError(f"retry_on={got!r}: give a tuple of exception classes, like (OSError, TimeoutError)")
            object.__setattr__(self, "retry_on", tuple(got))
            for cls in self.retry_on or ():
                if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                    raise ValueError(f"retry_on: {cls!r} is not an exception class")
                if "<locals>" in cls.__qualname__:
                    raise ValueError(
                        f"retry_on: {cls.__qualname__} is defined inside a function: a worker names a module-level class"
                    )
        for name in ("timeout", "memory_gb"):
            value = getattr(self, name)
            if value is not None and _seconds(value, name) <= 0:
                raise ValueError(f"{name}={value!r}: give a number over 0")
        if self.priority is not None and (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not 0 <= self.priority <= PRIORITY_MOST
        ):
            raise ValueError(f"priority={self.priority!r}: give a whole number from 0 to {PRIORITY_MOST} (9 first)")
        if self.countdown is not None and self.eta is not None:
            raise ValueError("countdown and eta: give one (countdown is seconds from now, eta a datetime)")
        if self.countdown is not None and _seconds(self.countdown, "countdown") < 0:
            raise ValueError(f"countdown={self.countdown!r}: a countdown cannot be negative")
        if self.eta is not None and not isinstance(self.eta, dt.datetime):
            raise ValueError(f"eta={self.eta!r}: give a datetime with a timezone (countdown= takes seconds)")
        expires = self.expires
        if expires is not None and not isinstance(expires, dt.datetime) and _seconds(expires, "expires") <= 0:
            raise ValueError(f"expires={self.expires!r}: give seconds over 0, or a datetime in the future")

    def over(self, base: TaskOptions) -> TaskOptions:
        """These options over `base`'s: each one given here wins."""
        given = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if "countdown" in given or "eta" in given:  # one of them replaces the other
            given.setdefault("countdown", None)
            given.setdefault("eta", None)
        return replace(base, **given)

    def timing(self, now: float | None = None) -> dict[str, Any]:
        """The spec's priority, countdown, expiry and retry_on fields (only those given), with the datetimes turned
        into seconds from `now` (this machine's clock); an expiry in the past, or not after the countdown, is a
        ValueError."""
        now = dt.datetime.now(dt.UTC).timestamp() if now is None else now
        out: dict[str, Any] = {}
        if self.priority is not None:
            out["priority"] = self.priority
        countdown = self.countdown
        if self.eta is not None:
            countdown = max(0.0, _at(self.eta, "eta", now))  # a past eta runs at once, as Celery does
        if countdown:
            out["countdown_seconds"] = float(countdown)
        if self.expires is not None:
            expires = _at(self.expires, "expires", now) if isinstance(self.expires, dt.datetime) else self.expires
            if expires <= 0:
                raise ValueError(f"expires={self.expires}: that is in the past; the job could never start")
            if expires <= (countdown or 0):
                raise ValueError(
                    f"expires={self.expires}: not after its countdown or eta ({countdown or 0:g} s from now): "
                    "it would expire before it may start"
                )
            out["expires_seconds"] = float(expires)
        if self.retry_on:
            out["retry_on"] = [qualified(c) for c in self.retry_on]
        return out

    def max_attempts(self) -> int | None:
        return None if self.retries is None else self.retries + 1

    def backoff_seconds(self) -> float | None:
        if self.retry_backoff is None:
            return None
        if isinstance(self.retry_backoff, bool):
            return CELERY_BACKOFF_SECONDS if self.retry_backoff else 0.0
        return float(self.retry_backoff)

    def memory_mb(self) -> int | None:
        return None if self.memory_gb is None else math.ceil(self.memory_gb * 1024)
