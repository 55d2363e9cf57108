"""`piloop job`: submit, list, show, cancel, wait."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from piloop_common.cli.output import WaitNote, emit_json, parse_env, progress_done, table, when
from piloop_common.duration import parse_duration
from piloop_common.sdk.client import part

KIND = click.Choice(["evaluation", "agent"])
# protocol.JobState's (a unit test holds them equal): the CLI does not import the protocol's models to start
JOB_STATES = (
    "waiting",
    "queued",
    "leased",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "lost",
    "worker_lost",
    "expired",
)


@click.group()
def job() -> None:
    """Jobs: agent sessions and evaluations."""


@job.command("submit")
@click.option(
    "--kind",
    type=KIND,
    default="evaluation",
    show_default=True,
    help="An evaluation, or an agent session: each kind has its own slots.",
)
@click.option("--pool", default="serve", show_default=True, help="The pool whose workers run it.")
@click.option("--campaign", default="", help="The campaign it counts for, if any.")
@click.option("--image", default="", help="Only a worker with this image runs it.")
@click.option("--secret", "secrets", multiple=True, metavar="NAME", help="A secret the job gets as env.")
@click.option("--env", "envs", multiple=True, metavar="K=V", help="An environment variable of the job.")
@click.option("--input", "inputs", multiple=True, metavar="PATH", help="A file put in the CAS and given to the job.")
@click.option("--timeout", metavar="DURATION", help="Stop the job after this long, like 30m.")
@click.option(
    "--memory",
    metavar="SIZE",
    help="The job's memory grant, like 4G or 512M: its limit, and what a "
    "worker must have room for (default: the pool's memory_mb).",
)
@click.option("--memory-mb", type=int, hidden=True, help="The grant in MiB (older spelling of --memory).")
@click.option(
    "--memory-growth",
    type=float,
    metavar="X",
    help="After running out of memory, the next attempt gets X times the grant (default 1.5; 1: never).",
)
@click.option(
    "--memory-max",
    metavar="SIZE",
    help="The most a raised grant may reach (default: the pool's cap, else the worker's room).",
)
@click.option("--max-attempts", type=int, metavar="N", help="Failed attempts before the job ends failed (default 1).")
@click.option(
    "--backoff",
    metavar="DURATION",
    help="The wait before a failed job's next attempt (default 10s), doubling each time.",
)
@click.option(
    "--code",
    metavar="ADDRESS",
    help="A code snapshot (`piloop task push DIR`) the worker puts first on the job's PYTHONPATH.",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    metavar="N",
    help="0 to 9, 9 first: claims take a higher one first within its pool and kind (default 0).",
)
@click.option("--countdown", metavar="DURATION", help="Not claimable until this long after it is queued, like 10m.")
@click.option("--expires", metavar="DURATION", help="Not started within this long of being queued: it ends expired.")
@click.option(
    "--after",
    "after",
    multiple=True,
    metavar="JOB",
    help="Queue it only once this job has succeeded (repeatable); a parent's failure ends it cancelled.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.argument("argv", nargs=-1, required=True, metavar="-- CMD ARGS…")
@click.pass_obj
def submit(
    obj,
    kind,
    pool,
    campaign,
    image,
    secrets,
    envs,
    inputs,
    timeout,
    memory,
    memory_mb,
    memory_growth,
    memory_max,
    max_attempts,
    backoff,
    code,
    priority,
    countdown,
    expires,
    after,
    as_json,
    argv,
) -> None:
    """Queue a job; print its id. Inside a campaign's agent, `piloop job submit REV` queues its campaign's
    evaluation of that commit, and takes no other flag (piloop_common/cli/relay.py)."""
    policy = _policy(memory, memory_mb, memory_growth, memory_max, max_attempts, backoff)  # refuse bad flags first
    if code is not None:
        from piloop_common.cas.address import parse_address
        from piloop_common.errors import BadAddress

        try:
            policy["code"] = parse_address(code)
        except BadAddress as e:
            raise click.UsageError(f"--code: {e.message} (`piloop task push DIR` prints one)") from None
    policy |= _timing(priority, countdown, expires)
    env = parse_env(envs)
    input_addrs = _put_inputs(obj, inputs) if inputs else {}
    spec = {
        "argv": list(argv),
        "env": env,
        "secrets": list(secrets),
        "inputs": input_addrs,
        "timeout_seconds": parse_duration(timeout, "--timeout") if timeout else None,
        **policy,
    }
    if after:
        spec["after"] = list(dict.fromkeys(after))
    body = {"kind": kind, "pool": pool, "campaign": campaign, "image": image, "spec": spec}
    with obj.api() as api:
        got = api.call("POST", "/v1/jobs", body)
    emit_json(got) if as_json else click.echo(got["job"])


def _put_inputs(obj, inputs: tuple[str, ...]) -> dict[str, str]:
    """Each --input file's address: put in the local CAS, or with --server in the server's (`PUT /v1/cas/blobs`)."""
    from pathlib import Path

    paths = [Path(p) for p in inputs]
    for path in paths:
        if not path.is_file():
            raise click.UsageError(f"--input {path}: no such file")
    if obj.remote:
        from piloop_common.cas.address import hash_bytes

        out = {}
        with obj.api(timeout=600) as api:
            for path in paths:
                data = path.read_bytes()
                out[path.name] = address = hash_bytes(data)
                api.call_bytes("PUT", f"/v1/cas/blobs/{address}", content=data)
        return out
    from piloop_common.cas import open_store

    store = open_store(obj.settings.plugins.cas, obj.home)
    return {path.name: store.put_file(path) for path in paths}


def _timing(priority, countdown, expires) -> dict[str, Any]:
    """The spec's priority, countdown and expiry from the flags (taskoptions checks them as the Python API does)."""
    from piloop_common.errors import BadRequest
    from piloop_common.sdk.taskoptions import TaskOptions

    try:
        return TaskOptions(
            priority=priority,
            countdown=parse_duration(countdown, "--countdown") if countdown else None,
            expires=parse_duration(expires, "--expires") if expires else None,
        ).timing()
    except BadRequest as e:
        raise click.UsageError(e.message) from None
    except ValueError as e:
        raise click.UsageError(f"{'--expires' if 'expires' in str(e) else '--countdown'}: {e}") from None


