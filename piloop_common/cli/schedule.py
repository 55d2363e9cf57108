"""`piloop schedule add|list|remove`: periodic schedules, each tick's job queued once by the daemon's pass."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from piloop_common.cli.output import emit_json, table, when
from piloop_common.errors import BadRequest


@click.group()
def schedule() -> None:
    """Periodic jobs: a cron (UTC; six fields: seconds last) and the job each tick queues, once."""


def _task_spec(obj, target: str) -> tuple[dict[str, Any], Any]:
    """The spec of a no-argument call of task `module:fn`, imported from the current dir; and the task."""
    import importlib

    from piloop_common.cas.address import hash_bytes
    from piloop_common.sdk.tasks import Task

    module, _, name = target.partition(":")
    if not module or not name:
        raise click.UsageError(f"--task {target}: write module:function")
    sys.path.insert(0, str(Path.cwd()))
    try:
        fn: Any = importlib.import_module(module)
        for part in name.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
        raise click.UsageError(f"--task {target}: cannot import it from {Path.cwd()}: {e}") from None
    finally:
        sys.path.pop(0)
    if not isinstance(fn, Task):
        raise click.UsageError(f"--task {target}: not a task (make it with @task or @periodic)")
    data = fn.encode()
    address = hash_bytes(data)
    with obj.api() as api:
        api.call_bytes("PUT", f"/v1/cas/blobs/{address}", content=data)
    spec: dict[str, Any] = {"runner": "task", "argv": [fn.name], "inputs": {f"args.{fn.serializer}": address}}
    return spec, fn


@schedule.command("add")
@click.argument("name")
@click.option("--cron", help="When: five fields (minute hour day month weekday, UTC), or six with seconds last.")
@click.option("--pool", help="The pool whose workers run each tick's job (default serve, or the task's).")
@click.option("--task", "target", metavar="MODULE:FN", help="Queue this task (no arguments) instead of a command.")
@click.option("--timeout", metavar="DURATION", help="Stop each tick's job after this long, like 30m.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.argument("argv", nargs=-1, metavar="-- CMD ARGS…")
@click.pass_obj
def add(obj, name, cron, pool, target, timeout, as_json, argv) -> None:
    """Add schedule NAME: each tick of --cron queues `CMD ARGS…` (or --task MODULE:FN) once, even with two
    daemons; ticks missed while no daemon ran queue one job, not one each."""
    from piloop_common.duration import parse_duration

    if bool(target) == bool(argv):
        raise click.UsageError("give the job: `-- CMD ARGS…` or --task MODULE:FN (one of them)")
    if target:
        spec, fn = _task_spec(obj, target)
        cron = cron or getattr(fn, "cron", None)
        pool = pool or fn.pool
    else:
        spec = {"argv": list(argv)}
    if not cron:
        raise click.UsageError("--cron: when the job runs, like '*/5 * * * *' (or a task made with @periodic)")
    try:
        from piloop_common.protocol.schedule import check_cron

        check_cron(cron)
    except BadRequest as e:
        raise click.UsageError(e.message) from None
    if timeout:
        spec["timeout_seconds"] = parse_duration(timeout, "--timeout")
    body = {"name": name, "cron": cron, "job": {"pool": pool or "serve", "spec": spec}}
    with obj.api() as api:
        got = api.call("POST", "/v1/schedules", body)
    emit_json(got) if as_json else click.echo(f"{got['name']}: next at {when(got['next_ms'])}")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def listing(obj, as_json: bool) -> None:
    """Each schedule: its cron, next tick, pool and job."""
    with obj.api() as api:
        rows = api.call("GET", "/v1/schedules")
    if as_json:
        emit_json(rows)
    elif not rows:
        click.echo("no schedules")
    else:
        click.echo(
            table(
                ["name", "cron", "next", "pool", "job", "by"],
                [
                    [r["name"], r["cron"], when(r["next_ms"]), r["pool"], " ".join(r["spec"]["argv"]), r["by"]]
                    for r in rows
                ],
            )
        )


@schedule.command("remove")
@click.argument("name")
@click.pass_obj
def remove(obj, name: str) -> None:
    """Remove schedule NAME (the jobs it queued stay)."""
    from urllib.parse import quote

    with obj.api() as api:
        api.call("DELETE", f"/v1/schedules/{quote(name, safe='')}")
    click.echo(f"{name}: removed")
