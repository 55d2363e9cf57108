"""The `local` provisioner against a real `piloop serve` and real `piloop worker` processes it starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from piloop_server.provisioner.platform import BACKOFF_BASE_SECONDS, BACKOFF_CAP_FACTOR
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled

BACKOFF = "PILOOP_PROVISIONER_BACKOFF_SECONDS"
FAKE_MODAL = Path(__file__).resolve().parents[1] / "helpers" / "fake_modal"


def _daemon(
    redis_server,
    namespace,
    provisioner: str,
    compute: str = "",
    backoff: float = 30,
    provider: str = "local",
    env: dict | None = None,
) -> Daemon:
    config = (
        FAST_EXECUTOR + "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 1\nmax_load = 1000\n"
        "min_memory_gb = 0\n\n[plugins.executor.pools.gpu.provisioner]\n"
        + provisioner
        + f'\n[plugins.executor.pools.gpu.provisioner.compute]\nprovider = "{provider}"\n'
        + compute
    )
    d = Daemon(
        short_home(),
        config=config,
        redis_url=redis_server.url,
        namespace=namespace,
        env={BACKOFF: str(backoff), **(env or {})},
    )
    d.start(listen=f"127.0.0.1:{free_port()}")
    return d


@pytest.fixture
def started(redis_server, namespace):
    made: list[Daemon] = []

    def make(*a, **kw) -> Daemon:
        made.append(_daemon(redis_server, namespace, *a, **kw))
        return made[-1]

    yield make
    for d in made:
        d.cleanup()


def _submit(d: Daemon, *argv: str) -> str:
    with d.api() as api:
        return api.call("POST", "/v1/jobs", {"kind": "evaluation", "pool": "gpu", "spec": {"argv": list(argv)}})["job"]


def _job(d: Daemon, job: str) -> dict:
    with d.api() as api:
        return api.call("GET", f"/v1/jobs/{job}")


def _gpu_workers(d: Daemon) -> list[dict]:
    with d.api() as api:
        return [w for w in api.call("GET", "/v1/workers") if w["pool"] == "gpu"]


def _prov(d: Daemon) -> dict:
    with d.api() as api:
        return api.call("GET", "/v1/status")["provisioners"][0]


def _events(d: Daemon, type_: str) -> list[dict]:
    with d.api() as api:
        return [e for e in api.call("GET", "/v1/events", params={"count": 10_000}) if e["type"] == type_]


def _server_id(d: Daemon) -> str:
    with d.api() as api:
        return api.call("GET", "/v1/health")["server_id"]


def test_waiting_jobs_start_workers_up_to_max_and_idle_ones_drain_and_stop(started):
    d = started("max = 2\nidle_seconds = 1\n")
    jobs = [_submit(d, "sleep", "1") for _ in range(3)]
    most = 0

    def all_done() -> bool:
        nonlocal most
        p = _prov(d)
        most = max(most, p["starting"] + p["running"] + p["draining"] + p["stopping"])
        return all(_job(d, j)["state"] == "succeeded" for j in jobs)

    wait_for(all_done, 90, interval=0.2, what="three jobs run on started workers")
    assert most == 2
    assert {_job(d, j)["worker"] for j in jobs} <= {e["worker"] for e in _events(d, "provisioner.starting")}
    wait_for(lambda: not _gpu_workers(d), 60, interval=0.2, what="the idle workers drain and stop")
    drained = _events(d, "provisioner.draining")
    assert len(drained) == 2 and all(e["reason"] == "no lease for 1s" for e in drained)
    assert len(_events(d, "provisioner.stopped")) == 2
    st = json.loads(d.cli("status", "--json", check=True).stdout)["provisioners"][0]
    assert (st["max"], st["starting"], st["running"], st["draining"]) == (2, 0, 0, 0)


def _running(d: Daemon, job: str, seen: list[str]) -> bool:
    """Whether `job` runs; each new sight of why it does not (its state, why it waits, the provisioner's events)
    is kept in `seen`, for the message of a wait that times out."""
    v = _job(d, job)
    with d.api() as api:
        evs = [
            e for e in api.call("GET", "/v1/events", params={"count": 10_000}) if e["type"].startswith("provisioner.")
        ]
    why = f"{v['state']} ({v.get('waiting') or '-'}); " + ", ".join(
        f"{e['type'].removeprefix('provisioner.')} {e.get('worker', '')} {e.get('reason', '')}".strip() for e in evs
    )
    if not seen or seen[-1] != why:
        seen.append(why)
    return v["state"] == "running"


def test_a_started_workers_home_is_kept_while_it_runs_and_removed_once_it_stopped(started):
    # idle long enough that a worker slow to claim on a loaded machine is not drained before its first lease
    d = started(f"max = 1\nidle_seconds = {scaled(2):g}\n")
    job = _submit(d, "sleep", "2")
    seen: list[str] = []
    try:
        wait_for(lambda: _running(d, job, seen), 60, interval=0.1, what="the job runs on a started worker")
    except AssertionError as e:
        raise AssertionError(f"{e}; seen: {' | '.join(seen[-5:])}") from None
    worker = _job(d, job)["worker"]
    home = d.home / "provisioned" / worker
    assert (home / "worker.log").stat().st_size > 0 and (home / "work").is_dir()
    wait_for(lambda: _job(d, job)["state"] == "succeeded", 30, interval=0.1, what="the job ends")
    assert home.is_dir()  # idle but running: it may still take a job
    wait_for(lambda: _events(d, "provisioner.stopped"), 30, interval=0.1, what="the idle worker stops")
    assert not home.exists()
    wait_for(lambda: not _prov(d)["stopping"] and not _gpu_workers(d), 30, interval=0.1, what="its record ends")
    assert list((d.home / "provisioned").iterdir()) == []


def test_a_home_no_record_names_and_no_process_runs_in_is_removed_by_the_listing(started):
    d = started("max = 1\n")  # no job waits: the listing alone runs, every 2 s
    provisioned = d.home / "provisioned"
    left, used, notes = provisioned / "gpu-77", provisioned / "gpu-78", provisioned / "notes"
    for h in (left, used, notes):
        (h / "work").mkdir(parents=True)
        (h / "worker.log").write_bytes(b"event=worker.started\n")
    # a job's shim of a worker that is gone still runs in its home, under another server's tag: kept while it does
    env = {**os.environ, "PILOOP_HOME": str(used), "PILOOP_PROVISIONER_TAG": "another-server"}
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(60)"], env=env)
    try:
        wait_for(lambda: not left.exists(), 20, interval=0.1, what="the left-over home is removed")
        wait_for(lambda: _events(d, "provisioner.home_removed"), 10, what="the provisioner.home_removed event")
        assert [e["worker"] for e in _events(d, "provisioner.home_removed")] == ["gpu-77"]
        assert used.is_dir() and notes.is_dir()
    finally:
        proc.kill()
        proc.wait(5)
    wait_for(lambda: not used.exists(), 20, interval=0.1, what="the home is removed once nothing runs in it")
    assert notes.is_dir()  # not named like a started worker: never touched


def test_max_0_drains_the_pool_and_stops_a_worker_only_once_it_holds_no_lease(started):
    d = started("max = 1\nidle_seconds = 600\n")
    job = _submit(d, "sleep", "3")
    wait_for(lambda: _job(d, job)["state"] == "running", 60, interval=0.1, what="the job runs on a started worker")
    worker = _job(d, job)["worker"]
    d.cli("limits", "set", "executor.pools.gpu.provisioner.max=0", "--reason", "the GPU budget is spent", check=True)
    wait_for(
        lambda: [w["no_lease"] for w in _gpu_workers(d)] == ["draining"], 10, interval=0.1, what="the worker drains"
    )
    later = _submit(d, "true")
    wait_for(lambda: _job(d, job)["state"] == "succeeded", 30, interval=0.1, what="the held job runs to its end")
    wait_for(lambda: not _gpu_workers(d), 30, interval=0.1, what="the drained worker stops")
    assert [e["worker"] for e in _events(d, "provisioner.stopped")] == [worker]
    assert _job(d, later)["state"] == "queued" and _prov(d)["starting"] == 0


def test_a_worker_that_never_registers_is_stopped_and_the_backoff_doubles(started):
    d = started("max = 1\nregister_seconds = 1\n", "hang = true\n", backoff=1)
    _submit(d, "true")
    wait_for(
        lambda: [w["no_lease"] for w in _gpu_workers(d)] == ["starting"],
        30,
        interval=0.1,
        what="a starting row in worker list",
    )
    wait_for(lambda: _prov(d)["backoff_seconds"] == 1, 30, interval=0.1, what="the first backoff")
    wait_for(lambda: _prov(d)["backoff_seconds"] == 2, 30, interval=0.1, what="the backoff doubles")
    st = json.loads(d.cli("status", "--json", check=True).stdout)["provisioners"][0]
    assert st["backoff_seconds"] >= 2 and "did not register within 1s" in st["last_failure"]
    # the stop of the second is a platform call of its own, made just after the pass decided it
    wait_for(lambda: len(_events(d, "provisioner.stopped")) >= 2, 10, interval=0.1, what="both workers stopped")
    # the hung processes were stopped: none of this server's is left but the newest
    tag = _server_id(d)
    wait_for(lambda: len(_tagged(tag)) <= 1, 15, interval=0.2, what="the hung workers are stopped")


def _tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("PILOOP_PROVISIONER_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_three_refusals_in_a_row_are_one_escalation(started):
    d = started("max = 1\n", "refuse = true\n", backoff=0.1)
    _submit(d, "true")
    wait_for(lambda: _prov(d)["refusals"] >= 5, 60, interval=0.1, what="five refusals")
    with d.api() as api:
        esc = [e for e in api.call("GET", "/v1/inbox") if e["what"] == "provisioner.refused"]
    assert len(esc) == 1 and "refused 3 starts in a row for pool gpu" in esc[0]["message"]
    assert "provisioner.refused: the platform refused 3 starts" in d.cli("status", check=True).stdout
    listed = json.loads(d.cli("inbox", "--json", check=True).stdout)
    assert [e["id"] for e in listed if e["what"] == "provisioner.refused"] == [esc[0]["id"]]
    d.cli("inbox", "ack", esc[0]["id"], check=True)
    assert "provisioner.refused" not in d.cli("status", check=True).stdout


def _ms(e: dict) -> int:
    """An event's time: its stream id's milliseconds, on Redis's clock like every provisioner deadline."""
    return int(e["id"].split("-")[0])


def _backoffs(d: Daemon) -> list[tuple[float, int | None]]:
    """Each backoff of the pool, oldest first: its seconds, and the ms from the moment its wait began (the event's
    `until_ms` less the wait: the event itself is written a few calls later) until the pool started another (None:
    not yet)."""
    evs = sorted(_events(d, "provisioner.backoff") + _events(d, "provisioner.starting"), key=_ms)
    out: list[tuple[float, int | None]] = []
    for i, e in enumerate(evs):
        if e["type"] == "provisioner.backoff":
            nxt = next((n for n in evs[i + 1 :] if n["type"] == "provisioner.starting"), None)
            began = int(e["until_ms"]) - round(float(e["seconds"]) * 1000)
            out.append((float(e["seconds"]), _ms(nxt) - began if nxt else None))
    return out


def _assert_waited(got: list[tuple[float, int | None]], base: float) -> None:
    """base, doubling to 20 × base (30 s to 10 minutes at the default base), each waited out before the next start."""
    want = [base * 2**i for i in range(5)] + [base * BACKOFF_CAP_FACTOR] * 2
    assert [s for s, _ in got[: len(want)]] == pytest.approx(want), got
    for seconds, after_ms in got[: len(want) - 1]:
        assert after_ms is not None and after_ms >= seconds * 1000, got  # never another start sooner


def test_the_start_backoff_defaults_to_30_s_doubling_to_10_minutes(started):
    assert (BACKOFF_BASE_SECONDS, BACKOFF_BASE_SECONDS * BACKOFF_CAP_FACTOR) == (30, 600)
    d = started("max = 1\nregister_seconds = 1\n", "hang = true\n", env={BACKOFF: ""})  # unset: the default base
    _submit(d, "true")
    (b,) = wait_for(lambda: _events(d, "provisioner.backoff"), 30, interval=0.1, what="the first backoff")
    assert float(b["seconds"]) == 30 and "did not register within 1s" in b["reason"]
    p = _prov(d)
    assert p["backoff_seconds"] == 30 and 20 < p["backoff_left_seconds"] <= 30, p
    assert len(_events(d, "provisioner.starting")) == 1  # the next start waits out those 30 s


def test_a_worker_that_never_registers_is_stopped_and_each_wait_doubles_to_the_cap_before_the_next(started):
    base = 0.25
    d = started("max = 1\nregister_seconds = 1\n", "hang = true\n", backoff=base)
    tag = _server_id(d)
    _submit(d, "true")
    got = wait_for(lambda: len(b := _backoffs(d)) >= 7 and b, 90, interval=0.2, what="seven failed starts")
    _assert_waited(got, base)
    # each was stopped for not registering, as its own platform call
    stopping = _events(d, "provisioner.stopping")
    assert len(stopping) >= 7 and all(e["reason"] == "not registered within 1s" for e in stopping), stopping
    names = [e["worker"] for e in _events(d, "provisioner.starting")]
    assert len(set(names)) == len(names)  # a new worker each time
    wait_for(
        lambda: set(names[:7]) <= {e["worker"] for e in _events(d, "provisioner.stopped")},
        15,
        interval=0.2,
        what="the first seven stopped",
    )
    # and their hung processes are gone: at most the newest of this server's is left
    wait_for(lambda: len(_tagged(tag)) <= 1, 15, interval=0.2, what="the hung workers' processes to end")
    assert {p.environ().get("PILOOP_PROVISIONED_NAME") for p in _tagged(tag)} <= {names[-1]}


def test_a_refused_start_backs_off_the_same_way_and_the_third_in_a_row_is_one_inbox_item(started):
    base = 0.1
    d = started("max = 1\n", "refuse = true\n", backoff=base)
    _submit(d, "true")
    got = wait_for(lambda: len(b := _backoffs(d)) >= 7 and b, 60, interval=0.1, what="seven refused starts")
    _assert_waited(got, base)
    backoffs = sorted(_events(d, "provisioner.backoff"), key=_ms)
    assert all("refuses every start" in e["reason"] for e in backoffs)
    (esc,) = [e for e in _events(d, "escalation") if e.get("what") == "provisioner.refused"]
    assert _ms(backoffs[2]) <= _ms(esc) < _ms(backoffs[3])  # at the third refusal, not before, never again
    with d.api() as api:
        inbox = [e for e in api.call("GET", "/v1/inbox") if e["what"] == "provisioner.refused"]
    assert len(inbox) == 1 and "refused 3 starts in a row for pool gpu" in inbox[0]["message"], inbox


def test_an_unknown_process_tagged_as_ours_is_stopped_and_another_servers_is_not(started, tmp_path):
    d = started("max = 1\n")
    code = "import time\nwhile True: time.sleep(60)"
    procs = []
    for tag in (_server_id(d), "another-server"):
        env = {
            **os.environ,
            "PILOOP_PROVISIONER_TAG": tag,
            "PILOOP_PROVISIONED_NAME": "gpu-999",
            "PILOOP_PROVISIONED_POOL": "gpu",
        }
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(d.home)], env=env, start_new_session=True))
    try:
        wait_for(lambda: procs[0].poll() is not None, 20, interval=0.1, what="the unknown tagged process stops")
        # the event is written just after the stop: wait for it, then say it came once, for the right process
        wait_for(lambda: _events(d, "provisioner.unknown_stopped"), 10, what="the provisioner.unknown_stopped event")
        assert [e["worker"] for e in _events(d, "provisioner.unknown_stopped")] == ["gpu-999"]
        assert procs[1].poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(5)


