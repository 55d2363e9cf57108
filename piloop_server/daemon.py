"""The daemon's pass, every `pass_seconds`: the generation, limits, the disruption hold, lease expiry, jobs waiting on
others and periodic schedules, provisioned pools, and retention (of Redis, the CAS and the daemon's logs). Of several
servers on one namespace only the pass leader runs it (piloop_server/leader.py), under its fencing token; the others
only follow the limits and keep their own logs."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from piloop_common.config.settings import ExecutorConfig
from piloop_common.errors import PiloopError
from piloop_server import campaigns, cas_gc, logfiles, schedules, tasks
from piloop_server.leader import Leadership
from piloop_server.runtime import Runtime
from piloop_server.state.disruption import Policy
from piloop_server.state.errors import UNREACHABLE
from piloop_server.state.generation import GenerationRecord
from piloop_server.state.retention import PRUNE_BATCH, Horizons
from piloop_server.state.scripts import Fence, Fenced

log = logging.getLogger("piloop.daemon")
BY = "service:daemon"

# Kubernetes' full-disruption mode: when most of a pool goes silent at once, the network is the
# likelier culprit than every machine; workers fence themselves anyway, so holding is safe.
DISRUPTION_MIN_WORKERS = 3
DISRUPTION_SHARE = 0.5
# The hold lasts this many toleration periods from when it began, so that jobs come back even when
# the machines really are gone (every in-between state has a deadline). A silent worker that holds
# no lease is forgotten after as long: by then no hold can be waiting for it.
DISRUPTION_HOLD_TOLERATIONS = 2
# Retention: at most this many prune batches (of PRUNE_BATCH) a pass, and the events' age trim every this often.
PRUNE_BATCHES = 4
EVENTS_TRIM_SECONDS = 60.0
MEMORY_ALARM_SHARE = 0.8  # of Redis's maxmemory, checked as often as the events' trim
# The leader lease's TTL, of grace_seconds: a follower takes a lapsed lease within a third of it more
# (leader.RENEWALS_PER_TTL), so the pass moves within grace and expire.lua never takes the gap for an absence.
LEADER_TTL_SHARE = 0.5


def leader_ttl_seconds(ex: ExecutorConfig) -> float:
    return ex.grace_seconds * LEADER_TTL_SHARE


class Deposed(Exception):
    """This server's lease lapsed by its own clock in the middle of a pass: the rest of the pass is not its to run."""


def disruption_policy(ex: ExecutorConfig) -> Policy:
    """The hold's numbers from the executor's timings (docs/faults.md, "The disruption hold")."""
    hold_ms = int(DISRUPTION_HOLD_TOLERATIONS * ex.toleration_seconds * 1000)
    grace_ms, pass_ms = int(ex.grace_seconds * 1000), int(ex.pass_seconds * 1000)
    # expire.lua re-arms every alive key after a gap over grace; half of it already counts as an absence here, so
    # that the two never disagree at the edge; the re-armed keys lapse within grace of that pass, two passes' margin
    return Policy(
        fewest_workers=DISRUPTION_MIN_WORKERS,
        share=DISRUPTION_SHARE,
        hold_ms=hold_ms,
        forget_ms=hold_ms,
        absent_ms=grace_ms // 2,
        settle_ms=grace_ms + 2 * pass_ms,
        gone_ms=grace_ms,  # revoked, departed or stopped: it cannot come back, so it leaves `worker list` soon
    )


