"""The KEYS and ARGV of one report.lua call for a batch of reports (`LeasesState.report_many`), from what Redis
holds of each job (its kind, pool, spec and live log, read before in one pipeline): each report bounded to the log
and result caps, refused here when its result is over the report cap, or answered stale when its job is gone."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from piloop_common.bytecaps import INLINE_MAX_BYTES
from piloop_common.errors import PiloopError, TooLarge
from piloop_server.state import logcap
from piloop_server.state.keys import Keys
from piloop_server.state.logcap import Live, Sizes
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.lease import Caps, Report, RetryPolicy, Timings, stale_summary


@dataclass
class ReportBatch:
    """One report.lua call: `out` holds the answers known without it (stale, or refused here), `at` the places of
    the reports the script answers, in its order."""

    keys: list[str]
    args: list[Any]
    out: list[dict[str, Any] | PiloopError | None]
    at: list[int] = field(default_factory=list)


def batch(
    k: Keys,
    t: Timings,
    caps: Caps,
    reports: list[Report],
    got: list[Any],
    sizes: Sizes | None = None,
    memory_caps: dict[str, int | None] | None = None,
) -> ReportBatch:
    """The call for `reports`, from `got`: for each report, its job hash's kind, pool, spec, log_bytes,
    log_dropped and log_truncated, then its live log's last chunks (the pipeline's replies, in that order)."""
    rows = [got[i] for i in range(0, len(got), 2)]
    lives = [Live.of(row[3:], got[2 * i + 1]) for i, row in enumerate(rows)]
    ask = [
        a for rep, row, live in zip(reports, rows, lives, strict=True) for a in logcap.unsized(rep, row[2], live, caps)
    ]
    known = sizes(sorted(set(ask))) if sizes is not None and ask else {}
    b = ReportBatch(
        keys=[k.deadlines(), k.campaign_live(), k.events(), k.daemon(), k.campaign_pending(), k.delayed(), k.ended()],
        args=[t.max_lost, t.grace_ms, t.toleration_ms, INLINE_MAX_BYTES],
        out=[None] * len(reports),
    )
    for i, (rep, (kind_b, pool_b, spec, *_), live) in enumerate(zip(reports, rows, lives, strict=True)):
        if kind_b is None:
            # pruned by retention since it ended (or never was): the report changes nothing, and the worker
            # drops it from its spool rather than try it forever in front of the ones behind it
            b.out[i] = {"answer": "stale"}
            continue
        rep = logcap.bounded(rep, logcap.spec_of(spec), live, known, caps)
        result = rep.result.model_dump_json()
        body = len(result) - len(json.dumps(rep.result.log, separators=(",", ":")))
        if body > caps.report_bytes:
            b.out[i] = TooLarge(
                f"job {rep.job}: the report's result is {body} bytes, over the cap of "
                f"{caps.report_bytes} ([plugins.state] report_max_bytes)"
            )
            continue
        kind, pool = _s(kind_b), _s(pool_b)
        policy = RetryPolicy.of(spec, (memory_caps or {}).get(pool))
        b.at.append(i)
        b.keys += [
            k.lease(rep.job),
            k.job(rep.job),
            k.worker_leases(rep.worker, kind),
            k.active(pool, kind),
            k.queue(pool, kind),
            k.worker(rep.worker),
        ]
        b.args += [
            rep.job,
            rep.token,
            rep.worker,
            rep.outcome,
            result,
            rep.report_id,
            rep.reason,
            1 if rep.oom else 0,
            *policy.args(),
            stale_summary(rep.result, result),
            " ".join(policy.retry_on),
            " ".join(rep.error),
            rep.owner,
        ]
    return b
