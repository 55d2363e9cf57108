"""Reading and submitting jobs (the operator's side of the lease engine)."""

from __future__ import annotations

import json
import logging
import re
import secrets as _secrets
from typing import TYPE_CHECKING

from piloop_common import envnames
from piloop_common.errors import BadRequest, Conflict, NotFound, TooLarge, bad_param
from piloop_common.protocol.operator import JobView, SubmitRequest
from piloop_common.protocol.worker import JOB_ID, PIPE_PLACEHOLDER, TERMINAL_STATES, JobSpec
from piloop_server import pools, workers
from piloop_server.runtime import Runtime

if TYPE_CHECKING:
    from piloop_server.state.jobs import JobWithLog

log = logging.getLogger("piloop.jobs")


def new_id() -> str:
    return "j" + _secrets.token_hex(6)


def check_id(job_id: str) -> str:
    """`job_id` when it may name a job, else BadRequest naming it (before any key is read)."""
    if not re.fullmatch(JOB_ID, job_id):
        shown = repr(job_id) if len(job_id) <= 70 else f"{job_id[:60]!r}… ({len(job_id)} characters)"
        raise BadRequest(f"job id {shown} is refused: an id is letters, digits, _ . and -, like j0123456789ab")
    return job_id


def submit(rt: Runtime, req: SubmitRequest, by: str) -> str:
    check_submit(rt, req)
    job_id = req.id or new_id()  # a caller's own id (pattern-checked by the model): an id that exists is a conflict
    spec = req.spec.model_dump(mode="json")
    if req.spec.after:  # waits on its parents (state/dependencies.py)
        rt.dependencies.submit(job_id, req.kind, req.pool, spec, by=by, campaign=req.campaign, image=req.image)
    else:
        rt.leases.enqueue(job_id, req.kind, req.pool, spec, by=by, campaign=req.campaign, image=req.image)
    return job_id


def check_submit(rt: Runtime, req: SubmitRequest) -> None:
    """BadRequest naming what of `req` this server cannot queue: its pool, grant, secrets, inputs or code."""
    check_caps(rt, req.spec)
    if req.pool not in rt.executor.pools:
        raise bad_param("pool", req.pool, f"no such pool (pools: {', '.join(sorted(rt.executor.pools))})")
    pool = rt.executor.pools[req.pool]
    if (pool.agents if req.kind == "agent" else pool.evaluations) == 0 and pool.provisioner is None:
        # a limit may set it to 0 for a while; say so, but queue the job anyway
        pass
    cap = req.spec.memory_max_mb or pool.memory_max_mb
    if req.spec.memory_mb and cap and req.spec.memory_mb > cap:
        raise BadRequest(
            f"--memory {req.spec.memory_mb} MiB: over the cap of {cap} MiB "
            f"({'--memory-max' if req.spec.memory_max_mb else f'pool {req.pool} memory_max_mb'})"
        )
    if req.spec.secrets:
        for s in req.spec.secrets:
            envnames.check_secret_name(s)  # one that would shadow the job's environment: refused, naming the rule
        have = rt.secrets.names() if getattr(rt, "secrets", None) else set()
        missing = [s for s in req.spec.secrets if s not in have]
        if missing:
            raise bad_param(
                "secrets", missing, f"no secret named {', '.join(missing)} (`piloop secret list`)", flag="--secret"
            )
    given = [a for a in req.spec.inputs.values() if a != PIPE_PLACEHOLDER]  # a chain's: filled in at its release
    missing_inputs = sorted(set(given) - rt.store.has_many(given)) if given else []  # inline ones: no CAS lookup
    if missing_inputs:
        raise bad_param("inputs", missing_inputs, "the CAS lacks them", flag="--input")
    if req.spec.code and not rt.store.has_many([req.spec.code]):
        raise BadRequest(f"code {req.spec.code}: the CAS lacks it (push it again: `piloop task push DIR`)")


