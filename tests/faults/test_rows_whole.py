"""Faults table rows made whole, for real: the machine sleeps (a frozen cgroup holding the daemon, its Redis and the
job), `piloop serve` restarts under an agent, a started worker goes silent, two servers share one account, and a
worker dies during a run while most of its pool is silent (the disruption hold)."""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import psutil
import pytest

from piloop_common.errors import PiloopError
from piloop_common.sdk.client import ApiClient
from piloop_server.provisioner.base import NAME_ENV, TAG_ENV
from tests.helpers.freezer import Freezer, group, tree
from tests.helpers.jobprocs import supervisor_of
from tests.helpers.redis import free_port, redis_process, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, cli_env, fast_executor, short_home
from tests.helpers.workers import (
    FENCE_AFTER,
    GRACE,
    TOLERATION,
    events,
    marker_job,
    marker_runs,
    overlapping,
    pgid_alive,
    state,
    submit,
    token,
    view,
)

SLOW_TOLERATION = 20.0  # the restart test's: its jobs are fenced 19 s after their worker's last acknowledged send


@pytest.fixture
def freezer() -> Iterator[Freezer]:
    f, why = Freezer.open(f"piloop-test-{os.getpid()}-{time.monotonic_ns()}")
    if f is None:
        pytest.skip(f"no writable cgroup v1 freezer: {why}")
    try:
        yield f
    finally:
        f.close()


def _ticks(marker, job: str) -> list[float]:
    """The times of a job's marker lines, in order."""
    return [float(line.split()[5]) for line in marker.read_text().splitlines() if f" {job} " in line]


def _answers(d: Daemon) -> bool:
    try:
        with ApiClient.local(d.home, timeout=0.3) as api:
            return bool(api.call("GET", "/v1/health")["ok"])
    except PiloopError:
        return False


def _pongs(port: int) -> bool:
    """Whether Redis answers a PING within 0.3 s (one try: a client library would retry)."""
    with socket.create_connection(("127.0.0.1", port), timeout=0.3) as s:
        s.sendall(b"PING\r\n")
        try:
            return s.recv(16).startswith(b"+PONG")
        except TimeoutError:
            return False


def test_the_machine_sleeps_a_frozen_daemon_redis_and_job_past_grace_expire_nothing_and_finish_once(
    freezer, tmp_path, namespace
):
    with redis_process(tmp_path / "redis") as rp:
        d = Daemon(short_home(), redis_url=rp.url, namespace=namespace)
        try:
            d.start()
            marker = tmp_path / "marker"
            job = marker_job(d, marker, pool="serve", seconds=5)
            run = wait_for(
                lambda: (r := marker_runs(marker).get(job)) and r[0], 20, interval=0.05, what="the job to start"
            )
            state(d, job, "running")
            supervisor = supervisor_of(run["pid"])
            assert d.proc is not None and rp.proc is not None

            def machine() -> set[int]:
                # the daemon with its `serve` worker and everything under it; its Redis; the job's supervisor (a
                # session of its own) and the job's process group
                return tree(d.proc.pid) | {rp.proc.pid, supervisor} | group(run["pgid"])

            assert _answers(d) and _pongs(rp.port)  # so their silence below is the freeze's
            freezer.add(machine())
            freezer.freeze()
            asleep = time.monotonic()
            assert machine() <= freezer.procs()  # nothing was left running, nothing forked outside meanwhile
            assert not _answers(d)
            assert not _pongs(rp.port)
            # asleep longer than grace (2 s), shorter than the fence (5 s after the last acknowledged send, at most
            # one renew before the freeze): the freezer, like SIGSTOP, lets CLOCK_MONOTONIC run on
            wait_for(lambda: time.monotonic() > asleep + GRACE + 1, GRACE + 2, what="the sleep to outlast grace")
            freezer.thaw()
            slept = time.monotonic() - asleep
            assert GRACE < slept < FENCE_AFTER - 1, slept

            v = state(d, job, timeout=30)
            assert v["state"] == "succeeded" and v["attempts"] == 1, v
            (rearmed,) = events(d, "daemon.rearmed")
            assert int(rearmed["gap_ms"]) > GRACE * 1000 and int(rearmed["leases"]) >= 1, rearmed
            assert not events(d, "lease.expired")
            mine = [e["type"] for e in events(d) if e.get("job") == job]
            assert mine.count("lease.granted") == 1 and mine.count("job.succeeded") == 1, mine
            assert mine.count("job.queued") == 1, mine  # the submit's; never queued again
            runs = marker_runs(marker)[job]
            assert len(runs) == 1 and runs[0]["ended"] and runs[0]["token"] == run["token"], runs
            # the job itself slept: its 50 ms ticks stop for the freeze and go on, in the same run
            ticks = _ticks(marker, job)
            assert max(b - a for a, b in itertools.pairwise(ticks)) > GRACE, ticks
        finally:
            freezer.close()  # before the cleanup stops them: a frozen process takes no signal
            d.cleanup()