def test_a_killed_started_worker_is_stopped_and_its_job_comes_back_on_another(started):
    d = started("max = 1\nidle_seconds = 600\n")
    job = _submit(d, "sleep", "2")
    wait_for(lambda: _job(d, job)["state"] == "running", 60, interval=0.1, what="the job runs on a started worker")
    first = _job(d, job)["worker"]
    pid = _worker_pid(d, first)
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: _job(d, job)["state"] == "succeeded" and _job(d, job)["worker"] != first,
        90,
        interval=0.2,
        what="the job runs again on a new worker",
    )
    reasons = [e["reason"] for e in _events(d, "provisioner.stopping") if e["worker"] == first]
    assert reasons and reasons[0] in ("the platform lost it", "it went silent")


def _worker_pid(d: Daemon, name: str) -> int:
    for p in psutil.process_iter():
        try:
            env = p.environ()
        except psutil.Error:
            continue
        named = env.get("PILOOP_PROVISIONED_NAME") == name and "worker" in p.cmdline()
        if named and env.get("PILOOP_PROVISIONER_TAG") == _server_id(d):
            # the worker, not its shim host: its parent (init, since it was started detached) is not of it
            try:
                parent = psutil.Process(p.ppid()).environ().get("PILOOP_PROVISIONED_NAME")
            except psutil.Error:
                parent = None
            if parent != name:
                return p.pid
    raise AssertionError(f"no process for worker {name}")


