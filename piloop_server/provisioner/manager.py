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

import json
import logging
import math
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from piloop_common.config import ProvisionerConfig
from piloop_server.provisioner.base import (
    NAME_ENV,
    ORPHAN_ENV,
    TAG_ENV,
    Handle,
    PlatformAuthError,
    Provider,
    StartRefused,
    open_provider,
)
from piloop_server.runtime import Runtime
from piloop_server.state.provisioned import KINDS, ProvisionedState
from piloop_server.state.records.provisioned import Provisioned

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
NETWORK_ENV = "PILOOP_NETWORK__PROVIDER"  # `[plugins.network] provider`, for a worker started on the proxy network


def _state(rt: Runtime) -> ProvisionedState:
    return rt.provisioned


def records(rt: Runtime) -> dict[str, Provisioned]:
    """Every started worker's record, by name."""
    return _state(rt).records()


def summary(rt: Runtime) -> list[dict[str, Any]]:
    """Each provisioned pool for `piloop status`: its max, its workers by state, its backoff."""
    st = _state(rt)
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


def proxy_network(rt: Runtime) -> bool:
    """Whether the server is on the proxy network, where no piloop token counts."""
    return rt.settings.plugins.network.provider == "proxy"


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
        self.st = _state(rt)
        self.last_list: dict[str, float] = {}
        self.warned_url = False
        for pool in self._pools():  # a restarted server tries the platform's credentials again
            self.st.unhalt(pool)

    # -- what the pass reads --------------------------------------------------------------------
    def _pools(self) -> dict[str, ProvisionerConfig]:
        return _pools(self.rt)

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
        tasks.submit(self.rt, f"{__name__}:{op}", key, pool, *args, key=f"provisioner.{op}:{key}", queue=queue)

    def close(self) -> None:
        """Nothing to stop: the platform calls run in the server's background workers."""


# -- the platform side: background tasks (piloop_server.tasks) on the pool's queue ---------------------------
# Each runs in one of the server's rq worker processes, which keeps its providers (a Modal client, say) for its
# life. Each is idempotent: it reads the record first, and a retry finds the work done or does it again.

_providers: dict[str, tuple[str, Provider]] = {}  # pool -> (its compute and url, its provider), per process


def _pools(rt: Runtime) -> dict[str, ProvisionerConfig]:
    return {n: p.provisioner for n, p in rt.executor.pools.items() if p.provisioner is not None}


def provider(rt: Runtime, pool: str, url: str | None = None) -> Provider | None:
    """The pool's provider, made again when its compute (or the url its workers dial) changes; a pool whose
    provisioner left config.toml keeps the one this process had, so that its workers can still be stopped."""
    cfg = _pools(rt).get(pool)
    have = _providers.get(pool)
    if cfg is not None:
        url = url if url is not None else (have[1].url if have else "")  # type: ignore[attr-defined]
        sig = json.dumps([cfg.compute.model_dump(mode="json"), url], sort_keys=True)
        if have is None or have[0] != sig:
            _providers[pool] = (
                sig,
                open_provider(pool, cfg.compute, url=url or "", home=rt.home, tag=rt.server_id, cas_plugins=_cas(rt)),
            )
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
    """What a started worker gets beside its token (none on the proxy network, where it gets the credential)."""
    cfg = _pools(rt).get(pool)
    env = {TAG_ENV: rt.server_id, NAME_ENV: name, "PILOOP_PROVISIONED_POOL": pool}
    if proxy_network(rt):
        # behind the proxy no piloop token counts: each worker presents the credential the proxy accepts, and is
        # told it is on that network (a PILOOP_PLUGINS of the compute's env still wins)
        credential = rt.secrets.server_value(CREDENTIAL_SECRET)
        if not credential:
            raise StartRefused(
                f"pool {pool}: on the proxy network a started worker presents the secret "
                f"{CREDENTIAL_SECRET}, which is not set (or this server's key cannot open it): "
                f'printf %s "$WORKER_KEY" | piloop secret set {CREDENTIAL_SECRET}'
            )
        env[CREDENTIAL_SECRET] = credential
        env[NETWORK_ENV] = "proxy"
    if cfg is not None and cfg.orphan_exit_seconds is not None:
        env[ORPHAN_ENV] = f"{cfg.orphan_exit_seconds:g}"
    else:
        env[ORPHAN_ENV] = "0"  # unset: exit as soon as orphaned and idle
    return env


