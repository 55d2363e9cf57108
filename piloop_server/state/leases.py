"""Typed wrappers around the lease scripts: the only code that changes jobs, leases and workers."""

from __future__ import annotations

import json
import secrets
from typing import Any

import redis

from piloop_common.bytecaps import LOG_MARKER_ROOM
from piloop_common.errors import NotFound, PiloopError, Refused, Unavailable, from_payload
from piloop_common.protocol.operator import JobResult
from piloop_server.state import reportbatch
from piloop_server.state.errors import UNREACHABLE
from piloop_server.state.failover import Watch
from piloop_server.state.keys import Keys
from piloop_server.state.logcap import Sizes
from piloop_server.state.producers import Producers
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.job import FIELDS as JF
from piloop_server.state.records.job import HISTORY_KEEP
from piloop_server.state.records.lease import KINDS, Beat, Caps, Claim, Expiry, Lease, Report, Timings
from piloop_server.state.scripts import Fence, Scripts

CLAIM_SCAN_DEPTH = 200
EXPIRE_BATCH = 500
TOKEN_RANDOM_BYTES = 16  # 128 bits a token beside its fencing order


def _heartbeat_answers(beats: list[Beat], reply: list[Any]) -> list[tuple[int, dict[str, str]] | NotFound | Refused]:
    now = int(reply[0])
    out: list[tuple[int, dict[str, str]] | NotFound | Refused] = []
    for b, answer in zip(beats, reply[1:], strict=True):
        if int(answer[0]) == 1:
            out.append((now, {lease.job: _s(st) for lease, st in zip(b.held, answer[1:], strict=True)}))
        elif int(answer[0]) == 2:
            out.append(Refused(f"worker name {b.worker} is held by another token while its record lives"))
        else:
            out.append(NotFound(f"worker {b.worker} is not registered: register again"))
    return out


def _answered(answer: tuple[int, dict[str, str]] | NotFound | Refused) -> tuple[int, dict[str, str]]:
    if isinstance(answer, (NotFound, Refused)):
        raise answer
    return answer


