"""`piloop cas`: put, get and check blobs in the configured store, and serve it over HTTP."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from piloop_common.cas.base import Store


@click.group("cas")
def cas() -> None:
    """The content-addressed store of `[plugins.cas]`: blobs by `sha256:` address."""


@cas.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def put(ctx: click.Context, file: Path, as_json: bool) -> None:
    """Store FILE (`-` for stdin) and print its address."""
    with _errors(), _store(ctx) as store:
        if str(file) == "-":
            address = store.put_stream(sys.stdin.buffer)
        else:
            try:
                address = store.put_file(file)
            except OSError as e:
                raise click.ClickException(f"cannot read {file}: {e.strerror}") from e
        size = store.size(address)
    click.echo(json.dumps({"address": address, "size": size}) if as_json else address)


@cas.command()
@click.argument("address")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file.")
@click.pass_context
def get(ctx: click.Context, address: str, output: Path | None) -> None:
    """Write the blob at ADDRESS to stdout, or to a file that appears only once verified."""
    with _errors(), _store(ctx) as store:
        if output is not None:
            store.get_file(address, output)
        else:
            out = sys.stdout.buffer
            store.get_to(address, out)
            out.flush()


@cas.command()
@click.argument("addresses", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def has(ctx: click.Context, addresses: tuple[str, ...], as_json: bool) -> None:
    """Say which ADDRESSES the store holds; exit 1 if any is missing."""
    with _errors(), _store(ctx) as store:
        present = store.has_many(addresses)
    rows = [(a, "present" if a in present else "missing") for a in dict.fromkeys(addresses)]
    if as_json:
        click.echo(json.dumps([{"address": a, "present": s == "present"} for a, s in rows]))
    else:
        width = max(len(a) for a, _ in rows)
        for a, state in rows:
            click.echo(f"{a:<{width}}  {state}")
    if len(present) < len(rows):
        ctx.exit(1)


@cas.command()
@click.option("--listen", default="127.0.0.1:7701", show_default=True, help="HOST:PORT to serve on.")
@click.pass_context
def serve(ctx: click.Context, listen: str) -> None:
    """Serve `[plugins.cas]` over HTTP to workers, until stopped: any live piloop token reads and writes."""
    from piloop_common.listen import check_listen, uvicorn_tls

    with _errors():
        settings = ctx.obj.settings
        host, port = check_listen(settings, listen)
        ssl = uvicorn_tls(settings)
        import uvicorn

        from piloop_common.cas.factory import open_store
        from piloop_server.cas_app import create_cas_app
        from piloop_server.tokens import open_verifier

        store = open_store(settings.plugins.cas, ctx.obj.home)
        net = settings.plugins.network
        app = create_cas_app(
            store, open_verifier(settings, ctx.obj.home), max_put_mb=net.cas_max_put_mb, max_body_mb=net.max_body_mb
        )
        scheme = "https" if ssl else "http"
        click.echo(f"serving the CAS {store.where} at {scheme}://{listen}", err=True)
        try:
            uvicorn.run(app, host=host, port=port, log_level="warning", **ssl)
        finally:
            store.close()


@contextmanager
def _store(ctx: click.Context) -> Iterator[Store]:
    from piloop_common.cas.factory import open_store

    store = open_store(ctx.obj.settings.plugins.cas, ctx.obj.home)
    try:
        yield store
    finally:
        store.close()


class _ConfigMistake(click.ClickException):
    """A config or flag mistake: one line and exit 2, as the root group says a ConfigError (a UsageError would
    print the usage too)."""

    exit_code = 2


@contextmanager
def _errors() -> Iterator[None]:
    """piloop's errors as one line on stderr and exit 1 (2 for config), never a traceback."""
    from piloop_common.errors import ConfigError, PiloopError

    try:
        yield
    except ConfigError as e:
        raise _ConfigMistake(e.message) from e
    except PiloopError as e:
        raise click.ClickException(e.message) from e