# An agent that says `before` through its worker's relay, waits for $GO, then says `after` the same way: the second
# call goes through whichever worker holds its lease by then. Its start and end go to $MARKER with its group.
RELAYING_AGENT = f"""
echo "start $PILOOP_JOB $(ps -o pgid= $$ | tr -d ' ')" >> "$MARKER"
{sys.executable} -m piloop_common.cli progress before || exit 3
while [ ! -e "$GO" ]; do sleep 0.05; done
{sys.executable} -m piloop_common.cli progress after || exit 4
echo "end $PILOOP_JOB" >> "$MARKER"
"""


def _stop_serve(d: Daemon) -> str:
    """`piloop stop`, as an operator runs it; the test's Popen is the daemon's parent and reaps it."""
    stopper = subprocess.Popen(
        [sys.executable, "-m", "piloop_common.cli", "stop"],
        env=cli_env(d.home, d.env),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert d.proc is not None
    d.proc.wait(40)
    return stopper.communicate(timeout=20)[0]


@pytest.fixture
def slow_fence(redis_server, namespace) -> Iterator[Daemon]:
    """`piloop serve` whose jobs are fenced 19 s after their worker's last acknowledged send, not 5 s: a restart of
    the daemon on a loaded machine takes about 5 s, and the row holds only for a restart within the fence."""
    d = Daemon(
        short_home(), config=fast_executor(SLOW_TOLERATION), redis_url=redis_server.url, namespace=namespace
    ).start()
    yield d
    d.cleanup()


def test_piloop_serve_restarts_under_an_agent_its_worker_reattaches_relays_again_and_it_finishes_once(
    slow_fence, tmp_path
):
    d, marker, go = slow_fence, tmp_path / "marker", tmp_path / "go"
    opts = ("--campaign", "c1", "--env", f"MARKER={marker}", "--env", f"GO={go}")
    job = submit(d, "sh", "-c", RELAYING_AGENT, pool="serve", kind="agent", opts=opts)
    wait_for(lambda: [n["note"] for n in view(d, job)["progress"]] == ["before"], 30, interval=0.1, what="before")
    (started,) = [line.split() for line in marker.read_text().splitlines()]  # start <job> <its process group>
    pgid = int(started[2])
    assert started[1] == job and pgid_alive(pgid), started
    stopped = time.monotonic()
    out = _stop_serve(d)
    assert "its worker's jobs run on" in out, out  # detached: under their supervisors
    assert pgid_alive(pgid)  # detached, not stopped: it waits for $GO, so it cannot have ended by itself
    d.start(listen=d.listen)
    log = d.home / "logs" / "worker-serve.log"
    wait_for(
        lambda: re.search(rf"event=job\.reattached job={job} token=\S+ status=ok", log.read_text()),
        30,
        interval=0.1,
        what="the restarted worker to re-attach the agent",
    )
    assert time.monotonic() - stopped < SLOW_TOLERATION - 1  # within the fence: the row's case
    go.touch()
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded", v
    # its `piloop` call after the restart went through the new worker's relay, under the same lease
    assert [n["note"] for n in v["progress"]] == ["before", "after"], v
    assert marker.read_text().splitlines() == [f"start {job} {pgid}", f"end {job}"]  # one run, never restarted
    mine = [e["type"] for e in events(d) if e.get("job") == job]
    assert mine.count("lease.granted") == 1 and "lease.expired" not in mine and "job.requeued" not in mine, mine
    assert mine.count("job.succeeded") == 1, mine
    assert log.read_text().count(f"event=job.reattached job={job} ") == 1


def _provisioned(redis_url: str, namespace: str) -> Daemon:
    """`piloop serve` on TCP whose pool `gpu` (one evaluation a worker) is started by the `local` provider: `piloop
    worker` processes on this machine, under this user, tagged with the server's id."""
    config = (
        FAST_EXECUTOR + "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 1\nmax_load = 1000\n"
        "min_memory_gb = 0\n\n[plugins.executor.pools.gpu.provisioner]\nmax = 1\nidle_seconds = 600\n\n"
        '[plugins.executor.pools.gpu.provisioner.compute]\nprovider = "local"\n'
    )
    d = Daemon(short_home(), config=config, redis_url=redis_url, namespace=namespace)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return d


@pytest.fixture
def provisioned(redis_server) -> Iterator[Callable[[], Daemon]]:
    """Make provisioned servers, each in a namespace of its own on the session Redis (so each has its own id)."""
    made: list[Daemon] = []

    def make() -> Daemon:
        made.append(_provisioned(redis_server.url, "t" + uuid.uuid4().hex[:10]))
        return made[-1]

    yield make
    for d in made:
        d.cleanup()  # its started workers' homes are under its own: the cleanup's pkill of it takes them too


def _server_id(d: Daemon) -> str:
    with d.api() as api:
        return api.call("GET", "/v1/health")["server_id"]


def _started_worker(tag: str, name: str) -> psutil.Process:
    """The started worker `name` of the server tagged `tag`: the top of the tree that carries its name (its shim
    host and jobs inherit the environment)."""
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get(TAG_ENV) != tag or env.get(NAME_ENV) != name or p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        try:
            parent = psutil.Process(p.ppid()).environ().get(NAME_ENV)
        except psutil.Error:  # init, whose environment may be closed to us
            parent = None
        if parent != name:
            return p
    raise AssertionError(f"no process for worker {name} of server {tag}")


def _of_server(d: Daemon, type_: str, worker: str | None = None) -> list[dict]:
    return [e for e in events(d, type_) if worker is None or e.get("worker") == worker]


def test_a_started_worker_that_goes_silent_is_stopped_and_its_job_comes_back_on_another(provisioned, tmp_path):
    d, marker = provisioned(), tmp_path / "marker"
    tag = _server_id(d)
    job = marker_job(d, marker, first_forever=True)  # the first run runs until it is stopped
    first = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[0], 60, interval=0.1, what="the first run")
    state(d, job, "running")
    name = first["where"]
    worker = _started_worker(tag, name)
    assert os.getpgid(worker.pid) == worker.pid  # a session of its own: the worker (its slots' supervisors have theirs)
    ours = group(worker.pid)
    assert worker.pid in ours, ours
    os.killpg(worker.pid, signal.SIGSTOP)  # it goes silent: alive on the platform, no heartbeat
    (stopping,) = wait_for(
        lambda: _of_server(d, "provisioner.stopping", name), GRACE + 10, interval=0.1, what="the server to stop it"
    )
    assert stopping["reason"] == "it went silent", stopping  # not lost: the platform still lists it
    wait_for(lambda: _of_server(d, "provisioner.stopped", name), 30, interval=0.1, what="provisioner.stopped")
    # stopped: the worker, though SIGSTOPped (a stopped process takes no SIGTERM)
    wait_for(lambda: not group(worker.pid), 10, interval=0.1, what=f"the processes of {name} to be gone")
    assert not pgid_alive(first["pgid"])  # its job was fenced by its slot's supervisor
    # by its stop, not left for the listing to find as a process it has no record of
    assert not _of_server(d, "provisioner.unknown_stopped", name)
    v = state(d, job, "succeeded", timeout=60)
    second = v["worker"]
    assert second != name and v["attempts"] == 1, v
    started = [e["worker"] for e in _of_server(d, "provisioner.starting")]
    assert started == [name, second], started  # the pool started another, since the job still waited
    runs = marker_runs(marker)[job]
    assert [r["where"] for r in runs] == [name, second] and not overlapping(runs), runs
    (expired,) = [e for e in events(d, "lease.expired") if e["job"] == job]
    assert expired["token"].split(".")[0] == first["token"].split(".")[0], expired