def _policy(memory, memory_mb, growth, memory_max, max_attempts, backoff) -> dict[str, Any]:
    """The spec's memory and retry fields from the flags; a bad one is a usage error naming it."""
    from piloop_common.sizes import parse_memory

    if memory is not None and memory_mb is not None:
        raise click.UsageError("--memory and --memory-mb: give one")
    out: dict[str, Any] = {"memory_mb": parse_memory(memory, "--memory") if memory is not None else memory_mb}
    if out["memory_mb"] is not None and out["memory_mb"] <= 0:
        raise click.UsageError(f"--memory-mb {memory_mb}: a memory size must be more than 0")
    if memory_max is not None:
        out["memory_max_mb"] = parse_memory(memory_max, "--memory-max")
        if out["memory_mb"] and out["memory_max_mb"] < out["memory_mb"]:
            raise click.UsageError(f"--memory-max {memory_max}: below --memory ({out['memory_mb']} MiB)")
    if growth is not None:
        if not 1 <= growth <= 10:
            raise click.UsageError(f"--memory-growth {growth:g}: give a factor from 1 (never raise) to 10")
        out["memory_growth"] = growth
    if max_attempts is not None:
        if not 1 <= max_attempts <= 100:
            raise click.UsageError(f"--max-attempts {max_attempts}: give 1 to 100")
        out["max_attempts"] = max_attempts
    if backoff is not None:
        out["backoff_seconds"] = parse_duration(backoff, "--backoff")
        if not 0 <= out["backoff_seconds"] <= 86400:
            raise click.UsageError(f"--backoff {backoff}: give 0s to 1d")
    return out