def check_caps(rt: Runtime, spec: JobSpec) -> None:
    """TooLarge naming the [plugins.state] key a job's argv, env, inputs or whole spec is over."""
    st = rt.settings.plugins.state
    for what, n, cap, key in (
        ("argv", len(spec.argv), st.job_argv_max, "job_argv_max"),
        ("env", len(spec.env), st.job_env_max, "job_env_max"),
        ("inputs", len(spec.inputs), st.job_inputs_max, "job_inputs_max"),
    ):
        if n > cap:
            raise TooLarge(f"the job's {what} has {n} entries, over the cap of {cap} ([plugins.state] {key})")
    size = len(spec.model_dump_json().encode())
    if size > st.job_spec_max_bytes:
        raise TooLarge(
            f"the job's spec is {size} bytes, over the cap of {st.job_spec_max_bytes} ([plugins.state] "
            "job_spec_max_bytes): put large data in the CAS and name it as an input"
        )


def view(rt: Runtime, job_id: str) -> JobView:
    """The job's view; NotFound, or Unreadable for a record this version cannot read (logged)."""
    check_id(job_id)
    try:
        got = rt.jobs.with_log(job_id)
        if got is None:
            raise NotFound(
                f"no job {job_id}: it never was, or it ended longer ago than [plugins.retention] finished_seconds "
                "(failed_seconds for a failed one) and was removed (see `piloop job list`)"
            )
        return _view(got)
    except (ValueError, TypeError, KeyError) as e:  # pydantic's ValidationError and a bad UTF-8 are ValueErrors
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        log.warning("event=record.skipped record=job job=%s error=%s", job_id, why)
        raise Unreadable(
            f"job {job_id}'s record cannot be read ({why}): listings skip it; `piloop job cancel {job_id}` ends it"
        ) from None


class Unreadable(Conflict):
    """A job's record that an older version wrote and this one cannot read: listings skip it, saying so."""

    code = "unreadable"


def _view(got: JobWithLog) -> JobView:
    """ValueError, TypeError or KeyError for a record that cannot be read."""
    j = got.job
    result = j.result_dict()
    return JobView(
        id=j.id,
        kind=j.kind,
        pool=j.pool,
        campaign=j.campaign,
        image=j.image,
        state=j.state,
        attempts=j.attempts,
        lost=j.lost,
        worker=j.worker,
        token=j.token.partition(".")[0],
        created_ms=j.created,
        updated_ms=j.updated,
        started_ms=j.started or j.leased,  # a job that ended before a heartbeat said `running`: its lease
        finished_ms=j.ended if j.state in TERMINAL_STATES else 0,
        reason=j.reason,
        spec=j.spec_dict(),
        result=result,
        log=result.get("log") or got.log,
        log_dropped=int(result.get("log_dropped") or 0) if result.get("log") else j.log_dropped,
        log_truncated=int(result.get("log_truncated") or 0) if result.get("log") else j.log_truncated,
        progress=[json.loads(n) for n in got.progress],
        memory_mb=j.grant_mb,
        retry_ms=j.retry_at,
        not_before_ms=j.not_before,
        expires_ms=j.expires if j.state == "queued" else 0,
    )


def waiting(rt: Runtime, v: JobView) -> str:
    """Why queued job `v` has no lease, where the workers of its pool tell (`pools.waiting`): none is live (and no
    provisioner starts one), none runs its image, its grant is larger than every one's room, or each one's load,
    memory or slots keep it. Empty when one could take it, or the job waits out a backoff or a countdown. It stays
    queued either way: a worker may come."""
    if v.state == "waiting":
        return f"it waits until {', '.join(v.spec.get('after') or [])} succeeded (--after, a chain)"
    if v.state != "queued" or v.retry_ms or v.not_before_ms:
        return ""
    facts = workers.pool_facts(rt).get(v.pool)
    if facts is None:
        return f"pool {v.pool} is gone from the server's config"
    grant = v.memory_mb or int(v.spec.get("memory_mb") or 0) or facts.config.memory_mb or 0
    why = pools.waiting(facts, v.kind, workers.views(rt), image=v.image, grant_mb=grant)
    return why.text if why is not None else ""


def listing(rt: Runtime, state: str | None, pool: str | None, limit: int = 200) -> tuple[list[JobView], int]:
    """The newest jobs (of `state`, of `pool`), and how many records were skipped as unreadable (each one logged)."""
    ids = rt.jobs.newest(max(limit * 5, 1000))
    out: list[JobView] = []
    skipped = 0
    for jid in ids:
        try:
            v = view(rt, jid)
        except NotFound:
            continue
        except Unreadable:
            skipped += 1
            continue
        if (state and v.state != state) or (pool and v.pool != pool):
            continue
        out.append(v)
        if len(out) >= limit:
            break
    return out, skipped
