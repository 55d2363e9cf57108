"""`piloop serve`: Redis, the API on the unix socket (and `--listen`), the pass, and the `serve` worker.

`--replica` is another server on the same Redis: its API, and the pass while it holds the leader lease; the
embedded Redis, the `serve` worker and the background task workers stay the first server's (docs/server.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import uvicorn
from fastapi import FastAPI
from prometheus_client import start_http_server

try:  # uvicorn[standard] brings it (not on Windows or PyPy): a cheaper loop than asyncio's own
    import uvloop

    new_loop: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
except ImportError:  # pragma: no cover
    new_loop = None

from piloop_common import logformat, pidfile
from piloop_common.cas import open_store
from piloop_common.config.settings import Settings
from piloop_common.errors import Unavailable
from piloop_common.listen import check_listen, is_loopback, parse_listen, uvicorn_tls
from piloop_common.logformat import LogFormat
from piloop_common.prctl import PARENT_ENV, set_name
from piloop_common.sdk.client import SERVER_KEEPALIVE_SECONDS, SOCKET_NAME
from piloop_server.api import wakeup
from piloop_server.app import create_app, via_socket
from piloop_server.daemon import Pass, leader_ttl_seconds
from piloop_server.daemon import run as run_pass
from piloop_server.leader import Leadership
from piloop_server.logfiles import SERVE_WORKER_LOG, logs_dir
from piloop_server.runtime import Runtime
from piloop_server.state import embedded
from piloop_server.state.connection import check_policy, connect
from piloop_server.state.generation import GenerationRecord, keep_server_id
from piloop_server.state.leader import LeaderLease
from piloop_server.tokens import check_stored_names

log = logging.getLogger("piloop.serve")
# how long a stop waits for the requests in flight (a follower's or a claim's long poll, a client that sends nothing)
# before it cancels them: `piloop stop` returns within a few seconds whatever is attached
SHUTDOWN_GRACE_SECONDS = 2  # whole seconds, as uvicorn takes them


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon stops all its servers together."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _unix_socket(path: Path) -> socket.socket:
    if path.exists():
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(0.5)
            probe.connect(str(path))
            raise Unavailable(f"another daemon answers on {path}: `piloop stop` it first")
        path.unlink()
    old = os.umask(0o177)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    s.listen(512)
    return s


def _tcp_socket(host: str, port: int) -> socket.socket:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted sockets inherit it: without it Nagle's algorithm holds each small answer ~40 ms
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise Unavailable(f"--listen {host}:{port}: cannot listen there: {e.strerror}") from e
    s.listen(1024)
    return s


class WorkerChild:
    """The daemon's own worker `serve`, a child process speaking to the socket like any worker."""

    def __init__(self, home: Path, sock: Path) -> None:
        self.home, self.sock = home, sock
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.log = open(logs_dir(home) / SERVE_WORKER_LOG, "ab")

    def start(self) -> None:
        args = [
            sys.executable,
            "-m",
            "piloop_common.cli",
            "--home",
            str(self.home),
            "worker",
            "--socket",
            str(self.sock),
            "--pool",
            "serve",
            "--name",
            "serve",
        ]
        # the worker goes when this process does (its parent-death signal, checked against this pid): a daemon
        # SIGKILLed leaves no worker behind to share the dir with the next daemon's. The kernel ties that signal
        # to the thread that started the child, so a child restarted by `watch` goes when that thread ends too:
        # at the daemon's stop, as `stop` would have it anyway
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env)
        log.info("event=worker.started name=serve pid=%d", self.proc.pid)

    def watch(self, stop: threading.Event) -> None:
        """Start the worker again when it exits, after a backoff doubling up to 60 s. One that found its dir held
        (the worker of a daemon that died, still detaching) has waited up to a minute for it already (its exit code
        4 and one line in worker-serve.log say so when it gave up), so a restart never races the old worker."""
        backoff = 1.0
        while not stop.wait(1.0):
            if self.proc is not None and self.proc.poll() is not None and not self.stopping:
                log.warning("event=worker.exited name=serve code=%s (restarting in %gs)", self.proc.returncode, backoff)
                if stop.wait(backoff):
                    return
                backoff = min(backoff * 2, 60)
                self.start()

    def begin_stop(self) -> None:
        """SIGTERM: the worker detaches and exits, leaving its jobs under their shims for the next daemon."""
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        """`begin_stop`, and wait for the worker to exit."""
        self.begin_stop()
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def _metrics_listener(settings: Settings, api: FastAPI) -> WSGIServer | None:
    """`[plugins.network] metrics_listen`: the app's registry without a token, in a thread of its own (a scrape reads
    Redis, never on the API's loop). Not served (one warning) when the address is taken: metrics never stop a
    daemon from running jobs."""
    addr = settings.plugins.network.metrics_listen
    if not addr:
        return None
    host, port = parse_listen(addr)
    if not is_loopback(host):
        log.warning("event=metrics.public listen=%s (served without a token: whoever reaches it reads them)", addr)
    try:
        server, _ = start_http_server(port, host, registry=api.state.metrics.registry)
    except OSError as e:
        log.warning("event=metrics.unavailable listen=%s error=%s (not served apart)", addr, e.strerror)
        return None
    log.info("event=metrics.listening listen=%s", addr)
    return server


