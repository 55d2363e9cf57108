"""`piloop limits`, `token`, `events` and `inbox`."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from piloop_common.cli.output import emit_json, table, value_text, when
from piloop_common.duration import parse_duration
from piloop_common.names import ROLES, check_name
from piloop_common.sdk.client import part


@click.group()
def limits() -> None:
    """Override [plugins.executor] keys while the daemon runs; a limit wins over config.toml."""


@limits.command("set")
@click.argument("assignment", metavar="KEY=VALUE")
@click.option("--reason", required=True, help="Why: shown beside the limit in `piloop status`.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def limits_set(obj, assignment: str, reason: str, as_json: bool) -> None:
    """Set a limit on a key, like executor.pools.serve.evaluations=1, until `limits unset`."""
    key, sep, value = assignment.partition("=")
    if not sep or not key.strip():
        raise click.UsageError(f"{assignment!r}: write KEY=VALUE, like executor.pools.serve.evaluations=1")
    with obj.api() as api:
        lim = api.call("POST", "/v1/limits", {"key": key.strip(), "value": value.strip(), "reason": reason})
    if as_json:
        emit_json(lim)
    else:
        click.echo(f"{lim['key']} = {value_text(lim['value'])}: the daemon applies it at once")


@limits.command("unset")
@click.argument("key")
@click.pass_obj
def limits_unset(obj, key: str) -> None:
    """Remove a limit: the key goes back to its config.toml value."""
    with obj.api() as api:
        api.call("DELETE", f"/v1/limits/{part(key)}")
    click.echo(f"{key}: the limit is gone")


@limits.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def limits_list(obj, as_json: bool) -> None:
    """The limits in force: key, value, reason, who set it and when."""
    with obj.api() as api:
        rows = api.call("GET", "/v1/limits")
    if as_json:
        emit_json(rows)
    elif not rows:
        click.echo("no limits")
    else:
        click.echo(
            table(
                ["key", "value", "reason", "by", "set"],
                [[r["key"], value_text(r["value"]), r["reason"], r["by"], when(r["at_ms"])] for r in rows],
            )
        )


@click.group()
def token() -> None:
    """Tokens, a worker's or a role's: each is shown once; piloop keeps only its hash."""


@token.command("create")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(ROLES),
    help="A person's or a program's token: viewer reads, operator also submits and cancels, admin also sets "
    "limits, tokens and secrets. Without it: a worker's token.",
)
@click.option("--pool", help="Bind the worker's token to this pool.")
@click.option("--expires", metavar="DURATION", help="Like 30d or 12h; default never.")
@click.option("--rename", is_flag=True, help="Let the worker choose its own name with --name.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def token_create(
    obj, name: str, role: str | None, pool: str | None, expires: str | None, rename: bool, as_json: bool
) -> None:
    """Create a token, a worker's or (with --role) a person's, and print it: it is shown this once."""
    check_name("token", name)  # before the call: the server says the same, but a typo needs no daemon
    if role and (pool or rename):
        raise click.UsageError("--role makes a person's token: --pool and --rename are for a worker's")
    expires_seconds = parse_duration(expires, "--expires") if expires else None
    if expires_seconds is not None and expires_seconds <= 0:
        raise click.UsageError(f"--expires {expires}: give a duration over 0, like 30d")
    body = {"name": name, "pool": pool, "rename": rename, "expires_seconds": expires_seconds, "role": role}
    with obj.api() as api:
        got = api.call("POST", "/v1/tokens", body)
    if as_json:
        emit_json(got)
    else:
        click.echo(got["token"])


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def token_list(obj, as_json: bool) -> None:
    """Every token: its name, kind, pool, state (live, expired, revoked), when made and by whom."""
    with obj.api() as api:
        rows = api.call("GET", "/v1/tokens")
    if as_json:
        emit_json(rows)
        return
    now = time.time() * 1000

    def state(r: dict[str, Any]) -> str:
        if r["revoked"]:
            return "revoked"
        if r["expires_ms"] and r["expires_ms"] < now:
            return "expired"
        return "live"

    click.echo(
        table(
            ["name", "kind", "pool", "state", "created", "expires", "by"],
            [
                [
                    r["name"],
                    r.get("role") or "worker",
                    r["pool"] or ("any" if not r.get("role") else "-"),
                    state(r),
                    when(r["created_ms"]),
                    when(r["expires_ms"]) if r["expires_ms"] else "never",
                    r["by"],
                ]
                for r in rows
            ],
        )
    )


@token.command("revoke")
@click.argument("name")
@click.pass_obj
def token_revoke(obj, name: str) -> None:
    """Revoke a token: the next call made with it is refused."""
    with obj.api() as api:
        api.call("DELETE", f"/v1/tokens/{part(name)}")
    click.echo(f"token {name}: revoked; whoever uses it is refused at their next call")


@token.command("purge")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def token_purge(obj, as_json: bool) -> None:
    """Remove the revoked tokens' records: their names are free, their tokens unknown."""
    with obj.api() as api:
        got = api.call("POST", "/v1/tokens/purge")
    if as_json:
        emit_json(got)
    elif not got["purged"]:
        click.echo("no revoked tokens")
    else:
        click.echo(f"purged {len(got['purged'])} revoked token(s): {', '.join(got['purged'])}")


def _event_line(e: dict[str, Any]) -> str:
    ms = int(e["id"].split("-")[0])
    rest = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("id", "type", "by"))
    return f"{time.strftime('%H:%M:%S', time.localtime(ms / 1000))}  {e['type']:<22} {e['by']:<20} {rest}".rstrip()


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events.")
@click.option("--last", default=50, show_default=True, help="How many recent events to show first.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def events(obj, follow: bool, last: int, as_json: bool) -> None:
    """What happened, each signed by who did it."""
    with obj.api(timeout=40) as api:
        batch = api.call("GET", "/v1/events", params={"last": last})
        after = batch[-1]["id"] if batch else "0"
        while True:
            for e in batch:
                click.echo(json.dumps(e) if as_json else _event_line(e))
            if not follow:
                return
            batch = api.call("GET", "/v1/events", params={"after": after, "block_ms": 20000, "count": 500})
            if batch:
                after = batch[-1]["id"]


@click.group(invoke_without_command=True)
@click.option("--all", "show_all", is_flag=True, help="Acknowledged ones too.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def inbox(ctx, show_all: bool, as_json: bool) -> None:
    """Escalations: what the daemon needs a person to look at."""
    if ctx.invoked_subcommand:
        return
    with ctx.obj.api() as api:
        rows = api.call("GET", "/v1/inbox", params={"all": show_all})
    if as_json:
        emit_json(rows)
    elif not rows:
        click.echo("the inbox is empty")
    else:
        click.echo(
            table(
                ["id", "when", "what", "message"], [[r["id"], when(r["at_ms"]), r["what"], r["message"]] for r in rows]
            )
        )


@inbox.command("ack")
@click.argument("ids", nargs=-1, required=True)
@click.pass_obj
def inbox_ack(obj, ids: tuple[str, ...]) -> None:
    """Acknowledge escalations by id: they leave the inbox and `piloop status`."""
    with obj.api() as api:
        for eid in ids:
            api.call("POST", f"/v1/inbox/{part(eid)}/ack")
            click.echo(f"{eid}: acknowledged")