@job.command("list")
@click.option("--state", type=click.Choice(JOB_STATES), help="Only jobs in this state.")
@click.option("--pool", help="Only jobs of this pool.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 5000), help="The newest this many.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def listing(obj, state, pool, limit, as_json) -> None:
    """The newest jobs, newest first."""
    with obj.api() as api:
        rows = api.call(
            "GET", "/v1/jobs", params={k: v for k, v in {"state": state, "pool": pool, "limit": limit}.items() if v}
        )
    if as_json:
        emit_json(rows)
        return
    click.echo(
        table(
            ["job", "kind", "pool", "state", "attempts", "worker", "created", "command"],
            [
                [
                    j["id"],
                    j["kind"],
                    j["pool"],
                    _state(j),
                    j["attempts"],
                    j["worker"] or "-",
                    when(j["created_ms"]),
                    " ".join(j["spec"].get("argv", []))[:40],
                ]
                for j in rows
            ],
        )
    )


@job.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(obj, job_id, as_json) -> None:
    """A job: its state, times, worker, result, memory, log and outputs."""
    with obj.api() as api:
        j = api.call("GET", f"/v1/jobs/{part(job_id)}")
    if as_json:
        emit_json(j)
        return
    r = j["result"]
    usage = r.get("usage") or {}
    lines = [
        ("job", j["id"]),
        ("kind", j["kind"]),
        ("pool", j["pool"]),
        ("state", j["state"]),
        ("attempts", j["attempts"]),
        ("lost", j["lost"]),
        ("worker", j["worker"] or "-"),
        ("token", j["token"] or "-"),
        ("command", " ".join(j["spec"].get("argv", []))),
        ("created", stamp(j.get("created_ms"))),
        ("started", stamp(j.get("started_ms"))),
        ("finished", stamp(j.get("finished_ms"))),
        ("updated", stamp(j.get("updated_ms"))),
        ("ran", f"{r['duration_seconds']:.1f} s" if r.get("duration_seconds") else "-"),
        ("exit", r.get("exit_code") if r else "-"),
        ("signal", r.get("signal") or "-"),
        ("peak memory", f"{usage.get('peak_rss_bytes', 0) / 2**20:.1f} MiB" if usage else "-"),
        ("cpu", f"{usage.get('cpu_seconds', 0):.2f} s" if usage else "-"),
        ("memory", _grant(j)),
        ("reason", j["reason"] or "-"),
        ("log", ", ".join(j["log"]) or "-"),
    ]
    if j.get("retry_ms"):
        lines.insert(-2, ("retry at", when(j["retry_ms"])))
    for key, label in (("not_before_ms", "not before"), ("expires_ms", "expires")):
        if j.get(key):
            lines.insert(4, (label, stamp(j[key])))  # under its state: what it waits for
    if j["spec"].get("priority"):
        lines.insert(4, ("priority", f"{j['spec']['priority']} (of 0-9, 9 first)"))
    if j.get("waiting"):
        lines.insert(4, ("waiting", j["waiting"]))  # under its state
    if note := log_note(j):
        lines.append(("log cut", note))
    for name, addr in (r.get("outputs") or {}).items():
        lines.append((f"output {name}", addr))
    for n in j.get("progress") or []:
        lines.append(("progress", f"{when(n.get('at_ms'))}  {n.get('note', '')}"))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        click.echo(f"{k.ljust(width)}  {v}")


def _state(j: dict[str, Any]) -> str:
    """`job list`'s state: a queued job waiting out a countdown says until when, one with a priority says it."""
    out = j["state"]
    if j.get("not_before_ms"):
        out += f" (not before {stamp(j['not_before_ms'])})"
    if j["state"] == "queued" and j["spec"].get("priority"):
        out += f" p{j['spec']['priority']}"
    return out


def stamp(ms: int | None) -> str:
    """A time to the second, local, with its zone: `job show`'s created and updated."""
    if not ms:
        return "-"
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def log_note(j: dict[str, Any]) -> str:
    """Where a job's log was cut, naming the cap; '' for a whole log."""
    out = []
    if j.get("log_truncated"):
        out.append(f"truncated at {j['log_truncated']} bytes ([plugins.state] log_max_bytes)")
    if j.get("log_dropped"):
        out.append(f"{j['log_dropped']} chunk(s) past the cap not kept")
    return "; ".join(out)


def _grant(j: dict[str, Any]) -> str:
    from piloop_common.sizes import format_memory

    spec = j["spec"]
    grant = j.get("memory_mb") or spec.get("memory_mb")
    return format_memory(grant) if grant else "no grant (limited to its worker's room)"


@job.command("cancel")
@click.argument("job_id")
@click.pass_obj
def cancel(obj, job_id) -> None:
    """Cancel a job: at once when queued, at its worker's next heartbeat when running."""
    with obj.api() as api:
        got = api.call("POST", f"/v1/jobs/{part(job_id)}/cancel")
    click.echo(f"{job_id}: {got['state']}")


@job.command("wait")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--timeout", metavar="DURATION", help="Give up after this long (exit 124).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def wait(obj, job_ids, timeout, as_json) -> None:
    """Wait for jobs to end, and print each one's state, exit code and reason.

    \b
    Exit status:
      0    every job succeeded
      1    a job ended otherwise (failed, cancelled, lost, worker_lost, expired)
      124  --timeout passed first
      other  as every piloop command: 2 a usage or config error, 1 an error such as an unknown job id
    """
    from piloop_common.protocol.worker import TERMINAL_STATES

    limit = parse_duration(timeout, "--timeout") if timeout else None
    started = time.monotonic()
    done: dict[str, dict[str, Any]] = {}
    note = WaitNote()
    with obj.api() as api:
        while len(done) < len(job_ids):
            states, why = {}, []
            for jid in job_ids:
                if jid in done:
                    continue
                j = api.call("GET", f"/v1/jobs/{part(jid)}")
                states[jid] = j["state"]
                if j["state"] in TERMINAL_STATES:
                    done[jid] = j
                elif j.get("waiting") and j["waiting"] not in why:
                    why.append(j["waiting"])
            if len(done) == len(job_ids):
                break
            waited = time.monotonic() - started
            if limit is not None and waited > limit:
                progress_done()
                click.echo(f"piloop: gave up after {limit:g}s", err=True)
                sys.exit(124)
            summary = ", ".join(f"{k} {v}" for k, v in states.items())
            note.show(f"waiting {waited:.0f}s: {len(done)}/{len(job_ids)} done; {summary}"[:200], "; ".join(why))
            time.sleep(0.2)
    progress_done()
    if as_json:
        emit_json(list(done.values()))
    else:
        for jid in job_ids:
            j = done[jid]
            code = (j["result"] or {}).get("exit_code")
            click.echo(
                f"{jid}  {j['state']}"
                + (f"  exit {code}" if code is not None else "")
                + (f"  {j['reason']}" if j["reason"] else "")
            )
    sys.exit(0 if all(j["state"] == "succeeded" for j in done.values()) else 1)