def _handle_id(pid: int) -> str:
    """The id the `local` provider gives a process: its pid and start time."""
    return f"{pid}:{psutil.Process(pid).create_time():.2f}"


def test_two_servers_on_one_account_never_stop_each_others_workers_and_each_runs_its_own_jobs(provisioned, tmp_path):
    marker, go = tmp_path / "marker", tmp_path / "go"
    servers = [provisioned(), provisioned()]  # one machine, one user: the `local` provider's one account
    tags = [_server_id(d) for d in servers]
    assert tags[0] != tags[1]
    # each job says which server's worker runs it, then runs until the test lets it end
    script = f'echo "$PILOOP_PROVISIONER_TAG $PILOOP_JOB" >> {marker}; while [ ! -e {go} ]; do sleep 0.05; done'
    jobs = [submit(d, "sh", "-c", script) for d in servers]
    views = [state(d, j, "running", timeout=60) for d, j in zip(servers, jobs, strict=True)]
    ours = [_started_worker(tag, v["worker"]) for tag, v in zip(tags, views, strict=True)]
    # a process tagged by each server that neither has a record of, started once both servers' workers run: the
    # listing that stops it ran while the other server's worker was there to be seen
    code = "import time\nwhile True: time.sleep(60)"
    canaries, handles = [], []
    for d, tag in zip(servers, tags, strict=True):
        env = {**os.environ, TAG_ENV: tag, NAME_ENV: "gpu-999", "PILOOP_PROVISIONED_POOL": "gpu"}
        canaries.append(subprocess.Popen([sys.executable, "-c", code, str(d.home)], env=env, start_new_session=True))
        handles.append(_handle_id(canaries[-1].pid))
    try:
        for d, c in zip(servers, canaries, strict=True):
            wait_for(lambda c=c: c.poll() is not None, 30, interval=0.1, what=f"the canary tagged {_server_id(d)}")
            wait_for(lambda d=d: _of_server(d, "provisioner.unknown_stopped"), 10, what="provisioner.unknown_stopped")
        for d, h in zip(servers, handles, strict=True):
            # each stopped its own canary, and nothing else: not the other's worker, not the other's canary
            assert [e["handle"] for e in _of_server(d, "provisioner.unknown_stopped")] == [h]
            assert not _of_server(d, "provisioner.stopping")
        for p in ours:
            assert p.is_running() and p.status() != psutil.STATUS_ZOMBIE, p
    finally:
        for c in canaries:
            if c.poll() is None:
                c.kill()
            c.wait(5)
    go.touch()
    for d, j, v, p in zip(servers, jobs, views, ours, strict=True):
        done = state(d, j, "succeeded", timeout=30)
        assert done["worker"] == v["worker"] and done["attempts"] == 1, done
        assert [e["worker"] for e in _of_server(d, "provisioner.starting")] == [v["worker"]]
        assert p.is_running()  # its worker, idle now, runs on: idle_seconds is 600
    # each job ran on a worker its own server started (both pools name theirs gpu-1: the tag tells them apart)
    assert sorted(marker.read_text().splitlines()) == sorted(f"{t} {j}" for t, j in zip(tags, jobs, strict=True))


