"""The pool logic of the pass: start workers for waiting jobs, drain idle ones, stop the lost and the unknown.

The pass decides from Redis alone and never waits on a platform: each platform call (start, stop, list) is a
background task (`piloop_server.tasks`) on the pool's own queue, which writes what it learnt back to Redis for the
next pass. A started worker's record (`keys.provisioned(name)`) walks `starting → running → draining → stopping →
stopped`, and every state but `running` has a deadline:

- `starting`: registered within `register_seconds`, else stopped and the pool backs off;
- `draining`: ends when its last lease ends (the lease engine bounds that: job timeouts, toleration);
- `stopping`: stopped within STOP_DEADLINE_SECONDS, else escalated and forgotten (the listing stops it later);
- `stopped`: forgotten once the lease engine has ended its leases.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from piloop_common.config import ProvisionerConfig
from piloop_server.provisioner.base import (
    NAME_ENV, ORPHAN_ENV, TAG_ENV, Handle, PlatformAuthError, Provider, StartRefused, open_provider,
)
from piloop_server.runtime import Runtime
from piloop_server.state.leases import KINDS
from piloop_server.state.scripts import Scripts

log = logging.getLogger("piloop.provisioner")

BY = "service:provisioner"
# The start backoff: 30 s doubling to 10 minutes. Tests shorten the base with this env (the cap stays 20 × base).
BACKOFF_ENV = "PILOOP_PROVISIONER_BACKOFF_SECONDS"
BACKOFF_BASE_SECONDS = 30.0
BACKOFF_CAP_FACTOR = 20
REFUSALS_ESCALATE = 3
LIST_SECONDS = 2.0  # how often the platform is listed: lost workers, and tagged ones we have no record of
STOP_RETRY_SECONDS = 5.0
STOP_DEADLINE_SECONDS = 120.0
LIVE = ("starting", "running", "draining", "stopping")  # states that count against `max`
CREDENTIAL_SECRET = "PILOOP_WORKER_CREDENTIAL"  # the secret a started worker gets on the proxy network


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


def records(rt: Runtime) -> dict[str, dict[str, str]]:
    """Every started worker's record, by name."""
    r, k = rt.redis, rt.keys
    names = sorted(_s(n) for n in r.smembers(k.provisioned_names()))
    pipe = r.pipeline(transaction=False)
    for n in names:
        pipe.hgetall(k.provisioned(n))
    return {n: {_s(a): _s(b) for a, b in h.items()} for n, h in zip(names, pipe.execute()) if h}


def backoff(rt: Runtime, pool: str) -> dict[str, Any]:
    h = {_s(a): _s(b) for a, b in rt.redis.hgetall(rt.keys.provisioner(pool)).items()}
    return {"delay_seconds": float(h.get("delay") or 0), "until_ms": int(h.get("until") or 0),
            "refusals": int(h.get("refusals") or 0), "last_failure": h.get("why", ""), "halted": h.get("halted", "")}


def summary(rt: Runtime) -> list[dict[str, Any]]:
    """Each provisioned pool for `piloop status`: its max, its workers by state, its backoff."""
    recs = records(rt)
    sec, usec = rt.redis.time()
    now = sec * 1000 + usec // 1000
    out = []
    for pool, p in sorted(rt.executor.pools.items()):
        if p.provisioner is None:
            continue
        states = [r.get("state", "") for r in recs.values() if r.get("pool") == pool]
        b = backoff(rt, pool)
        out.append({"pool": pool, "provider": p.provisioner.compute.provider, "max": p.provisioner.max,
                    **{s: states.count(s) for s in LIVE},
                    "backoff_seconds": b["delay_seconds"],
                    "backoff_left_seconds": max(0.0, (b["until_ms"] - now) / 1000),
                    "refusals": b["refusals"], "last_failure": b["last_failure"], "halted": b["halted"]})
    return out


def backoff_base() -> float:
    raw = os.environ.get(BACKOFF_ENV, "")
    try:
        return float(raw) if raw else BACKOFF_BASE_SECONDS
    except ValueError:
        return BACKOFF_BASE_SECONDS


