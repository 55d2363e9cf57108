"""The pool logic of the pass: start workers for waiting jobs, drain idle ones, stop the lost and the unknown.

The pass decides from Redis alone and never waits on a platform: each platform call (start, stop, list) is a
background task (`piloop_server.tasks`) on the pool's own queue, which writes what it learnt back to Redis for the
next pass. A started worker's record (`keys.provisioned(name)`) walks `starting → running → draining → stopping →
stopped`, and every state but `running` has a deadline:

- `starting`: registered within `register_seconds`, else stopped and the pool backs off;
- `draining`: ends when its last lease ends (the lease engine bounds that: job timeouts, toleration);
- `stopping`: stopped within STOP_DEADLINE_SECONDS, else escalated and forgotten (the listing stops it later);
- `stopped`: forgotten once the lease engine has ended its leases.

What it reads and writes in Redis goes through `piloop_server.state.provisioned` (its records:
`state/records/provisioned.py`). On the proxy network a started worker gets no piloop token: it presents the
shared credential (the secret PILOOP_WORKER_CREDENTIAL) that the proxy accepts, as the spec says.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from piloop_common.config_provisioner import ProvisionerConfig
from piloop_server.provisioner import platform
from piloop_server.provisioner.platform import BY, fail, pools
from piloop_server.runtime import Runtime
from piloop_server.state.provisioned import KINDS
from piloop_server.state.records.provisioned import Provisioned

log = logging.getLogger("piloop.provisioner")

LIST_SECONDS = 2.0  # how often the platform is listed: lost workers, and tagged ones we have no record of
STOP_RETRY_SECONDS = 5.0
STOP_DEADLINE_SECONDS = 120.0
LIVE = ("starting", "running", "draining", "stopping")  # states that count against `max`


def records(rt: Runtime) -> dict[str, Provisioned]:
    """Every started worker's record, by name."""
    return rt.provisioned.records()


def summary(rt: Runtime) -> list[dict[str, Any]]:
    """Each provisioned pool for `piloop status`: its max, its workers by state, its backoff."""
    st = rt.provisioned
    recs = st.records()
    now = st.now_ms()
    out = []
    for pool, p in sorted(rt.executor.pools.items()):
        if p.provisioner is None:
            continue
        states = [r.state for r in recs.values() if r.pool == pool]
        b = st.backoff(pool)
        out.append(
            {
                "pool": pool,
                "provider": p.provisioner.compute.provider,
                "max": p.provisioner.max,
                **{s: states.count(s) for s in LIVE},
                "backoff_seconds": b.delay,
                "backoff_left_seconds": max(0.0, (b.until - now) / 1000),
                "refusals": b.refusals,
                "last_failure": b.why,
                "halted": b.halted,
            }
        )
    return out


