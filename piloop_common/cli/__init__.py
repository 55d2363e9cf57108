"""The `piloop` command: one click root; each group imports its side only when it runs."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from piloop_common import __version__
from piloop_common.cli.admin import events, inbox, limits, token
from piloop_common.cli.attach import attach
from piloop_common.cli.campaign import campaign
from piloop_common.cli.cas import cas
from piloop_common.cli.config import config
from piloop_common.cli.context import Cli
from piloop_common.cli.daemon import init, serve, stop
from piloop_common.cli.jobs import job
from piloop_common.cli.relay import progress
from piloop_common.cli.schedule import schedule
from piloop_common.cli.secret import secret
from piloop_common.cli.status import status
from piloop_common.cli.task import task
from piloop_common.cli.ui import ui
from piloop_common.cli.worker import worker
from piloop_common.errors import BadRequest, ConfigError, PiloopError, as_flag
from piloop_common.extras import MissingExtra


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="PILOOP_HOME",
    help="piloop's home (default ~/.piloop): config.toml, the socket, the spool.",
)
@click.option(
    "--server",
    metavar="URL",
    envvar="PILOOP_SERVER",
    help="Call this server instead of the local daemon, like https://piloop.example.com:8443 "
    "(plain http on a loopback address only). The token: --token-file, else PILOOP_TOKEN.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --server: read the token from the first line of this file (else PILOOP_TOKEN).",
)
@click.option(
    "--ca",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PILOOP_CA",
    help="With --server: the PEM of the CA that signed the server's certificate (else the system's).",
)
@click.version_option(__version__, prog_name="piloop")
@click.pass_context
def root(ctx: click.Context, home: Path | None, server: str | None, token_file: Path | None, ca: Path | None) -> None:
    """piloop: agent sessions and evaluations on workers anywhere, leased through Redis."""
    given = {n for n in ("server", "ca") if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE}
    if not server and (token_file or "ca" in given):
        # without a server they would be ignored, and the command would quietly go to the local socket
        raise click.UsageError(f"{'--token-file' if token_file else '--ca'}: give --server URL (or PILOOP_SERVER) too")
    flag = "server" in given
    ctx.obj = Cli(home, server=server, token_file=token_file, ca=ca, server_flag=flag)


for command in (
    init,
    serve,
    config,
    stop,
    status,
    worker,
    limits,
    token,
    cas,
    job,
    events,
    inbox,
    secret,
    progress,
    attach,
    campaign,
    task,
    schedule,
    ui,
):
    root.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: a user mistake is one line on stderr and a non-zero exit, never a traceback."""
    try:
        rv = root.main(args=argv, prog_name="piloop", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("piloop: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except ConfigError as e:
        click.echo(f"piloop: config: {e.message}", err=True)
        sys.exit(2)
    except MissingExtra as e:
        click.echo(f"piloop: {e.message}", err=True)
        sys.exit(2)
    except BadRequest as e:  # the input was wrong: a usage error, as click's own are (docs/operations.md)
        click.echo(f"piloop: {as_flag(e, sys.argv[1:] if argv is None else argv)}", err=True)
        sys.exit(2)
    except PiloopError as e:
        click.echo(f"piloop: {e.message}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)
