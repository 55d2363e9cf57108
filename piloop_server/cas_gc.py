"""CAS garbage collection: remove the blobs nothing in Redis names, once they are older than the grace.

The order makes a put during a sweep safe (docs/cas.md, "Garbage collection"):

1. mark: every address the namespace's keys hold (`state/references.py`), and the entries of the workspace
   manifests among them;
2. list the store; a blob last written before `now - cas_grace_seconds` and not marked is a candidate;
3. mark again: a job submitted during the listing names its blobs by now;
4. delete the candidates that neither mark named, 1,000 a call; `local` also keeps a blob put again since step 2.

A blob put for a job not yet submitted is younger than the grace, so it is never a candidate. Only one sweep runs
at a time (a lock in Redis with a TTL, renewed after each batch); a second one says so and does nothing. A dry run
takes no lock and removes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from piloop_common.cas.base import Listed, Store
from piloop_common.errors import BlobMissing, Conflict
from piloop_server.state.keys import Keys
from piloop_server.state.references import ADDRESS, GcLock, Marked, ReferencesState

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime
    from piloop_server.state.connection import Client

log = logging.getLogger("piloop.cas_gc")
BY = "service:cas-gc"
BATCH = 1000  # blobs a delete call carries
LOCK_SECONDS = 300.0  # the lock's TTL, renewed after each batch of keys marked and blobs deleted
TASK_KEY = "cas-gc"
RETRY_SECONDS = 3600.0  # a GC queued but not ended (it failed) is queued again after this long at most


@dataclass
class Tally:
    blobs: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.blobs += 1
        self.bytes += size


@dataclass
class GcReport:
    """What one collection found and did; `removed` is what a dry run would remove."""

    dry_run: bool
    grace_seconds: float
    referenced: Tally = field(default_factory=Tally)  # stored blobs a mark named
    young: Tally = field(default_factory=Tally)  # unreferenced but put within the grace
    removed: Tally = field(default_factory=Tally)
    missing: int = 0  # addresses Redis names that the store does not hold (a manifest's entries included)
    keys: int = 0  # Redis keys the two marks read
    skipped: str | None = None  # why nothing was done (another sweep holds the lock)

    @property
    def kept(self) -> Tally:
        return Tally(self.referenced.blobs + self.young.blobs, self.referenced.bytes + self.young.bytes)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kept": asdict(self.kept)}


def collect(
    store: Store,
    client: Client,
    keys: Keys,
    *,
    grace_seconds: float,
    dry_run: bool = False,
    lock_seconds: float = LOCK_SECONDS,
) -> GcReport:
    """One collection over `store`, whose references are the namespace `keys` of Redis `client`."""
    report = GcReport(dry_run=dry_run, grace_seconds=grace_seconds)
    lock = GcLock(client, keys, lock_seconds)
    if not dry_run and not lock.acquire():
        report.skipped = "another CAS garbage collection holds the lock; it sweeps, this one did nothing"
        return report

    def renew() -> None:
        if not dry_run and not lock.renew():
            raise Conflict("the CAS garbage collection lost its lock (it ran longer than its TTL): it stopped")

    refs = ReferencesState(client, keys)
    try:
        before = time.time() - grace_seconds
        marked = _follow(store, refs.mark(renew), set())
        candidates: list[Listed] = []
        stored: set[str] = set()
        for blob in store.blobs():
            stored.add(blob.address)
            if blob.address in marked.addresses:
                report.referenced.add(blob.size)
            elif blob.modified >= before:
                report.young.add(blob.size)
            else:
                candidates.append(blob)
        again = _follow(store, refs.mark(renew), marked.manifests)
        marked.update(again)
        report.keys = marked.keys
        report.missing = len(marked.addresses - stored)
        doomed = []
        for blob in candidates:
            if blob.address in marked.addresses:
                report.referenced.add(blob.size)
            else:
                doomed.append(blob)
        if dry_run:
            for blob in doomed:
                report.removed.add(blob.size)
            return report
        for i in range(0, len(doomed), BATCH):
            renew()
            batch = doomed[i : i + BATCH]
            gone = set(store.delete_blobs([b.address for b in batch], before))
            for blob in batch:
                (report.removed if blob.address in gone else report.young).add(blob.size)
        refs.gc_ended()
        log.info(
            "event=cas.gc removed=%d removed_bytes=%d kept=%d kept_bytes=%d",
            report.removed.blobs,
            report.removed.bytes,
            report.kept.blobs,
            report.kept.bytes,
        )
        return report
    finally:
        if not dry_run:
            lock.release()


def _follow(store: Store, marked: Marked, followed: set[str]) -> Marked:
    """Add the entries of each workspace manifest marked (and not yet `followed`) to the marked addresses."""
    for manifest in sorted(marked.manifests - followed):
        try:
            data = store.get_bytes(manifest)
        except BlobMissing:
            continue  # a lost manifest protects nothing; its address is counted missing
        marked.addresses.update(m.decode() for m in ADDRESS.findall(data))
    return marked


# -- from the pass, through rq ---------------------------------------------------------------------


def run_task(rt: Runtime) -> None:
    """The background task the pass queues: one real collection with the daemon's settings."""
    grace = rt.settings.plugins.retention.cas_grace_seconds
    report = collect(rt.store, rt.redis, rt.keys, grace_seconds=grace)
    if report.skipped:
        log.info("event=cas.gc_skipped reason=%s", report.skipped)
        return
    rt.events.add(
        "cas.gc",
        BY,
        removed=report.removed.blobs,
        removed_bytes=report.removed.bytes,
        kept=report.kept.blobs,
        kept_bytes=report.kept.bytes,
    )


def due_ms(rt: Runtime, started_ms: int) -> tuple[int | None, int | None]:
    """(when the last collection ended, when the pass queues the next; epoch ms, None: none yet / never) as
    `GcSchedule` decides it, for `piloop status`: a period after the last one, or after the daemon started."""
    every = rt.settings.plugins.retention.cas_gc_seconds
    last = ReferencesState(rt.redis, rt.keys).last_gc_ms()
    return last, None if every <= 0 else int((started_ms if last is None else last) + every * 1000)


class GcSchedule:
    """The pass's part: queue `run_task` once every `cas_gc_seconds` since the last collection ended (any daemon's:
    the end time is in Redis), or since this daemon started when none has; it looks at most once a minute (or once a
    period, when shorter) and writes nothing to Redis itself."""

    CHECK_SECONDS = 60.0

    def __init__(self) -> None:
        self.started_ms = time.time() * 1000
        self.checked_at = -self.CHECK_SECONDS  # monotonic
        self.queued_at: float | None = None

    def tick(self, rt: Runtime) -> bool:
        """Queue a collection when one is due; whether this call queued one."""
        every = rt.settings.plugins.retention.cas_gc_seconds
        now = time.monotonic()
        if every <= 0 or now - self.checked_at < min(self.CHECK_SECONDS, every):
            return False
        self.checked_at = now
        if self.queued_at is not None and now - self.queued_at < min(every, RETRY_SECONDS):
            return False
        last = ReferencesState(rt.redis, rt.keys).last_gc_ms()
        if time.time() * 1000 - (self.started_ms if last is None else last) < every * 1000:
            return False
        from piloop_server import tasks

        self.queued_at = now
        return tasks.submit(rt, "piloop_server.cas_gc:run_task", key=TASK_KEY)
