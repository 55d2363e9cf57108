"""`run_worker`: what `piloop worker` runs. Exit codes: 0 stopped (detached), 1 a failure at start that a restart may
mend (its CAS does not answer, an answer it cannot use), 2 a user mistake (a file or dir of its own it cannot make),
3 refused (by the server, or its CAS refused its token), 4 its directory is in use by another worker (one worker per
directory), 5 the server's certificate is not trusted (the CA that signed it goes in `SSL_CERT_FILE`). Each with one
line on stderr."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from piloop_common import logformat
from piloop_common.errors import ConfigError, PiloopError
from piloop_common.logformat import LogFormat
from piloop_worker.logger import log

if TYPE_CHECKING:
    from piloop_common.config.settings import Settings
    from piloop_common.sdk.client import ApiClient
    from piloop_worker.jobuser import JobUser

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_IN_USE, EXIT_UNTRUSTED = 0, 1, 2, 3, 4, 5
# how long `piloop serve`'s own worker waits for the directory: the worker of a daemon that died detaches meanwhile
SERVE_DIR_WAIT = 60.0
CREDENTIAL_ENV = "PILOOP_WORKER_CREDENTIAL"


def _fail(msg: str, code: int = EXIT_USAGE) -> int:
    print(f"piloop worker: {msg}", file=sys.stderr, flush=True)
    return code


def run_worker(
    *,
    server: str | None,
    socket: Path | None,
    pool: str,
    token: str | None,
    token_file: Path | None,
    name: str | None,
    image: str,
    dir: Path | None,
    home: Path,
    log_format: LogFormat | None = None,
    tasks_path: list[Path] | None = None,
    task_processes: str | None = None,
) -> int:
    """Run a worker until SIGTERM/SIGINT (detach: 0) or a refusal (3); a user mistake is 2, in one line."""
    daemon = _die_with_daemon() if socket is not None else None
    if daemon == 0:
        return EXIT_OK  # `piloop serve` died before this worker could say it goes with it
    if not server and not socket:
        return _fail("give --server URL (or the daemon's --socket)")
    if not pool:
        return _fail("--pool: name the pool this worker serves")
    if server:
        from piloop_common.sdk.remote import Servers

        try:
            Servers.parse(server)
        except ConfigError as e:
            return _fail(e.message)
    try:
        from piloop_common.config.load import load_settings

        settings = load_settings(home)
    except ConfigError as e:
        return _fail(f"config: {e.message}")
    proxy = server is not None and settings.plugins.network.provider == "proxy"
    if proxy:
        # the proxy in front of the server checks the credential; the server never sees a piloop token
        credential = os.environ.get(CREDENTIAL_ENV, "").strip()
        if not credential:
            return _fail(f"the proxy network: set {CREDENTIAL_ENV} to the credential the proxy accepts for workers")
        if not name:
            return _fail("--name: on the proxy network a worker names itself (x-piloop-worker); give --name")
        token = credential
    elif server and not token:
        return _fail("no token: set PILOOP_HTTPS_TOKEN or --token-file (make one with `piloop token create`)")
    if socket is None:
        # nothing on a remote worker holds state credentials (the daemon's own worker shares its home)
        if os.environ.get("PILOOP_REDIS_URL"):
            return _fail("PILOOP_REDIS_URL is set: a worker holds no state credentials; unset it on this machine")
        if settings.plugins.state.url is not None:
            return _fail(
                f"{home / 'config.toml'} has [plugins.state] url: a worker holds no state credentials; "
                "remove it on this machine"
            )
    _keep_from_jobs()
    from piloop_common.errors import DirInUse
    from piloop_common.prctl import set_name
    from piloop_worker.dirlock import hold_dir

    # the directory first, before anything looks in it; a worker named by its token locks it once it knows its name
    known = (name or "serve") if socket is not None else name
    workdir = dir or (home / "work" / known if known else None)
    dir_lock = None
    if workdir is not None:
        try:
            dir_lock = hold_dir(workdir, wait=SERVE_DIR_WAIT if daemon else 0.0, on_wait=_say_waiting)
        except DirInUse as e:
            return _fail(e.message, EXIT_IN_USE)
        except OSError as e:
            return _fail(f"{workdir}: cannot take the worker's lock there: {e.strerror}")
    from piloop_worker import jobuser

    try:
        job_user = jobuser.resolve(settings.plugins.executor.run_as)
    except ConfigError as e:
        return _fail(f"config: {e.message}")
    # the tasks path: --tasks-path, else [plugins.tasks] path; relative to the dir the worker starts in
    path = [str(p) for p in tasks_path] if tasks_path else list(settings.plugins.tasks.path)
    for p in path:
        if not os.path.isdir(p):
            flag = "--tasks-path" if tasks_path else f"{home / 'config.toml'} [plugins.tasks] path"
            return _fail(f"{flag}: {p} is not a directory")
    set_name("piloop-worker")
    tasks_cfg = settings.plugins.tasks
    warm = (
        (tasks_cfg.warm_max_tasks, tasks_cfg.warm_max_rss_mb)
        if (task_processes or tasks_cfg.processes) == "warm"
        else None
    )
    from piloop_worker import tasks

    # the slots' supervisors inherit it, and put it first on their task processes' sys.path
    os.environ[tasks.PATH_ENV] = os.pathsep.join(os.path.abspath(p) for p in path)
    os.environ[tasks.START_ENV] = os.getcwd()
    if job_user is not None and not jobuser.available():
        log.warning(
            "event=worker.no_landlock run_as=%s: this kernel has no Landlock, so jobs run as one user can read "
            "each other's /proc/<pid>/environ (their secrets); run such jobs on separate workers",
            job_user.name,
        )
    logformat.setup(log_format or settings.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per call would drown the worker's own
    # a few lines a job: the format names no thread or process, so don't look them up for each (the logging docs'
    # "Optimization"; piloop_worker/logger.py skips the source line)
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    try:
        return _run(
            settings,
            job_user,
            warm,
            server=server,
            socket=socket,
            pool=pool,
            token=token,
            name=name,
            image=image,
            dir=dir,
            home=home,
            proxy=proxy,
        )
    finally:
        if dir_lock is not None:
            dir_lock.release()  # after the worker has done with its dir


def _keep_from_jobs() -> None:
    """Keep what this worker holds from its jobs, which run as its user unless `run_as` says otherwise: not dumpable,
    so a job can read neither its `/proc/<pid>/environ` nor its memory (a worker the local provisioner started stays
    readable: that provisioner lists its workers by their environment, and their jobs run as the server's user, who
    reads its files anyway); and its credentials, read by now, gone from its environment block."""
    from piloop_common.prctl import LOCAL_PROVISIONED_ENV, forget_env, set_dumpable
    from piloop_worker.jobuser import CREDENTIAL_PREFIXES, CREDENTIALS

    if not os.environ.get(LOCAL_PROVISIONED_ENV):
        set_dumpable(False)
    forget_env([k for k in os.environ if k in CREDENTIALS or k.startswith(CREDENTIAL_PREFIXES)])


def _die_with_daemon() -> int | None:
    """For `piloop serve`'s own worker (its pid in `PARENT_ENV`): SIGTERM when the daemon dies, so the worker
    detaches as on `piloop stop`, its jobs left under their shims for the next daemon's worker. The daemon's pid, 0
    where it is gone already, None for any other worker."""
    from piloop_common.prctl import PARENT_ENV, set_parent_death_signal

    given = os.environ.pop(PARENT_ENV, "")  # not handed on to the shims and jobs
    if not given.isdigit():
        return None
    set_parent_death_signal(signal.SIGTERM)
    return int(given) if os.getppid() == int(given) else 0


def _say_waiting(workdir: Path, pid: int) -> None:
    print(
        f"piloop worker: {workdir} is in use by worker pid {pid or '?'}: waiting up to {SERVE_DIR_WAIT:g}s for it",
        file=sys.stderr,
        flush=True,
    )


def _run(
    settings: Settings,
    job_user: JobUser | None,
    warm: tuple[int, int] | None,
    *,
    server: str | None,
    socket: Path | None,
    pool: str,
    token: str | None,
    name: str | None,
    image: str,
    dir: Path | None,
    home: Path,
    proxy: bool = False,
) -> int:
    from piloop_common.cas import open_store
    from piloop_common.errors import DirInUse, Forbidden, Unauthorized, Unavailable
    from piloop_common.sdk.client import ApiClient
    from piloop_common.sdk.remote import Servers
    from piloop_worker.loop import ServerUntrusted, ShutdownRequested, Worker, WorkerRefused
    from piloop_worker.records import StopReason

    # over TCP a token names the worker; `--name` asks for another, which the server allows only where the token
    # says so (`piloop token create --rename`), else it refuses the worker (exit 3)
    worker_header = (name or "serve") if socket is not None else name
    if socket is not None:
        name = worker_header

    # one list for every client the worker makes: they all move to the next server together, and stay on it
    servers = Servers.parse(server) if server else None

    def api_factory() -> ApiClient:
        return ApiClient(url=servers, socket=socket, token=token, worker=worker_header)

    if server:
        # the server first: a CAS over HTTP takes the same token and may sit behind the same certificate, and
        # its failure would hide the server's own word (a revoked token is a refusal, not a CAS error)
        answer = _ask_server(api_factory)
        if answer is not None:
            return _fail(*answer)
    try:
        # an http CAS takes the worker's own token (on the proxy network, none: the proxy's credential is no token)
        store = open_store(settings.plugins.cas, home, token=None if proxy else token)
        store.identity()
        store.hold_when_away()  # a report is built and spooled while the CAS is away; it flushes before sending
    except ConfigError as e:
        return _fail(f"config: {e.message}")
    except (Unauthorized, Forbidden) as e:
        return _fail(f"refused by the CAS: {e.message}", EXIT_REFUSED)
    except Unavailable as e:
        return _fail(f"the CAS does not answer: {e.message}", EXIT_FAILED)
    except PiloopError as e:
        return _fail(f"the CAS cannot be opened: {e.message}", EXIT_USAGE)

    where = server or f"unix:{socket}"
    w = Worker(
        api_factory=api_factory,
        where=where,
        pool=pool,
        image=image,
        name=name,
        workdir=dir,
        home=home,
        store=store,
        user=job_user,
        warm_tasks=warm,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        w.ctx.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        try:
            try:
                w.start()
            except DirInUse:
                raise
            except PiloopError as e:  # whatever else ends its start: one line, and a supervisor restarts it
                return _fail(f"cannot start: {e.message}", EXIT_FAILED)
            except OSError as e:  # its spool or work dir cannot be made there: a setup mistake
                return _fail(f"cannot start: {e.filename or ''}: {e.strerror or e}", EXIT_USAGE)
            w.loop()
        except ShutdownRequested:
            log.info("event=worker.detaching worker=%s jobs=%d", w.ctx.name, len(w.holdings))
            w.detach(budget=(w.ctx.timing.request_timeout_seconds * 2) if w.ctx.timing else 0.0)
            return EXIT_OK
        except DirInUse as e:
            return _fail(e.message, EXIT_IN_USE)
        except WorkerRefused as e:
            w.stop_all(StopReason.REFUSED, wait=(w.ctx.timing.kill_grace_seconds + 2) if w.ctx.timing else 2.0)
            return _fail(f"refused by the server: {e.reason}", EXIT_REFUSED)
        except ServerUntrusted as e:  # before registering: nothing of this worker runs yet
            return _fail(e.message, EXIT_UNTRUSTED)
    finally:
        w.close()
    return EXIT_OK


def _ask_server(api_factory: Callable[[], ApiClient]) -> tuple[str, int] | None:
    """One call before anything else opens: the register route with an empty hello. The server knows its caller
    before it reads a body, so a refused worker hears why (3) and an accepted one hears that the hello is empty (a
    bad request: nothing is recorded). A certificate this machine does not trust is a setup mistake that retrying
    never fixes (5). Anything else (the server down, a timeout) is left to the worker's retries; None to go on."""
    from piloop_common.errors import Refused, Unavailable

    api = api_factory()
    try:
        api.call("POST", "/v1/worker/register", {}, timeout=10)
    except Refused as e:
        return f"refused by the server: {e.message}", EXIT_REFUSED
    except Unavailable as e:
        if e.details.get("tls") == "untrusted":
            return e.message, EXIT_UNTRUSTED
    except PiloopError:
        pass
    finally:
        api.close()
    return None