def fail(rt: Runtime, pool: str, why: str, *, refused: bool) -> None:
    """A failed start: wait base, doubling to 20 × base, before the next; three refusals in a row escalate."""
    st = _state(rt)
    b = st.backoff(pool)
    base = backoff_base()
    delay = min(b.delay * 2, base * BACKOFF_CAP_FACTOR) if b.delay else base
    refusals = b.refusals + 1 if refused else 0
    st.set_backoff(pool, delay=delay, until=st.now_ms() + int(delay * 1000), refusals=refusals, why=why)
    rt.events.add("provisioner.backoff", BY, pool=pool, seconds=delay, reason=why)
    log.warning("event=provisioner.backoff pool=%s seconds=%g reason=%r", pool, delay, why)
    if refused and refusals == REFUSALS_ESCALATE:
        rt.events.escalate(
            "provisioner.refused",
            f"the platform refused {REFUSALS_ESCALATE} starts in a row for pool {pool}: {why}",
            pool=pool,
        )


def auth_failed(rt: Runtime, pool: str, e: PlatformAuthError) -> None:
    """Bad credentials never heal by retrying: the pool starts nothing more, and one escalation says why."""
    st = _state(rt)
    if st.backoff(pool).halted:
        return
    st.halt(pool, e.message)
    rt.events.escalate(
        "provisioner.auth",
        f"the platform refused the server's credentials for pool "
        f"{pool}: {e.message}; the pool starts no worker until the server restarts",
        pool=pool,
    )


def start(rt: Runtime, name: str, pool: str, url: str) -> None:
    """Start worker `name` with a token of its own (on the proxy network, with the shared credential and no
    token), unless its record has moved on (a retry, a late task)."""
    st = _state(rt)
    rec = st.get(name)
    if rec is None or rec.state != "starting" or rec.handle:
        return
    prov = provider(rt, pool, url)
    try:
        if prov is None:
            raise StartRefused(f"pool {pool} has no provisioner now")
        env = _env(rt, pool, name)
        if (old := rt.tokens.get(name)) is not None and not old.revoked:
            rt.tokens.revoke(name)  # a retried start: the token of the try before is never seen again
        token = None if proxy_network(rt) else rt.tokens.create(name, by=BY, pool=pool)
        h = prov.start(name, token, env)
    except PlatformAuthError as e:
        auth_failed(rt, pool, e)
        st.update(name, state="stopped", since=st.now_ms(), why="the platform refused our credentials")
        return
    except Exception as e:  # noqa: BLE001 — a quota, no GPU, or any other failed start: the pool backs off
        msg = getattr(e, "message", None) or str(e)
        st.update(name, state="stopped", since=st.now_ms(), why=f"refused: {msg}")
        fail(rt, pool, msg, refused=True)
        return
    st.update(name, handle=asdict(h))


def stop(rt: Runtime, name: str, pool: str) -> None:
    """Stop worker `name` (one already gone is stopped): by its handle, or else by what the platform lists."""
    st = _state(rt)
    rec = st.get(name)
    if rec is None or rec.state != "stopping":
        return
    prov = provider(rt, rec.pool or pool)
    try:
        if prov is not None:
            handles = [Handle(**rec.handle)] if rec.handle else [h for h in prov.list(rt.server_id) if h.name == name]
            for h in handles:
                prov.stop(h)
    except PlatformAuthError as e:
        auth_failed(rt, pool, e)
        return  # tried again by the pass every STOP_RETRY_SECONDS, until STOP_DEADLINE_SECONDS
    st.update(name, state="stopped", since=st.now_ms())
    rt.events.add("provisioner.stopped", BY, worker=name, pool=rec.pool)
    log.info("event=provisioner.stopped worker=%s pool=%s", name, rec.pool)


def list_pool(rt: Runtime, pool: str, _: str = "") -> None:
    """List the platform by our tag: stop what we have no record of, mark lost what the listing lacks."""
    prov = provider(rt, pool)
    if prov is None:
        return
    st = _state(rt)
    try:
        handles = prov.list(rt.server_id)
        recs = st.records()
        for h in handles:
            if h.name not in recs:
                prov.stop(h)
                # `handle`, not `id`: an event's `id` is its place in the stream, which readers page by
                rt.events.add("provisioner.unknown_stopped", BY, worker=h.name, pool=h.pool, handle=h.id)
                log.warning(
                    "event=provisioner.unknown_stopped worker=%s id=%s (tagged as ours, no record)", h.name, h.id
                )
    except PlatformAuthError as e:
        auth_failed(rt, pool, e)
        return
    ids = {h.id for h in handles}
    for name, rec in recs.items():
        if rec.pool != pool or rec.state not in ("starting", "running", "draining"):
            continue
        if rec.handle and rec.handle.get("id") not in ids:
            st.update(name, lost=True)
