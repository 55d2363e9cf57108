"""The operator's view of workers and pools."""

from __future__ import annotations

import json
from typing import Any

from piloop_common.protocol import HostSample, WorkerView
from piloop_server import pools
from piloop_server.provisioner.manager import records as provisioned_records
from piloop_server.runtime import Runtime
from piloop_server.state.leases import KINDS


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


def now_ms(rt: Runtime) -> int:
    sec, usec = rt.redis.time()
    return sec * 1000 + usec // 1000


def views(rt: Runtime) -> list[WorkerView]:
    names = sorted(_s(n) for n in rt.redis.smembers(rt.keys.workers()))
    pipe = rt.redis.pipeline(transaction=False)
    for n in names:
        pipe.hgetall(rt.keys.worker(n))
        pipe.exists(rt.keys.worker_alive(n))
        for kind in KINDS:
            pipe.smembers(rt.keys.worker_leases(n, kind))
    got = pipe.execute()
    granted = _granted(rt, [set(got[4 * i + 2]) | set(got[4 * i + 3]) for i in range(len(names))])
    now = now_ms(rt)
    out = []
    for i, n in enumerate(names):
        h, alive, agents, evals = got[4 * i], got[4 * i + 1], len(got[4 * i + 2]), len(got[4 * i + 3])
        f = {_s(k): _s(v) for k, v in h.items()}
        if not f:
            continue
        raw = json.loads(f["sample"]) if f.get("sample") else None
        sample = HostSample.model_validate({k: v for k, v in raw.items() if k != "admission"}) if raw else None
        pool = rt.executor.pools.get(f.get("pool", ""))
        draining = f.get("draining") == "1"
        if not alive:
            reason = "unreachable"
        elif draining:
            reason = "draining"
        elif pool is None:
            reason = "pool"
        else:
            reason = pools.host_reason(pool, sample, (raw or {}).get("admission", ""))
            if not reason and agents >= pool.agents and evals >= pool.evaluations:
                reason = "slots"
            reason = reason or f.get("reason") or "nothing"
        seen = int(f.get("seen") or 0)
        out.append(WorkerView(name=n, pool=f.get("pool", ""), image=f.get("image", ""),
                              seen_seconds=max(0.0, (now - seen) / 1000) if seen else None, reachable=bool(alive),
                              draining=draining, sample=sample, agents=agents, evaluations=evals, no_lease=reason,
                              room_mb=int(f["room_mb"]) if f.get("room_mb") else None, granted_mb=granted[i]))
    # a worker the server started shows from its start, before it registers
    for n, rec in provisioned_records(rt).items():
        if n not in names and rec.state in ("starting", "stopping"):
            out.append(WorkerView(name=n, pool=rec.pool, image="", seen_seconds=None, reachable=False,
                                  draining=False, sample=None, agents=0, evaluations=0, no_lease=rec.state))
    return sorted(out, key=lambda w: w.name)


def _granted(rt: Runtime, leases: list[set[bytes]]) -> list[int]:
    """Each worker's granted memory (MiB): the grants of the jobs it holds leases on, as claim.lua sums them."""
    pipe = rt.redis.pipeline(transaction=False)
    for ids in leases:
        for j in ids:
            pipe.hget(rt.keys.job(_s(j)), "granted_mb")
    got = iter(pipe.execute())
    return [sum(int(_s(next(got)) or 0) for _ in ids) for ids in leases]


def pool_summary(rt: Runtime, workers: list[WorkerView]) -> list[dict[str, Any]]:
    out = []
    pipe = rt.redis.pipeline(transaction=False)
    names = sorted(rt.executor.pools)
    for name in names:
        for kind in KINDS:
            pipe.zcard(rt.keys.queue(name, kind))
            pipe.scard(rt.keys.active(name, kind))
    counts = pipe.execute()
    for i, name in enumerate(names):
        pool = rt.executor.pools[name]
        mine = [w for w in workers if w.pool == name]
        usable = [w for w in mine if w.reachable and not w.draining and not pools.host_reason(pool, w.sample)]
        row: dict[str, Any] = {"pool": name, "workers": len(mine), "reachable": sum(w.reachable for w in mine),
                               "room_mb": sum(w.room_mb or 0 for w in mine if w.reachable),
                               "granted_mb": sum(w.granted_mb for w in mine if w.reachable)}
        for j, kind in enumerate(KINDS):
            per = pools.slots(pool, kind)
            used = sum(w.agents if kind == "agent" else w.evaluations for w in usable)
            row[f"{kind}_slots"] = per * len(usable)
            row[f"{kind}_free"] = max(0, per * len(usable) - used)
            row[f"{kind}_queued"] = counts[4 * i + 2 * j]
            row[f"{kind}_running"] = counts[4 * i + 2 * j + 1]
        out.append(row)
    return out
