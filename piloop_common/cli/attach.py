"""`piloop attach JOB`: a job's log from its beginning, then live as its worker uploads it, until the job ends.

The chunks come through the API (`GET /v1/jobs/{id}/log/{n}`), so attach works wherever the API answers:
the local socket, or `--server` / `PILOOP_SERVER` (with `PILOOP_TOKEN`) from another machine.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

POLL_SECONDS = 0.5


def exit_status(job: dict[str, Any]) -> int:
    """The job's outcome as an exit status: 0 succeeded; its own exit code when it failed with one; else 1."""
    if job["state"] == "succeeded":
        return 0
    code = (job.get("result") or {}).get("exit_code")
    return code if isinstance(code, int) and 0 < code < 256 else 1


def follow(api, job_id: str, out, poll: float = POLL_SECONDS) -> dict[str, Any]:
    """Write the job's log to `out` (a binary file) as it grows; the job's view once it has ended and all of
    its log is written."""
    from piloop_common.protocol.worker import TERMINAL_STATES
    from piloop_common.sdk.client import part

    done: list[str] = []
    while True:
        job = api.call("GET", f"/v1/jobs/{part(job_id)}")
        log = job["log"]
        if log[: len(done)] != done:  # a new attempt (an evaluation queued again) ships a new log
            click.echo(f"piloop: {job_id}: a new attempt; its log from the start", err=True)
            done = []
        for n in range(len(done), len(log)):
            out.write(api.call_bytes("GET", f"/v1/jobs/{part(job_id)}/log/{n}").content)
            out.flush()
            done.append(log[n])
        if job["state"] in TERMINAL_STATES and len(done) == len(job["log"]):
            return job
        time.sleep(poll)


@click.command("attach")
@click.argument("job_id")
@click.pass_obj
def attach(obj, job_id: str) -> None:
    """Print a job's log from the start, then as it comes; exit with the job's outcome."""
    from piloop_common.cli.jobs import log_note

    with obj.api(timeout=30.0) as api:
        job = follow(api, job_id, sys.stdout.buffer)
    if note := log_note(job):
        click.echo(f"piloop: {job_id}: the log was cut: {note}", err=True)
    status = exit_status(job)
    if status:
        why = job["reason"] or job["state"]
        click.echo(f"piloop: {job_id} {job['state']}: {why}", err=True)
    sys.exit(status)
