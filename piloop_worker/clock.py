"""The worker's one clock for deadlines, timers and ages: CLOCK_BOOTTIME.

CLOCK_MONOTONIC stops while the machine is suspended, so a lease that expired at the server during a suspend would
look unexpired to a shim that woke up; CLOCK_BOOTTIME counts the suspend. The worker writes each job's deadline on
it and the shim compares it with the same clock, so both must use `now()` and nothing else.
"""

from __future__ import annotations

import time

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)  # Linux has it; elsewhere the monotonic clock


def now() -> float:
    return time.clock_gettime(_BOOTTIME)
