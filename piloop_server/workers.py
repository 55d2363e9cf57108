"""The operator's view of workers and pools."""

from __future__ import annotations

import json
import logging
from typing import Any

from piloop_common.operator_protocol import WorkerView
from piloop_common.protocol import HostSample
from piloop_server import pools
from piloop_server.provisioner.manager import records as provisioned_records
from piloop_server.runtime import Runtime
from piloop_server.state.records.lease import KINDS
from piloop_server.state.records.worker import Worker

log = logging.getLogger("piloop.workers")

# pools.host_reason's only: the view reads it from the worker's latest sample. ("memory" is also a claim's own
# reason, a grant that does not fit the room, so a stored one stays.)
HOST_REASONS = ("load",)


def now_ms(rt: Runtime) -> int:
    return rt.workers.now_ms()


def views(rt: Runtime) -> list[WorkerView]:
    return views_counted(rt)[0]


def views_counted(rt: Runtime) -> tuple[list[WorkerView], int]:
    """Every worker's view, and how many records were skipped because they cannot be read (each one logged): one
    bad record never fails the listing."""
    recs = rt.workers.all()
    granted = _granted(rt, [[j for ids in w.leases.values() for j in ids] for w in recs])
    now = now_ms(rt)
    out = []
    skipped = 0
    for w, mb in zip(recs, granted, strict=True):
        try:
            out.append(_view(rt, w, mb, now))
        except (ValueError, TypeError, KeyError) as e:
            skipped += 1
            log.warning("event=record.skipped record=worker name=%r error=%s", w.name, str(e).splitlines()[0][:200])
    return _with_provisioned(rt, recs, out), skipped


def _view(rt: Runtime, w: Worker, mb: int, now: int) -> WorkerView:
    """One worker's view; ValueError (pydantic's too), TypeError or KeyError for a record that cannot be read."""
    raw = w.sample_dict()
    sample = HostSample.model_validate({k: v for k, v in raw.items() if k != "admission"}) if raw else None
    pool = rt.executor.pools.get(w.pool)
    agents, evals = len(w.leases.get("agent", [])), len(w.leases.get("evaluation", []))
    if not w.alive:
        reason = "unreachable"
    elif w.draining:
        reason = "draining"
    elif pool is None:
        reason = "pool"
    else:
        reason = pools.host_reason(pool, sample, (raw or {}).get("admission", ""))
        if not reason and agents >= pool.agents and evals >= pool.evaluations:
            reason = "slots"
        # the last claim's host reason is older than the sample read above: a host fit again says so at once
        stored = "" if w.reason in HOST_REASONS else w.reason
        reason = reason or stored or "nothing"
    return WorkerView(
        name=w.name,
        pool=w.pool,
        image=w.image,
        host=_host(w.info),
        seen_seconds=max(0.0, (now - w.seen) / 1000) if w.seen else None,
        reachable=w.alive,
        draining=w.draining,
        sample=sample,
        agents=agents,
        evaluations=evals,
        no_lease=reason,
        room_mb=w.room_mb,
        granted_mb=mb,
    )


def _with_provisioned(rt: Runtime, recs: list[Worker], out: list[WorkerView]) -> list[WorkerView]:
    # a worker the server started shows from its start, before it registers
    names = {w.name for w in recs}
    for n, rec in provisioned_records(rt).items():
        if n not in names and rec.state in ("starting", "stopping"):
            out.append(
                WorkerView(
                    name=n,
                    pool=rec.pool,
                    image="",
                    seen_seconds=None,
                    reachable=False,
                    draining=False,
                    sample=None,
                    agents=0,
                    evaluations=0,
                    no_lease=rec.state,
                )
            )
    return sorted(out, key=lambda w: w.name)


def _granted(rt: Runtime, leases: list[list[str]]) -> list[int]:
    """Each worker's granted memory (MiB): the grants of the jobs it holds leases on, as claim.lua sums them."""
    got = iter(rt.jobs.field_of([j for ids in leases for j in ids], "granted_mb"))
    return [sum(int(next(got) or 0) for _ in ids) for ids in leases]


def _host(info: str) -> str:
    try:
        got = json.loads(info) if info else {}
    except ValueError:
        return ""
    host = got.get("host") if isinstance(got, dict) else None
    return host if isinstance(host, str) else ""


def pool_summary(rt: Runtime, workers: list[WorkerView]) -> list[dict[str, Any]]:
    out = []
    names = sorted(rt.executor.pools)
    counts = rt.jobs.counts(names, KINDS)
    for name in names:
        pool = rt.executor.pools[name]
        mine = [w for w in workers if w.pool == name]
        usable = [w for w in mine if w.reachable and not w.draining and not pools.host_reason(pool, w.sample)]
        row: dict[str, Any] = {
            "pool": name,
            "workers": len(mine),
            "reachable": sum(w.reachable for w in mine),
            "room_mb": sum(w.room_mb or 0 for w in mine if w.reachable),
            "granted_mb": sum(w.granted_mb for w in mine if w.reachable),
        }
        for kind in KINDS:
            per = pools.slots(pool, kind)
            used = sum(w.agents if kind == "agent" else w.evaluations for w in usable)
            row[f"{kind}_slots"] = per * len(usable)
            row[f"{kind}_free"] = max(0, per * len(usable) - used)
            row[f"{kind}_queued"], row[f"{kind}_running"] = counts[(name, kind)]
        out.append(row)
    return out