def _reachable(d: Daemon) -> dict[str, bool]:
    with d.api() as api:
        return {w["name"]: w["reachable"] for w in api.call("GET", "/v1/workers") if w["pool"] == "gpu"}


def _ms(e: dict) -> int:
    return int(e["id"].split("-")[0])  # a stream id is the Redis time (ms) the event was added


def test_a_worker_dies_during_a_run_while_most_of_its_pool_is_held_its_run_ends_worker_lost_once_the_hold_ends(
    server, workers, tmp_path
):
    d, marker = server, tmp_path / "marker"
    g1 = workers(d, token(d, "g1")).start()
    job = marker_job(d, marker, kind="agent", seconds=1000)
    run = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[0], 20, interval=0.05, what="the agent to start")
    assert state(d, job, "running")["worker"] == "g1"
    g2, g3 = (workers(d, token(d, n)).start() for n in ("g2", "g3"))
    wait_for(lambda: _reachable(d) == dict.fromkeys(("g1", "g2", "g3"), True), 30, interval=0.1, what="3 workers")
    g1.kill()  # it really dies, with its shim host; the agent's shim lives on and fences it
    g2.pause()  # and one more goes silent at once: 2 of 3, which looks like the network, so the pool is held
    silent = time.monotonic()
    try:
        (disrupted,) = wait_for(
            lambda: [e for e in events(d, "escalation") if e.get("what") == "pool.disrupted"],
            GRACE + 10,
            interval=0.1,
            what="the hold",
        )
        assert "2 of 3 workers of pool gpu went silent at once" in disrupted["message"], disrupted
        # fenced by its own shim, though its worker is dead and the pool held: before its lease's time
        wait_for(lambda: not pgid_alive(run["pgid"]), FENCE_AFTER + 3, interval=0.05, what="the agent to be fenced")
        assert time.monotonic() - silent < TOLERATION
        # past the time its lease would have expired (toleration after g1's last renewal, and a pass): held
        wait_for(lambda: time.monotonic() > silent + TOLERATION + 1.5, TOLERATION + 3)
        assert view(d, job)["state"] == "running"
        assert not [e for e in events(d, "lease.expired") if e["job"] == job]
    finally:
        g2.resume()  # the silent one is back: only the dead one is silent, 1 of 3, and the hold ends
    (ended,) = wait_for(lambda: events(d, "pool.disruption_ended"), 15, interval=0.1, what="the hold to end")
    assert ended["reason"] == "recovered", ended
    v = state(d, job, timeout=TOLERATION + 10)
    assert v["state"] == "worker_lost" and v["attempts"] == 0 and "went silent" in v["reason"], v
    (expired,) = [e for e in events(d, "lease.expired") if e["job"] == job]
    assert expired["then"] == "worker_lost" and expired["token"].split(".")[0] == run["token"].split(".")[0], expired
    assert _ms(expired) >= _ms(ended)  # once the hold ended, not before
    mine = [e["type"] for e in events(d) if e.get("job") == job]
    assert mine == ["job.queued", "lease.granted", "lease.expired"], mine  # granted once, ended once
    # one run, never run again (g2 and g3 were free all along); it ended when fenced, not by itself
    runs = marker_runs(marker)[job]
    assert len(runs) == 1 and runs[0]["where"] == "g1" and not runs[0]["ended"], runs
    assert g3.alive and g2.alive