def _worker_url(settings: Settings, tcp_addr: tuple[str, int] | None) -> str | None:
    """What started workers dial: `[plugins.network] url`, else the address of `--listen`."""
    net = settings.plugins.network
    if net.url:
        return net.url
    if tcp_addr is None:
        return None
    host, port = tcp_addr
    host = f"[{host}]" if ":" in host else ("127.0.0.1" if host in ("0.0.0.0", "") else host)
    return f"{'https' if net.tls and net.tls != 'proxy' else 'http'}://{host}:{port}"


def run(
    settings: Settings, home: Path, listen: str | None, log_format: LogFormat | None = None, *, replica: bool = False
) -> int:
    """Run the daemon in the foreground until SIGTERM or SIGINT."""
    fmt = log_format or settings.log_format
    logformat.setup(fmt)
    os.environ[logformat.ENV] = fmt  # its worker and task workers write alike
    set_name("piloop-serve")
    listen = listen or settings.plugins.network.listen
    tcp_addr = check_listen(settings, listen) if listen else None
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    logs_dir(home).mkdir(exist_ok=True)
    try:
        held = pidfile.hold(home)  # before anything of the home is touched: one daemon a home, for its whole life
    except pidfile.HomeTaken as e:
        raise Unavailable(f"a daemon is already running on {home} (pid {e.pid}): `piloop stop` it first") from None
    try:
        return _run(settings, home, listen, tcp_addr, replica)
    finally:
        pidfile.release(home, held)


