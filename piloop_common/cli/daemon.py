"""`piloop init`, `serve`, `stop` and `status`."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from piloop_common.cli.output import progress, progress_done
from piloop_common.errors import PiloopError, Unavailable
from piloop_common.extras import need_server
from piloop_common.logformat import LogFormat

PID_FILE = "piloop.pid"
STOPPING_WAIT_SECONDS = 15.0  # how long `serve` waits for a daemon that holds its home but no longer answers

CONFIG_TEMPLATE = """\
# piloop's config. Every key and its default: docs/configuration.md.

[plugins.executor]
provider = "workers"
# renew_seconds = 10        # the worker's heartbeat
# grace_seconds = 50        # then a silent worker is unreachable: its slots count zero
# toleration_seconds = 300  # then its leases expire and their jobs go back with a new token

# `piloop serve`'s own worker is in the pool `serve`.
[plugins.executor.pools.serve]
agents = 2
# evaluations = 2    # default: the host's CPUs, at least 2 (Python tasks run in these slots too)
# max_load = 4.0     # the 1-minute load per CPU over which it takes no job; default: none (docs/worker.md)
min_memory_gb = 0.5

# [plugins.cas]      # default: a directory under this home
# provider = "local"

# [plugins.state]    # default: an embedded Redis under this home, AOF on
# url = "redis://localhost:6379/0"
"""


def _pid(home: Path) -> int | None:
    """The pid of the daemon running on `home`, or None. The daemon holds a lock on its pid file for its whole life
    (`piloop_common.pidfile`): a file that a SIGKILLed daemon left, or a pid reused since, never counts."""
    from piloop_common.pidfile import holder

    pid = holder(home)
    if pid is not None:
        return pid or None  # 0: it holds the lock and is writing its pid this very moment
    return _unlocked_daemon(home)


def _unlocked_daemon(home: Path) -> int | None:
    """A daemon of a release before the lock: its pid file's pid, when that is a live `piloop serve` and the home's
    socket answers (so a stale file and a reused pid never count)."""
    try:
        pid = int((home / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid == os.getpid():
        return None  # a container restarted: the stale file names us
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None  # no such process
    if "serve" not in [a.decode(errors="replace") for a in args] or not any(b"piloop" in a for a in args[:3]):
        return None  # a reused pid belongs to something else
    from piloop_common.sdk.client import ApiClient

    try:
        with ApiClient.local(home, timeout=2) as api:
            api.call("GET", "/v1/health")
    except PiloopError:
        return None
    return pid


def _wait_up(ctx_obj, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            progress_done()
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            reason = "\n  ".join(tail) or f"exit code {proc.returncode}"
            raise click.ClickException(f"the daemon did not start:\n  {reason}")
        try:
            with ctx_obj.local_api(timeout=2) as api:
                return api.call("GET", "/v1/health")
        except Unavailable:
            progress(f"piloop: starting the daemon… {time.monotonic() - started:.0f}s")
            time.sleep(0.1)
    progress_done()
    raise click.ClickException(f"the daemon did not answer within {timeout:g}s; see {log}")


def start_detached(ctx_obj, listen: str | None, replica: bool = False) -> dict[str, Any]:
    from piloop_server.logfiles import DAEMON_LOG, logs_dir

    home: Path = ctx_obj.home
    home.mkdir(parents=True, exist_ok=True)
    logs_dir(home).mkdir(exist_ok=True)
    log = logs_dir(home) / DAEMON_LOG
    args = [sys.executable, "-m", "piloop_common.cli", "--home", str(home), "serve"]
    if listen:
        args += ["--listen", listen]
    if replica:
        args.append("--replica")
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    health = _wait_up(ctx_obj, proc, log)
    progress_done()
    return health


@click.command()
@click.pass_obj
def init(obj) -> None:
    """Write a commented config.toml, create the CAS identity, and start the daemon on its socket."""
    need_server("piloop init")
    home: Path = obj.home
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    cfg = home / "config.toml"
    if cfg.exists():
        click.echo(f"piloop: {cfg} exists; keeping it")
    else:
        cfg.write_text(CONFIG_TEMPLATE)
        click.echo(f"piloop: wrote {cfg}")
    settings = obj.settings
    from piloop_common.cas import open_store

    cas_id = open_store(settings.plugins.cas, home).identity()
    click.echo(f"piloop: CAS {settings.plugins.cas.provider}, id {cas_id}")
    pid = _pid(home)
    if pid:
        click.echo(f"piloop: the daemon is already running (pid {pid})")
        return
    health = start_detached(obj, None)
    click.echo(f"piloop: the daemon is running (pid {health['pid']}) on {home / 'piloop.sock'}")


@click.command()
@click.option("--detach", is_flag=True, help="Run in the background; the log goes to $PILOOP_HOME/logs/daemon.log.")
@click.option(
    "--listen", metavar="HOST:PORT", help="Listen here too (a non-loopback address needs [plugins.network] tls)."
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="PILOOP_LOG_FORMAT",
    help="text (event=… key=value lines) or json (one object a line); default: the config's log_format.",
)
@click.option(
    "--replica",
    is_flag=True,
    help="Another server on the shared Redis ([plugins.state] url): the API only, and the pass while it leads.",
)
@click.pass_obj
def serve(obj, detach: bool, listen: str | None, log_format: LogFormat | None, replica: bool) -> None:
    """Run the daemon: the API, the pass, and its own worker `serve`."""
    need_server("piloop serve")
    settings = obj.settings
    if replica and settings.plugins.state.embedded:
        raise click.UsageError(
            "--replica serves the Redis another server uses: set [plugins.state] url (or PILOOP_REDIS_URL) to it"
        )
    from piloop_common.listen import serve_listen
    from piloop_server.serve import run

    serve_listen(settings, listen)
    pid = _pid(obj.home)
    if pid and not _answers(obj):
        # one that is stopping: this one starts once it is gone
        if held := _wait_gone(obj.home, pid, STOPPING_WAIT_SECONDS):
            raise click.ClickException(
                f"the daemon (pid {held}) holds {obj.home} but has not answered on its socket for "
                f"{STOPPING_WAIT_SECONDS:g}s: `piloop stop` it, or end it (kill {held})"
            )
        pid = None
    if pid:
        raise click.ClickException(f"a daemon is already running (pid {pid}): `piloop stop` it first")
    if log_format:
        os.environ["PILOOP_LOG_FORMAT"] = log_format  # the detached daemon's, and what it starts
    if detach:
        health = start_detached(obj, listen, replica)
        where = f", listening on {listen}" if listen else ""
        click.echo(f"piloop: the daemon is running (pid {health['pid']}){where}")
        return
    code = run(settings, obj.home, listen, log_format, replica=replica)
    # everything is stopped and the log flushed; the interpreter's own teardown of the server's modules took half a
    # second more of every `piloop stop`
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@click.command()
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for it to stop.")
@click.pass_obj
def stop(obj, timeout: float) -> None:
    """Stop the daemon; its worker's jobs keep running under their shims for the next `piloop serve`."""
    pid = _pid(obj.home)
    if not pid:
        click.echo("piloop: no daemon is running")
        return
    os.kill(pid, signal.SIGTERM)
    click.echo(
        f"piloop: stopping the daemon (pid {pid}): it ends its requests, detaches its worker and stops its "
        "embedded Redis",
        err=True,
    )
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if _gone(pid):
            progress_done()
            click.echo(f"piloop: the daemon stopped (pid {pid}); its worker's jobs run on under their shims")
            return
        progress(f"piloop: waiting for the daemon (pid {pid}) to exit… {time.monotonic() - started:.0f}s")
        time.sleep(0.05)
    progress_done()
    raise click.ClickException(f"the daemon (pid {pid}) did not stop within {timeout:g}s; see {_daemon_log(obj.home)}")


def _answers(obj) -> bool:
    try:
        with obj.local_api(timeout=2) as api:
            api.call("GET", "/v1/health")
    except PiloopError:
        return False
    return True


def _wait_gone(home: Path, pid: int, timeout: float) -> int | None:
    """Wait up to `timeout` for the daemon `pid`, which holds the home but does not answer (it is stopping), to end;
    the pid still holding it then, or None."""
    started = time.monotonic()
    while (held := _pid(home)) and time.monotonic() - started < timeout:
        progress(f"piloop: waiting for the daemon (pid {pid}) that is stopping… {time.monotonic() - started:.0f}s")
        time.sleep(0.1)
    progress_done()
    return held


def _gone(pid: int) -> bool:
    """The process has exited: no such pid, or a zombie its new parent has not reaped yet (an init that reaps
    slowly kept `stop` waiting 2 s for nothing)."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return True
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _daemon_log(home: Path) -> Path:
    from piloop_server.logfiles import DAEMON_LOG, logs_dir

    return logs_dir(home) / DAEMON_LOG


__all__ = ["PiloopError", "init", "serve", "stop"]