def test_a_started_worker_exits_by_itself_once_its_server_is_gone(started):
    d = started("max = 1\nidle_seconds = 600\norphan_exit_seconds = 1\n")
    job = _submit(d, "true")
    wait_for(lambda: _job(d, job)["state"] == "succeeded", 60, interval=0.1, what="the job runs on a started worker")
    proc = psutil.Process(_worker_pid(d, _job(d, job)["worker"]))
    d.kill()

    def gone() -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 30, interval=0.2, what="the orphaned worker exits")


@pytest.mark.parametrize(
    "mode, what, says",
    [
        ("quota", "provisioner.refused", "refused 3 starts in a row for pool gpu: modal: no A100 is free"),
        ("auth", "provisioner.auth", "refused the server's credentials for pool gpu: modal: token is invalid"),
    ],
)
def test_modal_a_quota_backs_off_and_bad_credentials_stop_the_pool(started, mode, what, says):
    # the daemon imports the fake SDK (tests/helpers/fake_modal) as `modal`
    d = started(
        "max = 1\n",
        'image = "ghcr.io/acme/piloop-worker:0.3"\ngpu = "A100"\n',
        backoff=0.1,
        provider="modal",
        env={"PYTHONPATH": str(FAKE_MODAL), "FAKE_MODAL_MODE": mode},
    )
    _submit(d, "true")

    def escalated() -> list:
        with d.api() as api:
            return [e for e in api.call("GET", "/v1/inbox") if e["what"] == what]

    esc = wait_for(escalated, 30, interval=0.1, what=f"the {what} escalation")
    assert len(esc) == 1 and says in esc[0]["message"]
    if mode == "auth":
        assert "token is invalid" in _prov(d)["halted"]
        assert _prov(d)["refusals"] == 0


def test_a_worker_whose_server_is_gone_before_it_registered_exits_once_orphaned():
    # a server that is not there (a free port nobody listens on); the worker has never registered
    url = f"http://127.0.0.1:{free_port()}"
    procs = {}
    for which, extra in (("orphan", {"PILOOP_ORPHAN_EXIT_SECONDS": "1"}), ("operator's", {})):
        home = short_home("w")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PILOOP_")},
            "PILOOP_HOME": str(home),
            "PILOOP_HTTPS_TOKEN": "plt_" + "x" * 43,
            **extra,
        }
        log = open(home / "worker.log", "wb")
        procs[which] = (
            subprocess.Popen(
                [sys.executable, "-m", "piloop_common.cli", "worker", "--server", url, "--pool", "gpu"],
                env=env,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            ),
            home,
        )
    try:
        orphan, home = procs["orphan"]
        assert orphan.wait(30) == 0
        assert "event=worker.orphaned" in (home / "worker.log").read_text()
        assert procs["operator's"][0].poll() is None  # without the variable a worker never exits on its own
    finally:
        for p, home in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
            subprocess.run(["pkill", "-9", "-f", str(home)], check=False)  # its shim host
