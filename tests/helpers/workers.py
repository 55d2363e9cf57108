"""Real `piloop worker` processes against a real `piloop serve` over TCP, and what fault tests look at:
job views, events, process groups, and a marker file each job appends its runs to (outside piloop)."""

from __future__ import annotations

import inspect
import itertools
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from piloop_common.sdk.client import ApiClient
from piloop_common.tasks import Client
from piloop_worker.slots import SlotDir, SlotRecord
from tests.helpers.jobwhere import worker_name
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, cli_env, short_home
from tests.helpers.slowdown import scaled

# FAST_EXECUTOR: renew 0.5 s, grace 2 s, toleration 6 s, kill grace 0.5 s.
RENEW, GRACE, TOLERATION, KILL_GRACE = 0.5, 2.0, 6.0, 0.5
# a silent worker's jobs are stopped 6 − 2 × 0.5 = 5 s after it sent its last acknowledged heartbeat
FENCE_AFTER = TOLERATION - 2 * RENEW
GPU = "\n[plugins.executor.pools.gpu]\nagents = 1\nevaluations = 1\nmax_load = 1000\nmin_memory_gb = 0\n"
ENDED = ("succeeded", "failed", "lost", "cancelled", "worker_lost", "expired")


def tcp_server(
    redis_url: str, namespace: str, extra: str = GPU, config: str = FAST_EXECUTOR, env: dict[str, str] | None = None
) -> Daemon:
    """`piloop serve --listen 127.0.0.1:<port>` with a `gpu` pool for remote workers; `.url` is its address."""
    d = Daemon(short_home(), config=config + extra, redis_url=redis_url, namespace=namespace, env=env)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return d


