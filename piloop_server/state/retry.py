"""The one retry policy for Redis calls: which calls are tried again after a connection was lost, and how.

A connection error or a timeout leaves a call either not sent or sent with its answer lost, and only an idempotent
call may be sent again. Plain commands are reads or writes that set a value (SET, HSET, DEL, EXPIRE): tried again;
the two that are not (an event's XADD, the provisioned workers' name INCR) cost at most a doubled event or a skipped
number.
So are the scripts that are safe to run twice (`RETRIED`): `report` (answered by its report id), `heartbeat`
(renews), `register`, `cancel`, `drain` and the pass's scripts (they act on what they find). The scripts in `ONCE`
are not: a second `claim` would lease more jobs, a second `append_log` or `relay_progress` would append twice, and
`enqueue`, `launch`, `release` and the other submits would answer a conflict or a lost lease for what they did.
Every script is in one of the two (tests/unit/test_retry_policy.py), so a new one is classified when it is added. They go out once and
a lost connection answers 503 `unavailable`: the worker's own retry then asks again. A claim that ran is answered
all the same: `LeasesState.claim` finds the leases it granted by their tokens' random parts, drawn before the call.

With Sentinel the pool finds the new master on the next connect; the backoff spans the reconnect after a
promotion (Sentinel's own detection takes `down-after-milliseconds` first, during which calls answer 503).
"""

from __future__ import annotations

from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry

ONCE = frozenset(
    {
        "claim",
        "append_log",
        "relay_progress",
        "enqueue",
        "launch",
        "release",
        "depend_submit",
        "relay_child",
        "schedule_add",
    }
)
RETRIED = frozenset(
    {
        "report",
        "heartbeat",
        "register",
        "cancel",
        "drain",
        "relay_check",
        "relay_submit",
        "relay_cancel",
        "leader",
        "failover",
        "expire",
        "due",
        "unstarted",
        "dependencies",
        "schedule_tick",
        "disruption",
        "pool_silence",
        "prune",
        "forget_worker",
    }
)
RETRIES = 6  # 0.05 s doubling to 1 s: about 3 s in all
BASE_SECONDS = 0.05
CAP_SECONDS = 1.0


def idempotent() -> Retry:
    """The policy of a client's plain commands and of the scripts not in ONCE."""
    return Retry(ExponentialBackoff(cap=CAP_SECONDS, base=BASE_SECONDS), RETRIES, (ConnectionError, TimeoutError))


def once() -> Retry:
    """No retry: the policy of the scripts in ONCE."""
    return Retry(NoBackoff(), 0)
