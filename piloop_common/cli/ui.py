"""`piloop ui`: a one-time link to the web page, like Jupyter's."""

from __future__ import annotations

import click

from piloop_common.cli.output import emit_json


@click.command()
@click.option("--json", "as_json", is_flag=True, help="The link and its lifetime as JSON.")
@click.pass_obj
def ui(obj, as_json: bool) -> None:
    """Print a link that logs a browser in to the page at /ui as this machine's user: it works once, briefly."""
    with obj.api() as api:
        got = api.call("POST", "/v1/ui/link")
    if as_json:
        emit_json(got)
        return
    click.echo(f"Open this link within {got['expires_seconds']} s; it works once:\n\n    {got['url']}\n")
