"""The platform side of the provisioner: the background tasks (`piloop_server.tasks`, on each pool's own queue)
that start, stop and list workers on a platform, and what a failed start does to the pool (its backoff).

Each runs in one of the server's rq worker processes, which keeps its providers (a Modal client, say) for its life.
Each is idempotent: it reads the record first, and a retry finds the work done or does it again. The pass that
decides when to call them is piloop_server/provisioner/manager.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from piloop_common.config.provisioner import ProvisionerConfig
from piloop_server.provisioner.base import (
    NAME_ENV,
    ORPHAN_ENV,
    TAG_ENV,
    Handle,
    PlatformAuthError,
    Provider,
    StartRefused,
)
from piloop_server.provisioner.providers import open_provider
from piloop_server.runtime import Runtime
from piloop_server.state.provisioned import ProvisionedState

log = logging.getLogger("piloop.provisioner")
BY = "service:provisioner"

# The start backoff: 30 s doubling to 10 minutes. Tests shorten the base with this env (the cap stays 20 × base).
BACKOFF_ENV = "PILOOP_PROVISIONER_BACKOFF_SECONDS"
BACKOFF_BASE_SECONDS = 30.0
BACKOFF_CAP_FACTOR = 20
REFUSALS_ESCALATE = 3
CREDENTIAL_SECRET = "PILOOP_WORKER_CREDENTIAL"  # the secret a started worker gets on the proxy network
NETWORK_ENV = "PILOOP_NETWORK__PROVIDER"  # `[plugins.network] provider`, for a worker started on the proxy network


def _state(rt: Runtime) -> ProvisionedState:
    return rt.provisioned


def proxy_network(rt: Runtime) -> bool:
    """Whether the server is on the proxy network, where no piloop token counts."""
    return rt.settings.plugins.network.provider == "proxy"


def backoff_base() -> float:
    raw = os.environ.get(BACKOFF_ENV, "")
    try:
        return float(raw) if raw else BACKOFF_BASE_SECONDS
    except ValueError:
        return BACKOFF_BASE_SECONDS


_providers: dict[str, tuple[str, Provider]] = {}  # pool -> (its compute and url, its provider), per process


def pools(rt: Runtime) -> dict[str, ProvisionerConfig]:
    """The pools that have a provisioner, and theirs."""
    return {n: p.provisioner for n, p in rt.executor.pools.items() if p.provisioner is not None}


def provider(rt: Runtime, pool: str, url: str | None = None) -> Provider | None:
    """The pool's provider, made again when its compute (or the url its workers dial) changes; a pool whose
    provisioner left config.toml keeps the one this process had, so that its workers can still be stopped."""
    cfg = pools(rt).get(pool)
    have = _providers.get(pool)
    if cfg is not None:
        url = url if url is not None else (have[1].url if have else "")
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

    out: dict[str, Any] = plain(cas.model_dump())
    if out.get("provider") == "local":
        # relative to the server's home, which is not the worker's
        out["path"] = str(rt.home / Path(out["path"]).expanduser() if out.get("path") else rt.home / "cas")
    return out


def _env(rt: Runtime, pool: str, name: str) -> dict[str, str]:
    """What a started worker gets beside its token (none on the proxy network, where it gets the credential)."""
    cfg = pools(rt).get(pool)
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
    until = st.now_ms() + int(delay * 1000)
    st.set_backoff(pool, delay=delay, until=until, refusals=refusals, why=why)
    rt.events.add(
        "provisioner.backoff", BY, pool=pool, seconds=delay, until_ms=until, reason=why, refused="1" if refused else "0"
    )
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
        # the homes before the records: a home made after them is of a worker they would not name yet
        homes = prov.unused_homes()
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
    _remove_homes(rt, homes, set(recs))
    ids = {h.id for h in handles}
    for name, rec in recs.items():
        if rec.pool != pool or rec.state not in ("starting", "running", "draining"):
            continue
        if rec.handle and rec.handle.get("id") not in ids:
            st.update(name, lost=True)


def _remove_homes(rt: Runtime, homes: dict[str, Path], keep: set[str]) -> None:
    """Remove the home of every started worker gone for good: no process runs in it (not even a job's shim) and no
    record names it (the server forgot it, or Redis lost it). A worker the provisioner stopped had its home removed
    by that stop already; this finds those whose stop never came."""
    for name, home in sorted(homes.items()):
        if name in keep:
            continue
        shutil.rmtree(home, ignore_errors=True)
        rt.events.add("provisioner.home_removed", BY, worker=name)
        log.info("event=provisioner.home_removed worker=%s home=%s (no record, no process)", name, home)