class Provisioner:
    def __init__(self, rt: Runtime, *, url: str | None, home: Path) -> None:
        self.rt = rt
        self.url = url
        self.home = home
        self.st = rt.provisioned
        self.last_list: dict[str, float] = {}
        self.warned_url = False
        for pool in self._pools():  # a restarted server tries the platform's credentials again
            self.st.unhalt(pool)

    # -- what the pass reads --------------------------------------------------------------------
    def _pools(self) -> dict[str, ProvisionerConfig]:
        return pools(self.rt)

    def records(self) -> dict[str, Provisioned]:
        return self.st.records()

    # -- the pass --------------------------------------------------------------------------------
    def run_once(self) -> None:
        pools = self._pools()
        recs = self.records()
        if not pools and not recs:
            return  # the common case: one SMEMBERS per pass
        now = self.st.now_ms()
        seen = self.st.workers(list(recs))
        for name, rec in recs.items():
            w = seen[name]
            self._tend(rec, pools.get(rec.pool), now, w.registered, w.alive, w.leases)
        live_per_pool: dict[str, int] = {}
        for rec in self.records().values():
            if rec.state in LIVE:
                live_per_pool[rec.pool] = live_per_pool.get(rec.pool, 0) + 1
        for pool, cfg in pools.items():
            self._maybe_start(pool, cfg, now, live_per_pool.get(pool, 0), recs)
            if time.monotonic() - self.last_list.get(pool, 0.0) >= LIST_SECONDS:
                self.last_list[pool] = time.monotonic()
                self._submit("list_pool", pool, pool)

    def _to(self, rec: Provisioned, state: str, now: int, why: str) -> Provisioned:
        self.st.update(rec.name, state=state, since=now, why=why)
        self.rt.events.add(f"provisioner.{state}", BY, worker=rec.name, pool=rec.pool, reason=why)
        log.info("event=provisioner.%s worker=%s pool=%s reason=%r", state, rec.name, rec.pool, why)
        return replace(rec, state=state, since=now, why=why)

    def _tend(
        self, rec: Provisioned, cfg: ProvisionerConfig | None, now: int, registered: bool, alive: bool, leases: int
    ) -> None:
        name, pool, state = rec.name, rec.pool, rec.state
        since = rec.since or now
        # a pool that lost its provisioner in config.toml is drained like max = 0
        most = cfg.max if cfg is not None else 0
        if state == "starting":
            if registered and alive:
                self.st.update(name, idle_since=now)
                rec = self._to(rec, "running", now, "registered")
                self.st.reset_backoff(pool)  # a worker came up: the backoff resets
            elif rec.lost:
                rec = self._to(rec, "stopping", now, "its process ended before it registered")
                fail(self.rt, pool, "a started worker ended before it registered", refused=False)
            elif cfg is not None and now - since > cfg.register_seconds * 1000:
                rec = self._to(rec, "stopping", now, f"not registered within {cfg.register_seconds:g}s")
                fail(
                    self.rt, pool, f"a started worker did not register within {cfg.register_seconds:g}s", refused=False
                )
            elif cfg is None or most == 0:
                rec = self._to(rec, "stopping", now, "the pool is drained (max = 0)")
        elif state in ("running", "draining"):
            if rec.lost:
                rec = self._to(rec, "stopping", now, "the platform lost it")
            elif not alive:
                rec = self._to(rec, "stopping", now, "it went silent")
            elif state == "running":
                idle_since = rec.idle_since or since
                if most == 0:
                    rec = self._drain(rec, now, "the pool is drained (max = 0)")
                elif leases:
                    self.st.update(name, idle_since=now)
                elif cfg is not None and now - idle_since > cfg.idle_seconds * 1000:
                    rec = self._drain(rec, now, f"no lease for {cfg.idle_seconds:g}s")
            elif leases == 0:
                rec = self._to(rec, "stopping", now, "drained: it holds no lease")
        if rec.state == "stopping":
            if now - (rec.since or now) > STOP_DEADLINE_SECONDS * 1000:
                self.rt.events.escalate(
                    "provisioner.stop_failed",
                    f"worker {name} of pool {pool} did not stop within {STOP_DEADLINE_SECONDS:g}s; "
                    "the server forgets it, and stops it when the platform lists it",
                    pool=pool,
                )
                self._forget(name, force_record=True)
            elif now - rec.stop_tried > STOP_RETRY_SECONDS * 1000:
                self.st.update(name, stop_tried=now)
                self._submit("stop", name, pool)
        elif rec.state == "stopped":
            self._forget(name)

    def _drain(self, rec: Provisioned, now: int, why: str) -> Provisioned:
        self.st.drain(rec.name, BY, why)
        return self._to(rec, "draining", now, why)

    def _forget(self, name: str, force_record: bool = False) -> None:
        """Drop an ended worker's record, once the lease engine has ended its leases (else next pass)."""
        if not self.st.forget_worker(name, BY) and not force_record:
            return
        tok = self.rt.tokens.get(name)
        if tok is not None and not tok.revoked:
            self.rt.tokens.revoke(name)
        self.st.remove(name)

    def _maybe_start(
        self, pool: str, cfg: ProvisionerConfig, now: int, live: int, recs: dict[str, Provisioned]
    ) -> None:
        if cfg.max <= live:
            return
        b = self.st.backoff(pool)
        if b.until > now or b.halted:
            return
        starting = sum(1 for r in recs.values() if r.pool == pool and r.state == "starting")
        pcfg = self.rt.executor.pools[pool]
        per = {kind: (pcfg.agents if kind == "agent" else pcfg.evaluations) for kind in KINDS}
        queued = self.st.queued(pool)
        free = {kind: starting * per[kind] for kind in KINDS}
        for w in self.st.workers().values():
            if w.pool != pool or w.draining or not w.alive:
                continue
            free["agent"] += max(0, per["agent"] - w.agents)
            free["evaluation"] += max(0, per["evaluation"] - w.evaluations)
        need = max(
            (math.ceil(max(0, queued[kind] - free[kind]) / per[kind]) for kind in KINDS if per[kind] > 0), default=0
        )
        if b.delay:
            need = min(need, 0 if starting else 1)  # after a failure, one start at a time until one comes up
        for _ in range(min(need, cfg.max - live)):
            self._start(pool, now)

    def _start(self, pool: str, now: int) -> None:
        if not self.url:
            if not self.warned_url:
                self.warned_url = True
                self.rt.events.escalate(
                    "provisioner.no_url",
                    f"pool {pool} has a provisioner but the server has no "
                    "address for its workers: set [plugins.network] url, or serve with --listen",
                    pool=pool,
                )
            return
        name = self.st.new_name(pool)
        self.st.create(Provisioned(name, pool=pool, state="starting", since=now, idle_since=now, why="jobs wait"))
        self.rt.events.add("provisioner.starting", BY, worker=name, pool=pool)
        log.info("event=provisioner.starting worker=%s pool=%s", name, pool)
        self._submit("start", name, pool, self.url)

    def _submit(self, op: str, key: str, pool: str, *args: Any) -> None:
        """A platform call, as a background task on the pool's own queue; one already queued is not queued twice."""
        from piloop_server import tasks

        queue = tasks.provisioner_queue(pool) if pool in self._pools() else tasks.DEFAULT
        tasks.submit(self.rt, f"{platform.__name__}:{op}", key, pool, *args, key=f"provisioner.{op}:{key}", queue=queue)

    def close(self) -> None:
        """Nothing to stop: the platform calls run in the server's background workers."""
