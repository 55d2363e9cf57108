"""`piloop worker` runs a worker; `piloop worker list` shows them all."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from piloop_common.cli.output import ago, emit_json, table
from piloop_common.sdk.client import part


@click.group(invoke_without_command=True)
@click.option(
    "--server",
    metavar="URL",
    multiple=True,
    help="The server to work for, like https://piloop.example.com:8443; several (repeated, or URL1,URL2): the next "
    "when one cannot be reached.",
)
@click.option("--socket", type=click.Path(path_type=Path), hidden=True, help="The daemon's socket (its own worker).")
@click.option("--pool", help="The pool this worker serves.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the token from the first line of this file (else PILOOP_HTTPS_TOKEN).",
)
@click.option("--name", help="The worker's name, where its token allows one (else the token's name).")
@click.option(
    "--image", envvar="PILOOP_IMAGE", default="", help="This worker's image; jobs for another are given back."
)
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where job directories go (default $PILOOP_HOME/work/<worker>).",
)
@click.option(
    "--tasks-path",
    "tasks_path",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A dir to import Python tasks' modules from, first on the path (repeat for more; default: the config's "
    "[plugins.tasks] path, else the dir the worker starts in).",
)
@click.option(
    "--task-processes",
    type=click.Choice(["warm", "fresh"]),
    help="warm: Python tasks run one after another in long-lived processes with their modules imported; fresh: a "
    "process forked for each task (default: the config's [plugins.tasks] processes, warm).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="PILOOP_LOG_FORMAT",
    help="text (event=… key=value lines) or json (one object a line); default: the config's log_format.",
)
@click.option("--max-runs", "max_runs", hidden=True, callback=lambda c, p, v: _not_a_flag("--max-runs", v))
@click.option("--poll-seconds", "poll_seconds", hidden=True, callback=lambda c, p, v: _not_a_flag("--poll-seconds", v))
@click.pass_context
def worker(
    ctx,
    server,
    socket,
    pool,
    token_file,
    name,
    image,
    workdir,
    tasks_path,
    task_processes,
    log_format,
    max_runs,
    poll_seconds,
) -> None:
    """Run a worker: it calls the server, and the server never calls it."""
    if ctx.invoked_subcommand:
        return
    server = ",".join(server) or None  # each --server may itself be URL1,URL2
    if not pool:
        raise click.UsageError("--pool: name the pool this worker serves")
    if not server and not socket:
        raise click.UsageError("--server: give the server's URL, like https://piloop.example.com:8443")
    token = None
    if token_file:
        try:
            token = token_file.read_text().splitlines()[0].strip() if token_file.read_text().strip() else ""
        except OSError as e:
            raise click.UsageError(f"--token-file {token_file}: {e.strerror}") from e
        if not token:
            raise click.UsageError(f"--token-file {token_file}: the file is empty")
    else:
        token = os.environ.get("PILOOP_HTTPS_TOKEN") or None
    # no token is checked here: on the proxy network a worker presents PILOOP_WORKER_CREDENTIAL (run_worker says)
    from piloop_worker.main import run_worker

    sys.exit(
        run_worker(
            server=server,
            socket=socket,
            pool=pool,
            token=token,
            token_file=token_file,
            name=name,
            image=image,
            dir=workdir,
            home=ctx.obj.home,
            log_format=log_format,
            tasks_path=list(tasks_path),
            task_processes=task_processes,
        )
    )


# orca's worker flags (the 004 spec), and where piloop keeps each: on the server, one value for a pool or all
ELSEWHERE = {
    "--max-runs": "a worker's slots are its pool's, set on the server: `evaluations = N` in "
    "[plugins.executor.pools.<pool>], or `piloop limits set executor.pools.<pool>.evaluations=N` (docs/worker.md)",
    "--poll-seconds": "the heartbeat period is the server's renew_seconds in [plugins.executor], which every worker "
    "and the lease engine's expiry agree on (docs/worker.md)",
}


def _not_a_flag(flag: str, value: object) -> None:
    """A usage error that says where a flag of orca's worker lives in piloop, when one is given."""
    if value is not None:
        raise click.UsageError(f"{flag}: {ELSEWHERE[flag]}")


@worker.command("check")
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The worker's --dir (default: each worker's under $PILOOP_HOME/work).",
)
@click.pass_obj
def worker_check(obj, workdir: Path | None) -> None:
    """Exit 0 if the worker here is healthy: running, its last heartbeat acknowledged within the server's
    grace_seconds (a container's health check: it asks the worker's own record, not the server)."""
    from piloop_common.host import health

    dirs = [workdir] if workdir else sorted(p.parent for p in (obj.home / "work").glob(f"*/{health.FILE}"))
    if not dirs:
        click.echo(f"piloop: no worker has heartbeated here yet (no {obj.home / 'work'}/*/{health.FILE})", err=True)
        sys.exit(1)
    verdicts = [health.verdict(d) for d in dirs]
    for ok, line in verdicts:
        click.echo(f"piloop: {line}", err=not ok)
    sys.exit(0 if all(ok for ok, _ in verdicts) else 1)


@worker.command("forget")
@click.argument("name")
@click.pass_obj
def worker_forget(obj, name: str) -> None:
    """Remove a worker that is gone for good from `worker list` (admin): not one that is reachable or holds leases.

    A worker whose token was revoked, or that departed (drained and stopped), leaves the list by itself
    grace_seconds after its last heartbeat; any other silent one without leases after 2 x toleration_seconds."""
    with obj.api() as api:
        api.call("DELETE", f"/v1/workers/{part(name)}")
    click.echo(f"worker {name}: forgotten")


@worker.command("list")
@click.option(
    "--wide", is_flag=True, help="Also each worker's host, its room (the memory it can grant) and what it has granted."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def worker_list(obj, wide: bool, as_json: bool) -> None:
    """Each worker, its host's load, memory and disk, its slots in use, and why it got no lease (--wide: its host)."""
    with obj.api() as api:
        rows = api.call("GET", "/v1/workers")
    if as_json:
        emit_json(rows)
        return
    out = []
    for w in rows:
        s = w["sample"]
        load = f"{s['load1']:.1f}/{s['cpus']}" if s else "-"
        mem = f"{s['memory_available_gb']:.1f} GB" if s else "-"
        disk = f"{s['disk_free_gb']:.1f} GB" if s else "-"
        out.append(
            [
                w["name"],
                w["pool"],
                ago(w["seen_seconds"]),
                load,
                mem,
                disk,
                w["agents"],
                w["evaluations"],
                w["no_lease"],
            ]
        )
        if wide:
            from piloop_common.sizes import format_memory

            granted = w.get("granted_mb") or 0
            out[-1] += [
                w.get("host") or "-",
                format_memory(w.get("room_mb")),
                format_memory(granted) if granted else "0",
            ]
    # the default columns are the spec's, word for word; the host and memory grants are the --wide columns
    click.echo(
        table(
            ["worker", "pool", "seen", "load", "memory", "disk", "agents", "evaluations", "no lease"]
            + (["host", "room", "granted"] if wide else []),
            out,
        )
    )