def _run(settings: Settings, home: Path, listen: str | None, tcp_addr: tuple[str, int] | None, replica: bool) -> int:
    own_redis = settings.plugins.state.embedded and not replica
    redis_proc = embedded.start(home) if own_redis else None
    try:
        client = connect(settings, home)
        policy = check_policy(client)
        if policy.note:
            log.warning("event=redis.unchecked %s", policy.note)
        store = open_store(settings.plugins.cas, home)
        rt = Runtime(settings=settings, home=home, redis=client, store=store, cas_id=store.identity())
        check_stored_names(client, rt.keys)  # a name from before the name rule could collide with a key
        # the server's id tags the workers it starts: kept in Redis, so a restarted daemon knows its own
        rt.server_id = keep_server_id(client, rt.keys, rt.server_id)
        record = GenerationRecord(home / "state" / "generation.json")
        the_pass = Pass(rt, record)
        the_pass.check_generation()
        # this process's own name for the lease (rt.server_id is the namespace's, shared by every server)
        instance = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        lease = LeaderLease(client, rt.keys, instance, rt.caps.events)
        the_pass.leader = Leadership(lease, leader_ttl_seconds(rt.executor))
        sock_path = home / SOCKET_NAME
        servers_socks = [_unix_socket(sock_path)]
        if tcp_addr:
            servers_socks.append(_tcp_socket(*tcp_addr))
        info = {
            "pid": os.getpid(),
            "socket": str(sock_path),
            "listen": listen or "",
            "started_ms": int(time.time() * 1000),
            "replica": replica,
            "instance": instance,
        }
        api = create_app(rt, info)
        app = api
        metrics_server = _metrics_listener(settings, api)
        the_pass.wake = lambda: wakeup.notify(api)
        servers = [
            _Server(
                uvicorn.Config(
                    via_socket(app),
                    lifespan="off",
                    log_level="warning",
                    log_config=None,  # uvicorn's lines through the daemon's own handler, in its format
                    access_log=False,
                    timeout_keep_alive=SERVER_KEEPALIVE_SECONDS,
                    timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
                )
            )
        ]
        if tcp_addr:
            servers.append(
                _Server(
                    uvicorn.Config(
                        app,
                        lifespan="off",
                        log_level="warning",
                        log_config=None,
                        access_log=False,
                        timeout_keep_alive=SERVER_KEEPALIVE_SECONDS,
                        timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
                        proxy_headers=settings.plugins.network.tls == "proxy",
                        **uvicorn_tls(settings),
                    )
                )
            )
        stop = threading.Event()
        from piloop_server import tasks
        from piloop_server.provisioner import Provisioner

        # rq's keys under our hash tag, before anything in this process imports rq (tasks.submit is right anyway)
        os.environ[tasks.PREFIX_ENV] = rt.keys.rq_prefix()
        # the background tasks work in the first server's home (campaign repos): a replica starts none
        background = None if replica else tasks.Workers(rt, home)
        if background is not None:
            threading.Thread(target=background.watch, args=(stop,), name="tasks-watch", daemon=True).start()

        the_pass.provisioner = Provisioner(rt, url=_worker_url(settings, tcp_addr), home=home)
        threading.Thread(target=the_pass.leader.run, args=(stop,), name="leader", daemon=True).start()
        pass_thread = threading.Thread(target=run_pass, args=(the_pass, stop), name="pass", daemon=True)
        pass_thread.start()
        child = WorkerChild(home, sock_path) if "serve" in rt.executor.pools and not replica else None
        if child:
            child.start()
            threading.Thread(target=child.watch, args=(stop,), name="worker-watch", daemon=True).start()
        log.info(
            "event=daemon.started pid=%d socket=%s listen=%s replica=%s instance=%s",
            os.getpid(),
            sock_path,
            listen or "-",
            replica,
            instance,
        )

        async def main() -> None:
            loop = asyncio.get_running_loop()

            def shut() -> None:
                for s in servers:
                    s.should_exit = True
                wakeup.of(api).close()  # uvicorn waits for its requests: a long-polling claim would hold it 5 s
                if child:
                    child.begin_stop()  # its detach overlaps the servers' shutdown

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, shut)
            await asyncio.gather(*(s.serve(sockets=[sk]) for s, sk in zip(servers, servers_socks, strict=True)))

        try:
            # the runner is not closed: closing waits for every task left, and a request cancelled at the grace may
            # still wait in its thread (a follower's XREAD blocks up to 20 s); the process ends when the rest below
            # has stopped (the CLI's os._exit), and that thread with it
            runner = asyncio.Runner(loop_factory=new_loop)
            runner.run(main())
        finally:
            stop.set()
            if child:
                child.stop()
            pass_thread.join(10)
            the_pass.leader.resign()  # after the pass ended: another server takes it at once, not after the TTL
            the_pass.provisioner.close()
            if metrics_server is not None:
                metrics_server.shutdown()
            if background is not None:
                background.stop()
            with contextlib.suppress(FileNotFoundError):
                sock_path.unlink()
            log.info("event=daemon.stopped")
        return 0
    finally:
        if own_redis:
            embedded.stop(home, redis_proc)
