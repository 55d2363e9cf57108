"""`piloop job submit`: a job's command, inputs, timing and memory policy, checked here before anything is queued."""

from __future__ import annotations

from typing import Any

import click

from piloop_common.cli.output import emit_json, parse_env
from piloop_common.duration import parse_duration

KIND = click.Choice(["evaluation", "agent"])


@click.command("submit")
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
