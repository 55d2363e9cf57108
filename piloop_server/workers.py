"""The operator's view of workers and pools."""

from __future__ import annotations

import json
import logging
from typing import Any

from piloop_common.errors import Conflict, NotFound
from piloop_common.names import check_name
from piloop_common.protocol.operator import WorkerView
from piloop_common.protocol.worker import HostSample
from piloop_server import pools
from piloop_server.provisioner.manager import records as provisioned_records
from piloop_server.runtime import Runtime
from piloop_server.state.records.lease import KINDS
from piloop_server.state.records.worker import WorkerRecord

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


def _view(rt: Runtime, w: WorkerRecord, mb: int, now: int) -> WorkerView:
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


def _with_provisioned(rt: Runtime, recs: list[WorkerRecord], out: list[WorkerView]) -> list[WorkerView]:
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


def forget(rt: Runtime, name: str, by: str) -> None:
    """Remove worker `name` from `worker list` (an admin's `piloop worker forget`): one that is gone for good. A
    reachable worker, or one that still holds leases, is a Conflict that says what to do first; changes nothing."""
    check_name("worker", name, reserved_ok=True)
    rec = next((w for w in rt.workers.all() if w.name == name), None)  # with its alive key and its leases
    if rec is None:
        raise NotFound(f"no worker {name} (`piloop worker list`)")
    if rec.alive:
        raise Conflict(
            f"worker {name} is reachable: stop it first (`piloop token revoke {name}` refuses it at its next call)"
        )
    held = sum(len(ids) for ids in rec.leases.values())
    if held:
        raise Conflict(
            f"worker {name} holds {held} lease(s): they expire after toleration_seconds, or cancel its jobs first"
        )
    if name not in rt.disruption.forget((name,), by):
        raise Conflict(f"worker {name} took a lease meanwhile: try again once it has none")


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


def pool_facts(rt: Runtime) -> dict[str, pools.PoolFacts]:
    """Each pool's config (limits applied) and the limits that set its keys, as `pools.waiting` reads them."""
    limits = {v.key: v.reason for v in rt.limits.views()}
    pressure = rt.executor.memory_pressure_max
    return {name: pools.PoolFacts(name, cfg, limits, pressure) for name, cfg in rt.executor.pools.items()}


def pool_summary(rt: Runtime, workers: list[WorkerView]) -> list[dict[str, Any]]:
    """Each pool's workers, slots, memory, jobs, and why its queued jobs of each kind wait (`waiting`)."""
    out = []
    names = sorted(rt.executor.pools)
    counts = rt.jobs.counts(names, KINDS)
    facts = pool_facts(rt)
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
        why = {k: pools.waiting(facts[name], k, workers) for k in KINDS if row[f"{k}_queued"]}
        row["waiting"] = {k: w.text for k, w in why.items() if w is not None}
        row["waiting_codes"] = {k: w.code for k, w in why.items() if w is not None}
        out.append(row)
    return out
