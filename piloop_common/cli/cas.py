"""`piloop cas`: put, get and check blobs in the configured store, serve it over HTTP, and collect its garbage."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from piloop_common.extras import need_server

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
@click.option("--dry-run", is_flag=True, help="Count what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def gc(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Remove the blobs that nothing in Redis names and that were put longer ago than
    `[plugins.retention] cas_grace_seconds`; print the blobs and bytes kept and removed.

    Runs here, with this config.toml's Redis and CAS (the daemon's): the daemon need not be up, its Redis must.
    A second collection while one sweeps says so and exits 0."""
    from piloop_common.cli.output import emit_json, table

    need_server("piloop cas gc")
    with _errors():
        from piloop_server.cas_gc import collect
        from piloop_server.state.connection import connect
        from piloop_server.state.keys import Keys

        settings = ctx.obj.settings
        client = connect(settings, ctx.obj.home, start_embedded=False)
        try:
            with _store(ctx) as store:
                report = collect(
                    store,
                    client,
                    Keys(settings.namespace),
                    grace_seconds=settings.plugins.retention.cas_grace_seconds,
                    dry_run=dry_run,
                )
        finally:
            client.close()
    if as_json:
        emit_json(report.to_json())
        return
    if report.skipped:
        click.echo(report.skipped)
        return
    removed = "to remove" if dry_run else "removed"
    tallies = [
        ("referenced", report.referenced),
        ("young", report.young),
        ("kept", report.kept),
        (removed, report.removed),
    ]
    # numbers right-aligned, as wide as their column's header or widest figure
    wb = max(len("blobs"), *(len(str(t.blobs)) for _, t in tallies))
    wn = max(len("bytes"), *(len(str(t.bytes)) for _, t in tallies))
    rows = [[name, f"{t.blobs:>{wb}}", f"{t.bytes:>{wn}}"] for name, t in tallies]
    click.echo(table(["", "blobs".rjust(wb), "bytes".rjust(wn)], rows))
    if report.missing:
        click.echo(f"{report.missing} addresses named in Redis are not in the store")
    if dry_run:
        click.echo("dry run: nothing was removed")


@cas.command()
@click.option("--listen", default="127.0.0.1:7701", show_default=True, help="HOST:PORT to serve on.")
@click.pass_context
def serve(ctx: click.Context, listen: str) -> None:
    """Serve `[plugins.cas]` over HTTP to workers, until stopped: any live piloop token reads and writes."""
    from piloop_common.listen import check_listen, uvicorn_tls

    need_server("piloop cas serve")
    with _errors():
        settings = ctx.obj.settings
        host, port = check_listen(settings, listen)
        ssl = uvicorn_tls(settings)
        import uvicorn

        from piloop_common.cas.factory import open_store
        from piloop_server.cas_app import create_cas_app
        from piloop_server.tokens import open_namer

        store = open_store(settings.plugins.cas, ctx.obj.home)
        net = settings.plugins.network
        name_of = open_namer(settings, ctx.obj.home)
        operators = frozenset(net.cas_operators)
        app = create_cas_app(
            store,
            lambda token: name_of(token) is not None,
            max_put_mb=net.cas_max_put_mb,
            max_body_mb=net.max_body_mb,
            operator=lambda token: name_of(token) in operators,
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
