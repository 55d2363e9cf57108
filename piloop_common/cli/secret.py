"""`piloop secret set|list|rm|rotate-key`: values a job names with `--secret` and gets as env; never shown back."""

from __future__ import annotations

import sys
from urllib.parse import quote

import click

from piloop_common.cli.output import emit_json, table, when
from piloop_common.envnames import check_secret_name
from piloop_common.errors import BadRequest


def _check_name(name: str) -> str:
    # as the server checks it; here too, since a `/` in a name would change the route
    return check_secret_name(name, server=True)


@click.group()
def secret() -> None:
    """Secrets for jobs: stored encrypted by the daemon; `list` shows names, never values."""


def _read_value(name: str) -> str:
    if sys.stdin.isatty():
        return click.prompt(f"value of {name}", hide_input=True, default="", show_default=False)
    raw = sys.stdin.buffer.read()
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise BadRequest(f"secret {name}: the value on stdin is not UTF-8 text") from None


@secret.command("set")
@click.argument("name")
@click.pass_obj
def secret_set(obj, name: str) -> None:
    """Set NAME to the value on stdin, as is: `printf %s "$V" | piloop secret set NAME`."""
    value = _read_value(_check_name(name))
    if not value:
        raise BadRequest(
            f'secret {name}: the value is empty; give it on stdin: printf %s "$V" | piloop secret set {name}'
        )
    with obj.api() as api:
        got = api.call("PUT", f"/v1/secrets/{quote(name, safe='')}", {"value": value})
    click.echo(f"{got['name']}: {'replaced' if got['replaced'] else 'set'}; jobs get it with --secret {got['name']}")


@secret.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def secret_list(obj, as_json: bool) -> None:
    """Each secret's name, when it was set and by whom: never its value."""
    with obj.api() as api:
        rows = api.call("GET", "/v1/secrets")
    if as_json:
        emit_json(rows)
    elif not rows:
        click.echo("no secrets")
    else:
        click.echo(
            table(
                ["name", "created", "updated", "by", "key"],
                [
                    [
                        r["name"],
                        when(r["created_ms"]),
                        when(r["updated_ms"]),
                        r["by"],
                        "ok" if r["readable"] else f"{r['key_id']}: not this server's key, set it again",
                    ]
                    for r in rows
                ],
            )
        )


@secret.command("rm")
@click.argument("name")
@click.pass_obj
def secret_rm(obj, name: str) -> None:
    """Remove NAME; jobs already submitted that name it start without it."""
    _check_name(name)
    with obj.api() as api:
        api.call("DELETE", f"/v1/secrets/{quote(name, safe='')}")
    click.echo(f"{name}: removed")


@secret.command("rotate-key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def secret_rotate_key(obj, as_json: bool) -> None:
    """Reseal every secret under a new key, which replaces `$PILOOP_HOME/secret.key`; the old key opens none."""
    with obj.api() as api:
        got = api.call("POST", "/v1/secrets/rotate-key")
    if as_json:
        emit_json(got)
        return
    click.echo(f"resealed {got['resealed']} secret{'' if got['resealed'] == 1 else 's'} under key {got['key_id']}")
    if got["left"]:
        click.echo(
            f"left {got['left']} as they were: no key of this server opens them "
            "(`piloop secret list` marks them; set them again)"
        )