class Provisioner:
    def __init__(self, rt: Runtime, *, url: str | None, home: Path) -> None:
        self.rt = rt
        self.url = url
        self.home = home
        self.scripts = Scripts(rt.redis)
        self.last_list: dict[str, float] = {}
        self.warned_url = False
        for pool in self._pools():  # a restarted server tries the platform's credentials again
            rt.redis.hdel(rt.keys.provisioner(pool), "halted")

    # -- what the pass reads --------------------------------------------------------------------
    def _pools(self) -> dict[str, ProvisionerConfig]:
        return _pools(self.rt)

    def records(self) -> dict[str, dict[str, str]]:
        return records(self.rt)

    def _now(self) -> int:
        return _now(self.rt)

    def backoff(self, pool: str) -> dict[str, Any]:
        return backoff(self.rt, pool)

    # -- the pass --------------------------------------------------------------------------------
    def run_once(self) -> None:
        rt, k = self.rt, self.rt.keys
        pools = self._pools()
        recs = self.records()
        if not pools and not recs:
            return  # the common case: one SMEMBERS per pass
        now = self._now()
        pipe = rt.redis.pipeline(transaction=False)
        for n in recs:
            pipe.hmget(k.worker(n), "registered", "draining")
            pipe.exists(k.worker_alive(n))
            for kind in KINDS:
                pipe.scard(k.worker_leases(n, kind))
        got = pipe.execute()
        live_per_pool: dict[str, int] = {}
        for i, (name, rec) in enumerate(recs.items()):
            (registered, _), alive, agents, evals = got[4 * i: 4 * i + 4]
            cfg = pools.get(rec.get("pool", ""))
            self._tend(name, rec, cfg, now, bool(registered), bool(alive), agents + evals)
        for rec in self.records().values():
            if rec.get("state") in LIVE:
                live_per_pool[rec["pool"]] = live_per_pool.get(rec["pool"], 0) + 1
        for pool, cfg in pools.items():
            self._maybe_start(pool, cfg, now, live_per_pool.get(pool, 0), recs)
            if time.monotonic() - self.last_list.get(pool, 0.0) >= LIST_SECONDS:
                self.last_list[pool] = time.monotonic()
                self._submit("list_pool", pool, pool)

    def _set(self, name: str, **fields: Any) -> None:
        _set(self.rt, name, **fields)

    def _to(self, name: str, rec: dict[str, str], state: str, now: int, why: str) -> None:
        self._set(name, state=state, since=now, why=why)
        rec.update(state=state, since=str(now))
        self.rt.events.add(f"provisioner.{state}", BY, worker=name, pool=rec.get("pool", ""), reason=why)
        log.info("event=provisioner.%s worker=%s pool=%s reason=%r", state, name, rec.get("pool", ""), why)

    def _tend(self, name: str, rec: dict[str, str], cfg: ProvisionerConfig | None, now: int, registered: bool,
              alive: bool, leases: int) -> None:
        state, since = rec.get("state", ""), int(rec.get("since") or now)
        pool = rec.get("pool", "")
        # a pool that lost its provisioner in config.toml is drained like max = 0
        most = cfg.max if cfg is not None else 0
        if state == "starting":
            if registered and alive:
                self._set(name, idle_since=now)
                self._to(name, rec, "running", now, "registered")
                self.rt.redis.delete(self.rt.keys.provisioner(pool))  # a worker came up: the backoff resets
            elif rec.get("lost"):
                self._to(name, rec, "stopping", now, "its process ended before it registered")
                self._fail(pool, "a started worker ended before it registered", refused=False)
            elif cfg is not None and now - since > cfg.register_seconds * 1000:
                self._to(name, rec, "stopping", now, f"not registered within {cfg.register_seconds:g}s")
                self._fail(pool, f"a started worker did not register within {cfg.register_seconds:g}s", refused=False)
            elif cfg is None or most == 0:
                self._to(name, rec, "stopping", now, "the pool is drained (max = 0)")
        elif state in ("running", "draining"):
            if rec.get("lost"):
                self._to(name, rec, "stopping", now, "the platform lost it")
            elif not alive:
                self._to(name, rec, "stopping", now, "it went silent")
            elif state == "running":
                idle_since = int(rec.get("idle_since") or since)
                if most == 0:
                    self._drain(name, rec, now, "the pool is drained (max = 0)")
                elif leases:
                    self._set(name, idle_since=now)
                elif cfg is not None and now - idle_since > cfg.idle_seconds * 1000:
                    self._drain(name, rec, now, f"no lease for {cfg.idle_seconds:g}s")
            elif leases == 0:
                self._to(name, rec, "stopping", now, "drained: it holds no lease")
        if rec.get("state") == "stopping":
            if now - int(rec.get("since") or now) > STOP_DEADLINE_SECONDS * 1000:
                self.rt.events.escalate("provisioner.stop_failed",
                                        f"worker {name} of pool {pool} did not stop within {STOP_DEADLINE_SECONDS:g}s; "
                                        "the server forgets it, and stops it when the platform lists it", pool=pool)
                self._forget(name, force_record=True)
            elif now - int(rec.get("stop_tried") or 0) > STOP_RETRY_SECONDS * 1000:
                self._set(name, stop_tried=now)
                self._submit("stop", name, pool)
        elif rec.get("state") == "stopped":
            self._forget(name)

    def _drain(self, name: str, rec: dict[str, str], now: int, why: str) -> None:
        k = self.rt.keys
        self.scripts.run("drain", [k.worker(name), k.events()], [name, BY, why])
        self._to(name, rec, "draining", now, why)

    def _forget(self, name: str, force_record: bool = False) -> None:
        """Drop an ended worker's record, once the lease engine has ended its leases (else next pass)."""
        k = self.rt.keys
        done = self.scripts.run("forget_worker", [k.worker(name), k.worker_alive(name), k.workers(),
                                                  k.worker_leases(name, "agent"), k.worker_leases(name, "evaluation"),
                                                  k.events()], [name, BY])
        if not done and not force_record:
            return
        tok = self.rt.tokens.get(name)
        if tok is not None and not tok.revoked:
            self.rt.tokens.revoke(name)
        pipe = self.rt.redis.pipeline(transaction=True)
        pipe.delete(k.provisioned(name))
        pipe.srem(k.provisioned_names(), name)
        pipe.execute()

    def _fail(self, pool: str, why: str, *, refused: bool) -> None:
        fail(self.rt, pool, why, refused=refused)

    def _maybe_start(self, pool: str, cfg: ProvisionerConfig, now: int, live: int,
                     recs: dict[str, dict[str, str]]) -> None:
        if cfg.max <= live:
            return
        b = self.backoff(pool)
        if b["until_ms"] > now or b["halted"]:
            return
        starting = sum(1 for r in recs.values() if r.get("pool") == pool and r.get("state") == "starting")
        pcfg = self.rt.executor.pools[pool]
        per = {kind: (pcfg.agents if kind == "agent" else pcfg.evaluations) for kind in KINDS}
        rt, k = self.rt, self.rt.keys
        names = [_s(n) for n in rt.redis.smembers(k.workers())]
        pipe = rt.redis.pipeline(transaction=False)
        for kind in KINDS:
            pipe.zcard(k.queue(pool, kind))
        for n in names:
            pipe.hmget(k.worker(n), "pool", "draining")
            pipe.exists(k.worker_alive(n))
            for kind in KINDS:
                pipe.scard(k.worker_leases(n, kind))
        got = pipe.execute()
        queued = dict(zip(KINDS, got[:2]))
        free = {kind: starting * per[kind] for kind in KINDS}
        for i in range(len(names)):
            (wpool, draining), alive, agents, evals = got[2 + 4 * i: 6 + 4 * i]
            if _s(wpool) != pool or _s(draining) == "1" or not alive:
                continue
            free["agent"] += max(0, per["agent"] - agents)
            free["evaluation"] += max(0, per["evaluation"] - evals)
        need = max((math.ceil(max(0, queued[kind] - free[kind]) / per[kind]) for kind in KINDS if per[kind] > 0),
                   default=0)
        if b["delay_seconds"]:
            need = min(need, 0 if starting else 1)  # after a failure, one start at a time until one comes up
        for _ in range(min(need, cfg.max - live)):
            self._start(pool, now)

    def _start(self, pool: str, now: int) -> None:
        if not self.url:
            if not self.warned_url:
                self.warned_url = True
                self.rt.events.escalate("provisioner.no_url", f"pool {pool} has a provisioner but the server has no "
                                        "address for its workers: set [plugins.network] url, or serve with --listen",
                                        pool=pool)
            return
        rt, k = self.rt, self.rt.keys
        name = f"{pool}-{rt.redis.incr(k.provisioned_seq())}"
        pipe = rt.redis.pipeline(transaction=True)
        pipe.hset(k.provisioned(name), mapping={"pool": pool, "state": "starting", "since": now, "idle_since": now,
                                                "why": "jobs wait"})
        pipe.sadd(k.provisioned_names(), name)
        pipe.execute()
        rt.events.add("provisioner.starting", BY, worker=name, pool=pool)
        log.info("event=provisioner.starting worker=%s pool=%s", name, pool)
        self._submit("start", name, pool, self.url)

    def _submit(self, op: str, key: str, pool: str, *args: Any) -> None:
        """A platform call, as a background task on the pool's own queue; one already queued is not queued twice."""
        from piloop_server import tasks

        queue = tasks.provisioner_queue(pool) if pool in self._pools() else tasks.DEFAULT
        tasks.submit(self.rt, f"{__name__}:{op}", key, pool, *args, key=f"provisioner.{op}:{key}", queue=queue)

    def close(self) -> None:
        """Nothing to stop: the platform calls run in the server's background workers."""