class LeasesState(Producers):
    """The lease engine's calls: producers' (state/producers.py), workers', the pass's, logs and cancels."""

    def __init__(self, client: redis.Redis, keys: Keys, timings: Timings, caps: Caps | None = None) -> None:
        self.r = client
        self.k = keys
        self.t = timings
        self.caps = caps or Caps()
        self.scripts = Scripts(client, self.caps.events)

    # -- workers -----------------------------------------------------------------------

    def register(
        self,
        name: str,
        pool: str,
        image: str,
        cas_id: str,
        sample: dict[str, Any],
        *,
        protocol: int,
        by: str,
        info: dict[str, Any] | None = None,
        owner: str = "",
        names_of: str = "",
        names_most: int = 0,
    ) -> None:
        """Register (or re-register) worker `name` for `owner`, the identity of the token that calls: Refused when
        another token holds the name while its record lives; with `names_most`, TooLarge when token `names_of`
        already holds that many names (register.lua)."""
        k = self.k
        self.scripts.run(
            "register",
            [k.worker(name), k.worker_alive(name), k.workers(), k.events(), k.token_workers(names_of)],
            [
                name,
                pool,
                image,
                cas_id,
                json.dumps(sample),
                self.t.grace_ms,
                protocol,
                by,
                json.dumps(info or {}),
                owner,
                names_most if names_of else 0,
                k.worker_hash_prefix(),
            ],
        )

    def heartbeat(
        self, name: str, sample: dict[str, Any], held: list[Lease], owner: str = ""
    ) -> tuple[int, dict[str, str]]:
        """Renew the worker and each lease it names; the status of each job: ok, cancel or lost. NotFound when the
        worker is not registered, Refused when its name is bound to another token than `owner`'s."""
        return _answered(self.heartbeats([Beat(name, sample, held, owner)])[0])

    def heartbeats(self, beats: list[Beat]) -> list[tuple[int, dict[str, str]] | NotFound | Refused]:
        """`heartbeat` for many workers in one script: each one's answer, or NotFound for one not registered (Refused
        for one whose name another token holds)."""
        return _heartbeat_answers(beats, self.scripts.run("heartbeat", *self._heartbeat_call(beats)))

    def _heartbeat_call(self, beats: list[Beat]) -> tuple[list[str], list[Any]]:
        k = self.k
        keys = [k.deadlines(), k.daemon(), k.events()]
        args: list[Any] = [self.t.grace_ms, self.t.toleration_ms, len(beats)]
        for b in beats:
            keys += [k.worker(b.worker), k.worker_alive(b.worker)]
            for lease in b.held:
                keys += [k.lease(lease.job), k.job(lease.job)]
            args += [
                json.dumps(b.sample),
                len(b.held),
                *(lease.token for lease in b.held),
                *(lease.job for lease in b.held),
                b.owner,
            ]
        return keys, args

    def claim(
        self,
        name: str,
        pool: str,
        kind: str,
        *,
        slots: int,
        image: str,
        most: int = 1,
        room_mb: int | None = None,
        default_mb: int | None = None,
    ) -> Claim:
        """Lease up to `most` jobs of `kind` from `pool` to worker `name`, in one script. With `room_mb`, only
        jobs whose grant (theirs, else `default_mb`) fits beside the worker's grants are taken."""
        k = self.k
        watch = getattr(self.r, "repl_watch", None)
        if isinstance(watch, Watch) and watch.suspect and not watch.claims_may_go(self.r, k):
            return Claim(reason="recovering")  # a new primary, not yet checked for lost writes (state.failover)
        other = KINDS[1 - KINDS.index(kind)]
        # never more tokens than the worker's slots, whatever `most` says (claim.lua takes at most its free slots)
        randoms = [secrets.token_hex(TOKEN_RANDOM_BYTES) for _ in range(max(0, min(most, slots)))]
        try:
            reply = self.scripts.run(
                "claim",
                [
                    k.worker(name),
                    k.worker_alive(name),
                    k.worker_leases(name, kind),
                    k.queue(pool, kind),
                    k.deadlines(),
                    k.active(pool, kind),
                    k.token_seq(),
                    k.generation(),
                    k.events(),
                    k.campaign_live(),
                    k.daemon(),
                    k.worker_leases(name, other),
                    k.ended(),
                    k.expiring(),
                ],
                [
                    k.prefix(),
                    name,
                    kind,
                    slots,
                    image,
                    self.t.toleration_ms,
                    len(randoms),
                    CLAIM_SCAN_DEPTH,
                    -1 if room_mb is None else room_mb,
                    default_mb or 0,
                    HISTORY_KEEP,
                    *randoms,
                ],
            )
        except Unavailable:
            # the claim went out once (state.retry) and its answer was lost: it ran in full or not at all
            found = self._refind(name, kind, randoms)
            if not found:
                raise
            return Claim(leases=found)
        reply = [_s(x) for x in reply]
        if reply[0] == "none":
            return Claim(reason=reply[1])
        rest = reply[1:]
        return Claim(leases=[Lease(rest[i], rest[i + 1]) for i in range(0, len(rest), 2)])

    def _refind(self, name: str, kind: str, randoms: list[str]) -> list[Lease]:
        """The leases a claim whose answer was lost granted: the worker's, whose token ends with a random part
        that call drew (read with the retrying client; none while Redis is still out of reach)."""
        ends = {"." + r for r in randoms}
        try:
            ids = sorted(_s(i) for i in self.r.smembers(self.k.worker_leases(name, kind)))
            tokens = [_s(self.r.hget(self.k.job(i), JF["token"])) for i in ids]
        except UNREACHABLE:
            return []
        return [Lease(i, t) for i, t in zip(ids, tokens, strict=True) if t[t.rfind(".") :] in ends]

    def _job_keys(self, job_id: str) -> tuple[str, str]:
        f = self.r.hmget(self.k.job(job_id), JF["kind"], JF["pool"])
        if f[0] is None:
            raise NotFound(f"job {job_id} does not exist")
        return _s(f[0]), _s(f[1])

    def release(self, job_id: str, token: str, worker: str, reason: str = "", owner: str = "") -> None:
        k = self.k
        kind, pool = self._job_keys(job_id)
        self.scripts.run(
            "release",
            [
                k.lease(job_id),
                k.job(job_id),
                k.worker_leases(worker, kind),
                k.queue(pool, kind),
                k.deadlines(),
                k.active(pool, kind),
                k.campaign_live(),
                k.events(),
                k.ended(),
            ],
            [job_id, token, worker, reason, owner],
        )

    def report(
        self,
        report_id: str,
        job_id: str,
        token: str,
        worker: str,
        outcome: str,
        result: JobResult,
        reason: str = "",
        *,
        oom: bool = False,
        memory_caps: dict[str, int | None] | None = None,
        sizes: Sizes | None = None,
        owner: str = "",
    ) -> dict[str, Any]:
        """Finish a lease; a failed attempt may be retried (report.lua). `memory_caps`: pool -> its cap on a
        grant raised after an out-of-memory attempt; `sizes`: the CAS's sizes of blobs (none: each counts 0)."""
        rep = Report(report_id, job_id, token, worker, outcome, result, reason, oom, owner=owner)
        got = self.report_many([rep], memory_caps, sizes)[0]
        if isinstance(got, PiloopError):
            raise got
        return got

    def report_many(
        self, reports: list[Report], memory_caps: dict[str, int | None] | None = None, sizes: Sizes | None = None
    ) -> list[dict[str, Any] | PiloopError]:
        """`report` for each, in order, in two round trips (the jobs' kind and pool, then one script for all) and one CAS
        lookup (`sizes`: of the logs' chunks not sized at their append, and of the tasks' results): each answer, or
        the PiloopError that report met (a cap, a malformed result), the others standing; a job that no
        longer exists answers stale."""
        k = self.k
        pipe = self.r.pipeline(transaction=False)
        for rep in reports:
            pipe.hmget(
                k.job(rep.job),
                JF["kind"],
                JF["pool"],
                JF["spec"],
                JF["log_bytes"],
                JF["log_dropped"],
                JF["log_truncated"],
            )
            pipe.lrange(k.job_log(rep.job), -max(len(rep.result.log), 1), -1)
        b = reportbatch.batch(k, self.t, self.caps, reports, pipe.execute(), sizes, memory_caps)
        out: list[Any] = b.out
        # one script for the batch (report.lua runs each report as if alone, in order): one EVALSHA, not one a report
        for i, reply in zip(b.at, self.scripts.run("report", b.keys, b.args) if b.at else [], strict=True):
            got = json.loads(_s(reply))
            out[i] = from_payload(got, 400) if "error" in got else got  # refused by report.lua, nothing changed
        return out

    def due(self, fence: Fence | None = None) -> int:
        """Put failed jobs whose backoff has passed, and new ones whose countdown has, in their queues (the pass);
        how many."""
        k = self.k
        return int(self.scripts.run("due", [k.delayed(), k.events()], [k.prefix(), EXPIRE_BATCH], fence))

    def expire_unstarted(self, fence: Fence | None = None) -> int:
        """End `expired` the queued jobs whose expiry came before any lease (the pass); how many."""
        k = self.k
        keys = [k.expiring(), k.delayed(), k.events(), k.ended()]
        return int(self.scripts.run("unstarted", keys, [k.prefix(), EXPIRE_BATCH], fence))

    # -- the pass ----------------------------------------------------------------------

    def pool_silence(self) -> dict[str, tuple[int, int]]:
        """Each pool's registered workers, and how many of them are silent (their `alive` key gone)."""
        reply = self.scripts.run("pool_silence", [self.k.workers()], [self.k.prefix()])
        return {_s(reply[i]): (int(reply[i + 1]), int(reply[i + 2])) for i in range(0, len(reply), 3)}

    def expire(self, held_pools: tuple[str, ...] = (), fence: Fence | None = None) -> Expiry:
        k = self.k
        reply = self.scripts.run(
            "expire",
            [k.deadlines(), k.daemon(), k.events(), k.campaign_live(), k.workers(), k.ended()],
            [k.prefix(), self.t.grace_ms, self.t.toleration_ms, self.t.max_lost, EXPIRE_BATCH, " ".join(held_pools)],
            fence,
        )
        if _s(reply[0]) == "rearmed":
            return Expiry(True, int(reply[1]), [])
        return Expiry(False, int(reply[1]), [_s(x) for x in reply[2:]])

    # -- logs and cancels --------------------------------------------------------------

    def append_log(
        self, job_id: str, token: str, worker: str, chunks: list[str], sizes: Sizes | None = None, owner: str = ""
    ) -> int:
        """Add chunks to the holder's job's log; how many were dropped past a cap. LeaseLost when `worker` does not
        hold the job's lease under `token`; BadRequest when `sizes` (the CAS's) lacks a chunk (none: each counts 0)."""
        k = self.k
        known = sizes(chunks) if sizes is not None else dict.fromkeys(chunks, 0)
        return int(
            self.scripts.run(
                "append_log",
                [k.lease(job_id), k.job(job_id), k.job_log(job_id), k.events()],
                [
                    job_id,
                    token,
                    worker,
                    self.caps.log_chunks,
                    self.caps.log_bytes,
                    LOG_MARKER_ROOM,
                    len(chunks),
                    *chunks,
                    *(known.get(c, -1) for c in chunks),
                    owner,
                ],
            )
        )

    def cancel(self, job_id: str, by: str, only_queued: bool = False) -> str:
        """Cancel a job; with `only_queued`, withdraw it only while it waits for a lease."""
        kind, pool = self._job_keys(job_id)
        k = self.k
        return _s(
            self.scripts.run(
                "cancel",
                [k.job(job_id), k.queue(pool, kind), k.events(), k.delayed(), k.ended()],
                [job_id, by, "queued" if only_queued else ""],
            )
        )