class RemoteWorker:
    """`piloop worker --server ... --pool gpu` in a home of its own that shares only the server's CAS."""

    def __init__(
        self,
        d: Daemon,
        token: str,
        pool: str = "gpu",
        same_cas: bool = True,
        env: dict | None = None,
        args: tuple[str, ...] = (),
        name: str = "",
        url: str = "",
        command: tuple[str, ...] = (sys.executable, "-m", "piloop_common.cli"),
    ) -> None:
        """`command` runs piloop: this venv's by default, another install's `bin/piloop` to test that install."""
        self.d, self.token, self.pool, self.env, self.args, self.name = d, token, pool, env or {}, args, name
        self.url = url  # `URL1,URL2`: several servers (else the daemon's)
        self.command = command
        self.home = short_home("w")
        if same_cas:
            (self.home / "config.toml").write_text(f'[plugins.cas]\nprovider = "local"\npath = "{d.home}/cas"\n')
        self.proc: subprocess.Popen | None = None

    def start(self) -> RemoteWorker:
        env = cli_env(self.home, {"PILOOP_HTTPS_TOKEN": self.token, **self.env})
        self.log = open(self.home / "worker.log", "ab")
        # a session of its own: a test may stop the worker as one group (its slots' supervisors have theirs)
        self.proc = subprocess.Popen(
            [*self.command, "worker", "--server", self.url or self.d.url, "--pool", self.pool, *self.args],
            env=env,
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return (self.home / "worker.log").read_text(errors="replace")

    def wait(self, timeout: float = 20) -> int:
        assert self.proc is not None
        return self.proc.wait(scaled(timeout))

    def kill(self) -> None:
        """SIGKILL the worker's group (its slots' supervisors and jobs live on in their own sessions)."""
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(scaled(5))

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(scaled(20))

    def pause(self) -> None:
        assert self.proc is not None
        _signal_group(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        _signal_group(self.proc.pid, signal.SIGCONT)

    def spool(self, name: str) -> list[Path]:
        return sorted((self.home / "spool" / name).glob("*.json"))

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGCONT)
        self.kill()
        kill_tree_of(str(self.home))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def kill_tree_of(marker: str) -> None:
    """Kill processes left behind on purpose (supervisors, jobs) whose command line or environment names `marker`."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            if p.info["cmdline"] and any(marker in a for a in p.info["cmdline"]):
                p.kill()
                continue
            if any(marker in v for v in p.environ().values()):
                p.kill()
        except (psutil.Error, OSError):
            continue


def token(d: Daemon, name: str, *args: str) -> str:
    return d.cli("token", "create", name, *args, check=True).stdout.strip()


def submit(d: Daemon, *argv: str, pool: str = "gpu", kind: str = "evaluation", opts: tuple[str, ...] = ()) -> str:
    return d.cli("job", "submit", "--pool", pool, "--kind", kind, *opts, "--", *argv, check=True).stdout.strip()


def _redis_of(d: Daemon):  # -> tuple[redis.Redis, Keys]
    """A client of the daemon's Redis and its namespace's keys. For a daemon on a test's own Redis (`redis_url`)."""
    import re

    import redis

    from piloop_server.state.keys import Keys

    url = re.search(r'^url = "(.+)"$', (d.home / "config.toml").read_text(), re.M)
    assert url, "this reads the Redis of a daemon started with redis_url"
    return redis.Redis.from_url(url.group(1)), Keys(d.env["PILOOP_NAMESPACE"])


def lease_token(d: Daemon, job: str) -> str:
    """A job's whole lease token (its last one once it ended), read from Redis: what only its holder is told (a job
    view and the events show its fencing order alone). For a daemon on a test's own Redis (`redis_url`)."""
    r, keys = _redis_of(d)
    try:
        got = r.hmget(keys.job(job), "token", "history")
    finally:
        r.close()
    tok = (got[0] or b"").decode()
    return tok or (got[1] or b"").decode().split()[-1].partition("/")[2]


def lease_seconds_left(d: Daemon, job: str) -> float:
    """How long the job's lease key has left in Redis (its TTL; 0 if it has none): the lease ends then unless it is
    renewed. For a daemon on a test's own Redis (`redis_url`)."""
    r, keys = _redis_of(d)
    try:
        left = int(r.pttl(keys.lease(job)))
    finally:
        r.close()
    return max(left, 0) / 1000


def view(d: Daemon, job: str) -> dict:
    with d.api() as api:
        return api.call("GET", f"/v1/jobs/{job}")


def state(d: Daemon, job: str, *states: str, timeout: float = 30) -> dict:
    """The job's view once it is in one of `states` (default: any end); a timeout names the states it was seen in."""
    states = states or ENDED
    seen: list[str] = []

    def look() -> dict | bool:
        v = view(d, job)
        if not seen or seen[-1] != v["state"]:
            seen.append(v["state"])
        return v["state"] in states and v

    try:
        return wait_for(look, timeout, interval=0.1, what=f"job {job} to be {'|'.join(states)}")
    except AssertionError as e:
        raise AssertionError(f"{e}; it was {' → '.join(seen) or 'never seen'}") from None


def events(d: Daemon, *types: str) -> list[dict]:
    """Every event in the stream (of these types), oldest first."""
    out: list[dict] = []
    after = "0"
    with d.api() as api:
        while True:
            batch = api.call("GET", "/v1/events", params={"after": after, "count": 10_000})
            if not batch:
                break
            out += batch
            after = batch[-1]["id"]
    return [e for e in out if not types or e["type"] in types]


def worker_api(d: Daemon, tok: str) -> ApiClient:
    """The API as a worker holding `tok` sees it (for sending a report by hand)."""
    return ApiClient(url=d.url, token=tok, timeout=10)  # type: ignore[attr-defined]


def pgid_alive(pgid: int) -> bool:
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def slot_dirs(workdir: Path) -> list[SlotDir]:
    """The slots of the worker whose `--dir` is `workdir`, by number."""
    root = workdir / "slots"
    nums = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
    return [SlotDir.of(workdir, n) for n in nums]


def slot_deadline(slot: SlotDir) -> float | None:
    """The fencing deadline the worker last wrote in `slot`'s record (a `clock.now()` time), or None."""
    rec = SlotRecord.open(slot.record)
    try:
        got = rec.read()
    finally:
        rec.close()
    return got.deadline if got is not None else None


def job_cgroup(pid: int) -> Path | None:
    """The memory cgroup the job process `pid` runs in, where it is one the worker made for its jobs (named
    `<pid>-slot-<n>` or `<pid>-<n>` under the worker's base), else None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers in ("", "memory") and "/piloop" in path:
            root = Path("/sys/fs/cgroup") if controllers == "" else Path("/sys/fs/cgroup/memory")
            return root / path.lstrip("/")
    return None


# A job that appends `<event> <job> <worker> <token> <pgid> <time> <pid>` lines to $MARKER (O_APPEND, one write a
# line): `start`, a `tick` every 50 ms, then `end`. The worker's name is found without a job dir where there is none
# (`worker_name`). $RUN_SECONDS long; with $FIRST_FOREVER set, the job's first
# run (no earlier line of its own in the marker) runs until it is killed and writes $PARTIAL into
# outputs/result.txt first, so a fenced or killed run leaves partial output behind. With $IGNORE_TERM set, SIGTERM
# is ignored.
WORKER_NAME = "import os\n" + inspect.getsource(worker_name)  # for a job run as `python -c`
MARKER_JOB = WORKER_NAME + textwrap.dedent("""
    import os, sys, time
    m, job, token = os.environ["MARKER"], os.environ["PILOOP_JOB"], os.environ["PILOOP_LEASE_TOKEN"]
    if os.environ.get("IGNORE_TERM"):  # a job that takes its time to stop: only SIGKILL ends it
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    where = worker_name()
    def line(ev):
        fd = os.open(m, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{ev} {job} {where} {token} {os.getpgid(0)} {time.time():.3f} {os.getpid()}\\n".encode())
        os.close(fd)
    mine = os.path.exists(m) and f" {job} " in open(m).read()
    forever = os.environ.get("FIRST_FOREVER") and not mine
    os.makedirs("../outputs", exist_ok=True)
    open("../outputs/result.txt", "w").write("partial\\n" if forever else "final\\n")
    line("start")
    print(f"run {token} of {job}", flush=True)
    end = time.time() + (10_000 if forever else float(os.environ.get("RUN_SECONDS", "1")))
    while time.time() < end:
        time.sleep(0.05)
        line("tick")
    line("end")
""")


def marker_runs(marker: Path) -> dict[str, list[dict]]:
    """{job: [one dict per run (token): where, token, pgid, pid (its first process), start, last (last line's time),
    ended]}."""
    runs: dict[tuple[str, str], dict] = {}
    if not marker.exists():
        return {}
    for raw in marker.read_text().splitlines():
        ev, job, where, tok, pgid, t, *pid = raw.split(" ")
        r = runs.setdefault(
            (job, tok),
            {
                "job": job,
                "where": where,
                "token": tok,
                "pgid": int(pgid),
                "pid": int(pid[0]) if pid else int(pgid),
                "start": float(t),
                "last": float(t),
                "ended": False,
            },
        )
        r["start"], r["last"] = min(r["start"], float(t)), max(r["last"], float(t))
        r["ended"] = r["ended"] or ev == "end"
    out: dict[str, list[dict]] = {}
    for r in sorted(runs.values(), key=lambda r: r["start"]):
        out.setdefault(r["job"], []).append(r)
    return out


def overlapping(runs: list[dict]) -> bool:
    """Whether any two runs of one job overlap in time."""
    rs = sorted(runs, key=lambda r: r["start"])
    return any(b["start"] < a["last"] for a, b in itertools.pairwise(rs))


def marker_job(
    d: Daemon,
    marker: Path,
    *,
    pool: str = "gpu",
    kind: str = "evaluation",
    seconds: float = 1.0,
    first_forever: bool = False,
    ignore_term: bool = False,
) -> str:
    """Queue the marker job (through the API in this process: a CLI's start takes seconds on a loaded machine, which
    a test that submits two jobs and waits for both to run would count against the first)."""
    env = {"MARKER": str(marker), "RUN_SECONDS": str(seconds)}
    if first_forever:
        env["FIRST_FOREVER"] = "1"
    if ignore_term:
        env["IGNORE_TERM"] = "1"
    with d.api() as api:
        return Client(api).submit([sys.executable, "-c", MARKER_JOB], pool=pool, kind=kind, env=env)


class HandWorker:
    """A worker driven by hand over real HTTP with its own token (no `piloop worker` process): it registers, then
    each call is one request whose status and JSON answer the test reads."""

    def __init__(self, d: Daemon, name: str, tok: str, pool: str) -> None:
        import httpx

        from piloop_common.protocol.worker import PROTOCOL

        self.d, self.name, self.token, self.pool, self.protocol = d, name, tok, pool, PROTOCOL
        self.http = httpx.Client(
            base_url=d.url,
            timeout=10,  # type: ignore[attr-defined]
            headers={"Authorization": f"Bearer {tok}"},
        )
        with d.api() as api:
            self.cas_id = api.call("GET", "/v1/status")["cas"]["id"]

    def hello(self, jobs: list[dict] | None = None) -> dict:
        return {
            "protocol": self.protocol,
            "pool": self.pool,
            "image": "",
            "cas_id": self.cas_id,
            "jobs": jobs or [],
            "sample": {"cpus": 1, "load1": 0.0, "memory_available_gb": 8.0, "disk_free_gb": 10.0},
        }

    def post(self, path: str, body: dict):
        return self.http.post(f"/v1/worker/{path}", json={"protocol": self.protocol, **body})

    def register(self) -> HandWorker:
        resp = self.post("register", self.hello())
        assert resp.status_code == 200, resp.text
        return self

    def claim(self, kind: str = "evaluation", timeout: float = 20) -> dict:
        """One lease of `kind`, claimed again until one comes: the assignment (job, token, ...)."""

        def once() -> dict | None:
            resp = self.post("claim", {"want": {kind: 1}})
            assert resp.status_code == 200, resp.text
            got = resp.json()["leases"]
            return got[0] if got else None

        return wait_for(once, timeout, interval=0.1, what=f"worker {self.name} to lease a job")

    def close(self) -> None:
        self.http.close()