# -- the platform side: background tasks (piloop_server.tasks) on the pool's queue ---------------------------
# Each runs in one of the server's rq worker processes, which keeps its providers (a Modal client, say) for its
# life. Each is idempotent: it reads the record first, and a retry finds the work done or does it again.

_providers: dict[str, tuple[str, Provider]] = {}  # pool -> (its compute and url, its provider), per process


def _pools(rt: Runtime) -> dict[str, ProvisionerConfig]:
    return {n: p.provisioner for n, p in rt.executor.pools.items() if p.provisioner is not None}


def _now(rt: Runtime) -> int:
    sec, usec = rt.redis.time()
    return sec * 1000 + usec // 1000


def _set(rt: Runtime, name: str, **fields: Any) -> None:
    rt.redis.hset(rt.keys.provisioned(name), mapping={a: str(b) for a, b in fields.items()})


def _record(rt: Runtime, name: str) -> dict[str, str]:
    return {_s(a): _s(b) for a, b in rt.redis.hgetall(rt.keys.provisioned(name)).items()}


def provider(rt: Runtime, pool: str, url: str | None = None) -> Provider | None:
    """The pool's provider, made again when its compute (or the url its workers dial) changes; a pool whose
    provisioner left config.toml keeps the one this process had, so that its workers can still be stopped."""
    cfg = _pools(rt).get(pool)
    have = _providers.get(pool)
    if cfg is not None:
        url = url if url is not None else (have[1].url if have else "")  # type: ignore[attr-defined]
        sig = json.dumps([cfg.compute.model_dump(mode="json"), url], sort_keys=True)
        if have is None or have[0] != sig:
            _providers[pool] = (sig, open_provider(pool, cfg.compute, url=url or "", home=rt.home, tag=rt.server_id,
                                                   cas_plugins=_cas(rt)))
    have = _providers.get(pool)
    return have[1] if have else None