class Pass:
    def __init__(self, rt: Runtime, record: GenerationRecord) -> None:
        self.rt = rt
        self.record = record
        self.bad_limits: set[str] = set()
        self.count = 0
        self.events_trimmed_at = 0.0  # monotonic: events are trimmed by age once a minute
        self.provisioner: Any = None  # piloop_server.provisioner.Provisioner, when serve gives one
        self.cas_gc = cas_gc.GcSchedule()
        self.logs = logfiles.RotationSchedule()
        # called when a pass queued jobs or freed slots: serve wakes the claims waiting at its API (long polls), which
        # would otherwise find those jobs only when their wait ends (up to a renew period)
        self.wake: Callable[[], None] = lambda: None
        # several servers on one namespace: the pass runs only under the lease (None: alone, unfenced, as in tests)
        self.leader: Leadership | None = None
        self.fence: Fence | None = None  # this pass's, given to each script it runs (include/fence.lua)

    def still_leading(self) -> None:
        """Between steps that write outside the fenced scripts: stop when the lease lapsed meanwhile."""
        if self.leader is not None and self.leader.fence() != self.fence:
            raise Deposed()

    def check_generation(self) -> None:
        rt = self.rt
        fo = rt.check_failover(self.record)
        if fo is not None and fo.marked:
            lost = (
                f"it lacks {fo.lost_bytes} bytes of the writes last seen"
                if fo.lost_bytes > 0
                else "it may lack the last writes"
            )
            log.warning("event=redis.failover generation=%d lost_bytes=%d", fo.generation, fo.lost_bytes)
            rt.events.escalate(
                "redis.failover",
                f"Redis failed over to a new primary ({lost}; generation now {fo.generation}): no work is handed "
                f"out for {rt.executor.grace_seconds:g}s while workers re-announce what they hold",
            )
        gen = rt.check_generation(self.record)
        if gen.lost_data:
            rt.events.escalate(
                "redis.lost_data",
                f"Redis lost its data (generation now {gen.generation}): no work is handed out for "
                f"{rt.executor.grace_seconds:g}s while workers re-announce; jobs it held are gone",
            )

    def held_pools(self) -> tuple[str, ...]:
        """The pools whose leases wait this pass; the hold begins, escalates and ends in Redis (state.disruption)."""
        rt = self.rt
        d = rt.disruption.decide(disruption_policy(rt.executor), self.fence)
        for pool in d.began:
            log.warning("event=pool.disrupted pool=%s (most of its workers went silent: its leases are held)", pool)
        for pool, reason in d.ended:
            log.warning("event=pool.disruption_ended pool=%s reason=%s", pool, reason)
        for name in rt.disruption.forget(d.forget, BY, self.fence):
            log.info("event=worker.forgotten worker=%s (silent and without a lease for the hold's length)", name)
        return d.held

    def run_once(self, fence: Fence | None = None) -> None:
        rt = self.rt
        self.fence = fence
        self.check_generation()
        bad = set(rt.refresh_limits())
        for key in bad - self.bad_limits:
            rt.events.add("limit.ignored", BY, key=key, reason="it no longer fits config.toml")
        self.bad_limits = bad
        res = rt.leases.expire(self.held_pools(), self.fence)
        moved = 0 if res.rearmed else res.count  # evaluations queued again, slots freed
        if res.rearmed:
            log.warning("event=daemon.rearmed leases=%d (the daemon was away longer than grace_seconds)", res.count)
        for job in res.lost:
            rt.events.escalate("job.lost", f"evaluation {job} was lost {rt.executor.max_lost} times in a row", job=job)
        moved += rt.leases.due(self.fence)  # failed jobs whose backoff has passed (new ones their countdown) go back
        rt.leases.expire_unstarted(self.fence)  # queued jobs whose expiry came first end `expired`
        moved += rt.dependencies.settle(self.fence).queued  # children of the jobs that ended since (dependencies.py)
        moved += rt.schedules.tick(schedules.next_after, self.fence)  # each due schedule's job, once a tick
        self.still_leading()
        if self.provisioner is not None:
            # decides from Redis only: its platform calls are background tasks (piloop_server.tasks), off the pass
            self.provisioner.run_once()
        # campaigns last: agents go into the slots this pass's expiries freed; git work is handed to rq
        self.still_leading()
        moved += campaigns.tend(rt)
        self.still_leading()
        self.retain()
        self.cas_gc.tick(rt)  # queues the CAS garbage collection (an rq task) once every cas_gc_seconds
        self.logs.tick(
            rt, tasks.queues(rt)
        )  # copy-truncates the daemon's logs over log_max_bytes, at the first pass and once a minute
        if moved:
            self.wake()
        self.count += 1

    def retain(self) -> None:
        """Remove what retention no longer keeps: ended jobs past their horizon, a few batches a pass (a backlog
        after a long stop drains over passes), and events past their age and acknowledged inbox items past theirs
        (the inbox cut to `inbox_max`) once a minute."""
        rt = self.rt
        ret = rt.settings.plugins.retention
        horizons = Horizons.of(ret)
        removed = kept = 0
        for _ in range(PRUNE_BATCHES):
            got = rt.retention.prune(horizons, fence=self.fence)
            removed, kept = removed + got.removed, kept + got.for_campaign
            if got.removed + got.for_campaign + got.moved < PRUNE_BATCH:
                break
        if removed:
            log.info("event=retention.pruned jobs=%d kept_for_campaigns=%d", removed, kept)
        now = time.monotonic()
        self.still_leading()
        if now - self.events_trimmed_at >= EVENTS_TRIM_SECONDS:
            self.events_trimmed_at = now
            if ret.events_seconds > 0:
                rt.retention.trim_events(int(ret.events_seconds * 1000))
            inbox = rt.events.prune_inbox(int(ret.events_seconds * 1000) if ret.events_seconds > 0 else None)
            if inbox.acked or inbox.over_cap:
                log.info("event=retention.inbox acked=%d over_cap=%d", inbox.acked, inbox.over_cap)
            self.watch_memory()

    def watch_memory(self) -> None:
        """One escalation when Redis's used memory passes MEMORY_ALARM_SHARE of its maxmemory (with noeviction a
        full Redis refuses every write), one more only after it fell back under it and rose again."""
        rt = self.rt
        mem = rt.retention.memory()
        over = mem.share is not None and mem.share >= MEMORY_ALARM_SHARE
        if rt.retention.memory_alarm(over) and over:
            rt.events.escalate(
                "redis.memory",
                f"Redis holds {mem.used / 2**20:.0f} MiB of its maxmemory {mem.maxmemory / 2**20:.0f} MiB "
                f"({mem.share:.0%}): shorten [plugins.retention] or raise maxmemory (docs/retention.md)",
            )

    def follow(self) -> None:
        """A follower's share: the limits its API applies, and its own logs' rotation."""
        self.rt.refresh_limits()
        self.logs.tick(self.rt, tasks.queues(self.rt))

    def refused(self, e: Fenced) -> None:
        """A script refused this pass's token: another server leads; say so once, in the log and the events."""
        log.warning("event=pass.fenced error=%s (another server took the pass: this one writes nothing)", e)
        instance = self.leader.instance if self.leader is not None else ""
        token = self.fence.token if self.fence is not None else ""
        with contextlib.suppress(*UNREACHABLE, PiloopError):  # the log line stands; the pass goes on following
            self.rt.events.add("pass.fenced", f"server:{instance}", server=instance, token=token)


def run(p: Pass, stop: threading.Event) -> None:
    failing = False
    while not stop.is_set():
        started = time.monotonic()
        try:
            fence = p.leader.fence_now() if p.leader is not None else None
            if p.leader is None or fence is not None:
                p.run_once(fence)
            else:
                p.follow()
            if failing:
                log.info("event=daemon.redis_back")  # the recovery; the fault was the pass_failed warning
            failing = False
        except Fenced as e:
            p.refused(e)
        except Deposed:
            log.warning("event=pass.stopped (the leader lease lapsed during the pass: the rest is left to the leader)")
        except (*UNREACHABLE, PiloopError) as e:
            if not failing:
                log.warning("event=daemon.pass_failed error=%s (retrying every pass)", e)
            failing = True
        except Exception:  # the pass must outlive any one bad pass
            log.exception("event=daemon.pass_crashed")
        stop.wait(max(0.0, p.rt.executor.pass_seconds - (time.monotonic() - started)))
