"""The daemon's pass, every `pass_seconds`: the generation, limits, lease expiry, and provisioned pools."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from piloop_common.errors import PiloopError
from piloop_server import campaigns
from piloop_server.runtime import Runtime
from piloop_server.state.generation import GenerationRecord, ensure_generation

log = logging.getLogger("piloop.daemon")

# Kubernetes' full-disruption mode: when most of a pool goes silent at once, the network is the
# likelier culprit than every machine; workers fence themselves anyway, so holding is safe.
DISRUPTION_MIN_WORKERS = 3
DISRUPTION_SHARE = 0.5
# The hold lasts this many toleration periods from when it began, so that jobs come back even when
# the machines really are gone (every in-between state has a deadline).
DISRUPTION_HOLD_TOLERATIONS = 2


class Pass:
    def __init__(self, rt: Runtime, record: GenerationRecord) -> None:
        self.rt = rt
        self.record = record
        self.held_since: dict[str, float] = {}
        self.bad_limits: set[str] = set()
        self.count = 0
        self.provisioner: Any = None  # piloop_server.provisioner.Provisioner, when serve gives one
        # called when a pass queued jobs or freed slots: serve wakes the claims waiting at its API (long polls), which
        # would otherwise find those jobs only when their wait ends (up to a renew period)
        self.wake: Callable[[], None] = lambda: None

    def check_generation(self) -> None:
        rt = self.rt
        raw = rt.redis.get(rt.keys.generation())
        if raw is not None and int(raw) >= self.record.read(rt.keys.namespace):
            return
        hold_ms = int(rt.executor.grace_seconds * 1000)
        gen = ensure_generation(rt.redis, rt.keys, self.record, hold_ms)
        if gen.lost_data:
            rt.events.escalate(
                "redis.lost_data",
                f"Redis lost its data (generation now {gen.generation}): no work is handed out for "
                f"{rt.executor.grace_seconds:g}s while workers re-announce; jobs it held are gone")

    def held_pools(self) -> tuple[str, ...]:
        rt = self.rt
        held = []
        now = time.monotonic()
        for pool, (total, silent) in rt.leases.pool_silence().items():
            disrupted = total >= DISRUPTION_MIN_WORKERS and silent / total > DISRUPTION_SHARE
            if not disrupted:
                self.held_since.pop(pool, None)
                continue
            since = self.held_since.setdefault(pool, now)
            if since == now:
                rt.events.escalate("pool.disrupted", f"{silent} of {total} workers of pool {pool} went silent at "
                                   "once: their leases are held, not requeued, while it lasts", pool=pool)
            if now - since < DISRUPTION_HOLD_TOLERATIONS * rt.executor.toleration_seconds:
                held.append(pool)
        return tuple(held)

    def run_once(self) -> None:
        rt = self.rt
        self.check_generation()
        bad = set(rt.refresh_limits())
        for key in bad - self.bad_limits:
            rt.events.add("limit.ignored", "service:daemon", key=key, reason="it no longer fits config.toml")
        self.bad_limits = bad
        res = rt.leases.expire(self.held_pools())
        moved = 0 if res.rearmed else res.count  # evaluations queued again, slots freed
        if res.rearmed:
            log.warning("event=daemon.rearmed leases=%d (the daemon was away longer than grace_seconds)", res.count)
        for job in res.lost:
            rt.events.escalate("job.lost", f"evaluation {job} was lost {rt.executor.max_lost} times in a row", job=job)
        moved += rt.leases.due()  # failed jobs whose backoff has passed go back to their queues
        if self.provisioner is not None:
            # decides from Redis only: its platform calls are background tasks (piloop_server.tasks), off the pass
            self.provisioner.run_once()
        # campaigns last: agents go into the slots this pass's expiries freed; git work is handed to rq
        moved += campaigns.tend(rt)
        if moved:
            self.wake()
        self.count += 1


def run(p: Pass, stop: threading.Event) -> None:
    failing = False
    while not stop.is_set():
        started = time.monotonic()
        try:
            p.run_once()
            if failing:
                log.warning("event=daemon.redis_back")
            failing = False
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, PiloopError) as e:
            if not failing:
                log.warning("event=daemon.pass_failed error=%s (retrying every pass)", e)
            failing = True
        except Exception:  # the pass must outlive any one bad pass
            log.exception("event=daemon.pass_crashed")
        stop.wait(max(0.0, p.rt.executor.pass_seconds - (time.monotonic() - started)))
