"""The operator's routes: health, status, workers, limits, tokens, events, inbox."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from piloop_common import __version__
from piloop_common.errors import BadRequest, NotFound, PiloopError, bad_param
from piloop_common.protocol.operator import LimitRequest, LimitView, TokenCreate, TokenCreated, TokenView, WorkerView
from piloop_common.protocol.worker import SKIPPED_HEADER
from piloop_server import campaign_admin, cas_gc, workers
from piloop_server.api import shown
from piloop_server.api.deps import AdminDep, OperatorDep, RuntimeDep, ViewerDep
from piloop_server.auth import identify_async
from piloop_server.provisioner.manager import summary as provisioned_pools
from piloop_server.runtime import Runtime
from piloop_server.state.connection import UNREACHABLE, read_policy
from piloop_server.state.leader import LeaderLease

router = APIRouter(prefix="/v1", tags=["admin"])


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    """That the server is up, to anyone; its id, pid and version only to a caller it knows (the socket, a live
    token, the proxy's claims): they tell an attacker which release's flaws to try."""
    rt = request.app.state.runtime
    try:
        await identify_async(request)
    except (PiloopError, *UNREACHABLE):
        return {"ok": True}
    return {"ok": True, "server_id": rt.server_id, "pid": os.getpid(), "version": __version__}


def pass_leader(rt: Runtime) -> str:
    return LeaderLease(rt.redis, rt.keys, "").current().holder


@router.get("/workers", response_model=list[WorkerView])
def worker_list(rt: RuntimeDep, caller: ViewerDep, response: Response) -> list[WorkerView]:
    views, skipped = workers.views_counted(rt)
    response.headers[SKIPPED_HEADER] = str(skipped)  # records that cannot be read, skipped (and logged)
    return views


@router.delete("/workers/{name}")
def worker_forget(name: str, rt: RuntimeDep, caller: AdminDep) -> dict[str, str]:
    """Remove a worker that is gone for good from the list (`piloop worker forget`)."""
    workers.forget(rt, name, caller.signed)
    return {"worker": name}


@router.get("/status")
def status(request: Request, rt: RuntimeDep, caller: ViewerDep) -> dict[str, Any]:
    ws, skipped = workers.views_counted(rt)
    info = request.app.state.daemon_info
    return {
        "skipped": {"workers": skipped},  # records that cannot be read, skipped (and logged)
        # `instance` is this server's name for the leader lease; `pass_leader` the instance that runs the pass now
        "daemon": {**info, "server_id": rt.server_id, "version": __version__, "pass_leader": pass_leader(rt)},
        "redis": {
            "embedded": rt.settings.plugins.state.embedded,
            "generation": rt.generation(),
            "namespace": rt.settings.namespace,
            "used_memory": (mem := rt.retention.memory()).used,
            "maxmemory": mem.maxmemory,
            "retained_jobs": rt.retention.retained(),
            "unchecked": read_policy(rt.redis).note,  # what the noeviction check could not read ("" when none)
        },
        "retention": rt.settings.plugins.retention.model_dump(),
        "cas_gc": dict(zip(("last_ms", "next_ms"), cas_gc.due_ms(rt, info.get("started_ms", 0)), strict=True)),
        "cas": {"provider": rt.settings.plugins.cas.provider, "id": rt.cas_id},
        "pools": workers.pool_summary(rt, ws),
        "limits": [v.model_dump() for v in rt.limits.views()],
        "provisioners": provisioned_pools(rt),
        "campaigns": campaign_admin.summary(rt),
        "escalations": shown.events(caller, rt.events.inbox()[-10:]),
    }


@router.get("/limits", response_model=list[LimitView])
def limits_list(rt: RuntimeDep, caller: ViewerDep) -> list[LimitView]:
    return rt.limits.views()


@router.post("/limits", response_model=LimitView)
def limits_set(body: LimitRequest, rt: RuntimeDep, caller: AdminDep) -> LimitView:
    value = rt.limits.set(rt.settings.plugins.executor, body.key, body.value, body.reason, caller.signed)
    rt.refresh_limits()  # at once, not only at the next pass
    rt.events.add("limit.set", caller.signed, key=body.key, value=value, reason=body.reason)
    return next(v for v in rt.limits.views() if v.key == body.key)


@router.delete("/limits/{key}")
def limits_unset(key: str, rt: RuntimeDep, caller: AdminDep) -> dict[str, str]:
    rt.limits.unset(key)
    rt.refresh_limits()
    rt.events.add("limit.unset", caller.signed, key=key)
    return {"key": key}


@router.post("/tokens", response_model=TokenCreated)
def token_create(body: TokenCreate, rt: RuntimeDep, caller: AdminDep) -> TokenCreated:
    if body.pool is not None and body.pool not in rt.executor.pools:
        raise bad_param("pool", body.pool, f"no such pool (pools: {', '.join(sorted(rt.executor.pools))})")
    token = rt.tokens.create(
        body.name,
        by=caller.signed,
        pool=body.pool,
        expires_seconds=body.expires_seconds,
        rename=body.rename,
        role=body.role,
    )
    rt.events.add("token.created", caller.signed, name=body.name, pool=body.pool or "", role=body.role or "worker")
    return TokenCreated(name=body.name, token=token)


@router.get("/tokens", response_model=list[TokenView])
def token_list(rt: RuntimeDep, caller: AdminDep) -> list[TokenView]:
    return [
        TokenView(
            name=t.name,
            pool=t.pool,
            created_ms=t.created_ms,
            expires_ms=t.expires_ms,
            by=t.by,
            revoked=t.revoked,
            rename=t.rename,
            role=t.role,
        )
        for t in rt.tokens.every()
    ]


@router.post("/tokens/purge")
def token_purge(rt: RuntimeDep, caller: AdminDep) -> dict[str, list[str]]:
    gone = [t.name for t in rt.tokens.purge()]
    if gone:
        rt.events.add("token.purged", caller.signed, names=",".join(gone))
    return {"purged": gone}


@router.delete("/tokens/{name}")
def token_revoke(name: str, rt: RuntimeDep, caller: AdminDep) -> dict[str, str]:
    rt.tokens.revoke(name)
    rt.events.add("token.revoked", caller.signed, name=name)
    return {"name": name}


EVENT_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?")
MOST_EVENTS = 10_000


def _cursor(after: str) -> str:
    """`after` when Redis takes it as a stream id (`<ms>` or `<ms>-<seq>`, each under 2^64), else BadRequest."""
    m = EVENT_ID.fullmatch(after)
    if m is None or any(int(part) >= 2**64 for part in m.groups() if part is not None):
        raise BadRequest(f"after: {after[:40]!r} is not an event id (give 0, or the id of the last event read)")
    return after


@router.get("/events")
def events(
    rt: RuntimeDep,
    caller: ViewerDep,
    after: str = "0",
    count: Annotated[int, Query(ge=1, le=MOST_EVENTS)] = 100,
    block_ms: Annotated[int, Query(ge=0, le=30_000)] = 0,
    last: Annotated[int, Query(ge=0, le=MOST_EVENTS)] = 0,
) -> list[dict[str, Any]]:
    if last:
        return shown.events(caller, rt.events.tail(last))
    return shown.events(caller, rt.events.read(_cursor(after), count, block_ms or None))


@router.get("/inbox")
def inbox(rt: RuntimeDep, caller: ViewerDep, all: bool = False) -> list[dict[str, Any]]:
    return shown.events(caller, rt.events.inbox(include_acked=all))


@router.post("/inbox/{eid}/ack")
def inbox_ack(eid: str, rt: RuntimeDep, caller: OperatorDep) -> dict[str, str]:
    if not rt.events.ack(eid, caller.signed):
        raise NotFound(f"no escalation {eid} (see `piloop inbox`)")
    return {"id": eid}