def _cas(rt: Runtime) -> dict[str, Any]:
    cas = rt.settings.plugins.cas

    def plain(v: Any) -> Any:
        if hasattr(v, "get_secret_value"):
            return v.get_secret_value()
        if isinstance(v, dict):
            return {a: plain(b) for a, b in v.items()}
        if isinstance(v, Path):
            return str(v)
        return v

    out = plain(cas.model_dump())
    if out.get("provider") == "local":
        # relative to the server's home, which is not the worker's
        out["path"] = str(rt.home / Path(out["path"]).expanduser() if out.get("path") else rt.home / "cas")
    return out


def _env(rt: Runtime, pool: str, name: str) -> dict[str, str]:
    cfg = _pools(rt).get(pool)
    env = {TAG_ENV: rt.server_id, NAME_ENV: name, "PILOOP_PROVISIONED_POOL": pool}
    if rt.settings.plugins.network.provider == "proxy" and CREDENTIAL_SECRET in rt.secrets.names():
        # behind the proxy no piloop token counts: each worker presents the credential the proxy accepts
        env.update(rt.secrets.values([CREDENTIAL_SECRET]))
    if cfg is not None and cfg.orphan_exit_seconds is not None:
        env[ORPHAN_ENV] = f"{cfg.orphan_exit_seconds:g}"
    else:
        env[ORPHAN_ENV] = "0"  # unset: exit as soon as orphaned and idle
    return env


