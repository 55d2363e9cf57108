"""`piloop job`: list, show, cancel, wait (and `submit`, from submit.py)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from piloop_common.cli.output import WaitNote, emit_json, progress_done, table, when
from piloop_common.cli.submit import submit
from piloop_common.duration import parse_duration
from piloop_common.sdk.client import part

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


job.add_command(submit)


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
    for name, data in (r.get("inline_outputs") or {}).items():
        lines.append((f"output {name}", f"inline, {len(data) * 3 // 4 - data[-2:].count('=')} bytes"))
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