def fail(rt: Runtime, pool: str, why: str, *, refused: bool) -> None:
    """A failed start: wait base, doubling to 20 × base, before the next; three refusals in a row escalate."""
    b = backoff(rt, pool)
    base = backoff_base()
    delay = min(b["delay_seconds"] * 2, base * BACKOFF_CAP_FACTOR) if b["delay_seconds"] else base
    refusals = b["refusals"] + 1 if refused else 0
    rt.redis.hset(rt.keys.provisioner(pool), mapping={"delay": delay, "until": _now(rt) + int(delay * 1000),
                                                      "refusals": refusals, "why": why})
    rt.events.add("provisioner.backoff", BY, pool=pool, seconds=delay, reason=why)
    log.warning("event=provisioner.backoff pool=%s seconds=%g reason=%r", pool, delay, why)
    if refused and refusals == REFUSALS_ESCALATE:
        rt.events.escalate("provisioner.refused",
                           f"the platform refused {REFUSALS_ESCALATE} starts in a row for pool {pool}: {why}",
                           pool=pool)


def auth_failed(rt: Runtime, pool: str, e: PlatformAuthError) -> None:
    """Bad credentials never heal by retrying: the pool starts nothing more, and one escalation says why."""
    if backoff(rt, pool)["halted"]:
        return
    rt.redis.hset(rt.keys.provisioner(pool), "halted", e.message)
    rt.events.escalate("provisioner.auth", f"the platform refused the server's credentials for pool "
                       f"{pool}: {e.message}; the pool starts no worker until the server restarts", pool=pool)


def start(rt: Runtime, name: str, pool: str, url: str) -> None:
    """Start worker `name` with a token of its own, unless its record has moved on (a retry, a late task)."""
    rec = _record(rt, name)
    if rec.get("state") != "starting" or rec.get("handle"):
        return
    prov = provider(rt, pool, url)
    try:
        if prov is None:
            raise StartRefused(f"pool {pool} has no provisioner now")
        if (old := rt.tokens.get(name)) is not None and not old.revoked:
            rt.tokens.revoke(name)  # a retried start: the token of the try before is never seen again
        token = rt.tokens.create(name, by=BY, pool=pool)
        h = prov.start(name, token, _env(rt, pool, name))
    except PlatformAuthError as e:
        auth_failed(rt, pool, e)
        _set(rt, name, state="stopped", since=_now(rt), why="the platform refused our credentials")
        return
    except Exception as e:  # a quota, no GPU, or any other failed start: the pool backs off
        msg = getattr(e, "message", None) or str(e)
        _set(rt, name, state="stopped", since=_now(rt), why=f"refused: {msg}")
        fail(rt, pool, msg, refused=True)
        return
    _set(rt, name, handle=json.dumps(asdict(h)))


def stop(rt: Runtime, name: str, pool: str) -> None:
    """Stop worker `name` (one already gone is stopped): by its handle, or else by what the platform lists."""
    rec = _record(rt, name)
    if rec.get("state") != "stopping":
        return
    prov = provider(rt, rec.get("pool") or pool)
    try:
        if prov is not None:
            handles = ([Handle(**json.loads(rec["handle"]))] if rec.get("handle")
                       else [h for h in prov.list(rt.server_id) if h.name == name])
            for h in handles:
                prov.stop(h)
    except PlatformAuthError as e:
        auth_failed(rt, pool, e)
        return  # tried again by the pass every STOP_RETRY_SECONDS, until STOP_DEADLINE_SECONDS
    _set(rt, name, state="stopped", since=_now(rt))
    rt.events.add("provisioner.stopped", BY, worker=name, pool=rec.get("pool", ""))
    log.info("event=provisioner.stopped worker=%s pool=%s", name, rec.get("pool", ""))


def list_pool(rt: Runtime, pool: str, _: str = "") -> None:
    """List the platform by our tag: stop what we have no record of, mark lost what the listing lacks."""
    prov = provider(rt, pool)
    if prov is None:
        return
    try:
        handles = prov.list(rt.server_id)
        recs = records(rt)
        for h in handles:
            if h.name not in recs:
                prov.stop(h)
                rt.events.add("provisioner.unknown_stopped", BY, worker=h.name, pool=h.pool, id=h.id)
                log.warning("event=provisioner.unknown_stopped worker=%s id=%s (tagged as ours, no record)", h.name,
                            h.id)
    except PlatformAuthError as e:
        auth_failed(rt, pool, e)
        return
    ids = {h.id for h in handles}
    for name, rec in recs.items():
        if rec.get("pool") != pool or rec.get("state") not in ("starting", "running", "draining"):
            continue
        if rec.get("handle") and json.loads(rec["handle"])["id"] not in ids:
            _set(rt, name, lost=1)
