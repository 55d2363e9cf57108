"""One worker token trying to grow Redis without bound, over real HTTP against a real `piloop serve` whose
[plugins.state] caps are small: log appends past the cap are counted, not kept, by chunks and by bytes (the sizes
the CAS holds, whatever the worker says); a report over the report cap is
refused naming the cap and the job is as it was; a stale report is kept as its size and addresses, never its body;
a job's view is bounded; the events stream is bounded in entries and in memory after many events.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import redis

from piloop_common.cas.local import LocalStore
from piloop_common.protocol.worker import HELD_MOST, LOG_CHUNKS_PER_CALL, RELAY_JOB_HEADER, RELAY_TOKEN_HEADER
from piloop_server.state.keys import Keys
from tests.helpers import adversary
from tests.helpers.adversary import executor, live_beats, pool
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import Daemon, short_home
from tests.helpers.workers import HandWorker, events, kill_tree_of, submit, token, view

LOG_MOST, REPORT_MOST, EVENTS_MOST, VALUE_MOST, PROGRESS_KEEP = 50, 4096, 1000, 64, 5
LOG_BYTES, CHUNK, RESULT_BYTES = 64 * 1024, 8192, 4096
CONFIG = (
    executor(20, 60)
    + pool("gpu", 1, 8)
    + f"""
[plugins.state]
events_max = {EVENTS_MOST}
event_value_bytes = {VALUE_MOST}
log_chunks_max = {LOG_MOST}
log_max_bytes = {LOG_BYTES}
result_max_bytes = {RESULT_BYTES}
report_max_bytes = {REPORT_MOST}
progress_keep = {PROGRESS_KEEP}
"""
)


def addr(i: int) -> str:
    return "sha256:" + f"{i:064x}"


@dataclass
class World:
    d: Daemon
    r: redis.Redis
    ns: str
    w: HandWorker
    holder: HandWorker

    def chunk(self, i: int, size: int = 0) -> str:
        """A log chunk in the daemon's CAS: `chunk i` or `size` bytes of it."""
        data = f"chunk {i}\n".encode()
        return LocalStore(self.d.home / "cas").put_bytes((data * (size // len(data) + 1))[:size] if size else data)

    @property
    def k(self) -> Keys:
        return Keys(self.ns)

    def volatile(self, key: str) -> bool:
        return key in live_beats(self.k, (self.w.name, self.holder.name)) or key.startswith(self.k.rq_prefix())


@pytest.fixture(scope="module")
def world(redis_server):
    ns = "t" + uuid.uuid4().hex[:10]
    d = Daemon(short_home(), config=CONFIG + f'url = "{redis_server.url}"\n', namespace=ns)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    r = redis.Redis.from_url(redis_server.url)
    made: list[HandWorker] = []
    try:
        for name in ("greedy", "holder"):
            made.append(HandWorker(d, name, token(d, name, "--pool", "gpu"), "gpu").register())
        yield World(d, r, ns, made[0], made[1])
    finally:
        for w in made:
            w.close()
        d.cleanup()
        kill_tree_of(str(d.home))
        r.close()


def snapshot(w: World, volatile: bool = False) -> dict[str, object]:
    """Every key of the namespace, whole; the live-beat keys aside unless `volatile`."""
    return adversary.snapshot(w.r, w.k, (lambda key: False) if volatile else w.volatile)


def leased(w: World, by: HandWorker | None = None) -> dict:
    by = by or w.w
    beat(by)
    job = submit(w.d, "true", pool="gpu")
    got = by.claim()
    assert got["job"] == job, got
    return got


def beat(by: HandWorker) -> None:
    """Keep the hand worker live (it beats only here): the module outlasts its `alive` key."""
    assert by.post("heartbeat", by.hello()).status_code == 200


def finish(w: World, a: dict, by: HandWorker | None = None, log: list[str] | None = None) -> dict:
    body = {
        "report_id": "r" + uuid.uuid4().hex[:12],
        "job": a["job"],
        "token": a["token"],
        "outcome": "succeeded",
        "exit_code": 0,
        "log": log or [],
    }
    resp = (by or w.w).post("report", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_log_appends_past_the_cap_are_counted_not_kept(world):
    a = leased(world)
    job, key = a["job"], world.k.job_log(a["job"])
    dropped = []
    for n in range(4):  # 4 × 256 chunks, the cap 50
        chunks = [world.chunk(n * LOG_CHUNKS_PER_CALL + i) for i in range(LOG_CHUNKS_PER_CALL)]
        resp = world.w.post("log", {"job": job, "token": a["token"], "chunks": chunks})
        assert resp.status_code == 200, resp.text
        dropped.append(resp.json()["dropped"])
    assert dropped == [LOG_CHUNKS_PER_CALL - LOG_MOST] + [LOG_CHUNKS_PER_CALL] * 3, dropped
    assert world.r.llen(key) == LOG_MOST
    assert [c.decode() for c in world.r.lrange(key, 0, -1)] == [world.chunk(i) for i in range(LOG_MOST)]
    assert int(world.r.hget(world.k.job(job), "log_dropped") or b"0") == 4 * LOG_CHUNKS_PER_CALL - LOG_MOST
    assert world.r.memory_usage(key) < LOG_MOST * 200, world.r.memory_usage(key)
    # a call over the per-call cap is refused whole
    many = [addr(i) for i in range(LOG_CHUNKS_PER_CALL + 1)]
    resp = world.w.post("log", {"job": job, "token": a["token"], "chunks": many})
    assert resp.status_code in (400, 413, 422), resp.text
    assert world.r.llen(key) == LOG_MOST
    finish(world, a)


def test_log_bytes_past_the_cap_are_not_kept_whatever_the_worker_says(world):
    a = leased(world)
    job, key, tok = a["job"], world.k.job_log(a["job"]), a["token"]
    big = [world.chunk(9000 + i, CHUNK) for i in range(20)]  # 160 KiB, the cap 64 KiB: 8 chunks fit
    dropped = [
        world.w.post("log", {"job": job, "token": tok, "chunks": c}).json()["dropped"] for c in (big[:5], big[5:])
    ]
    assert dropped == [0, 12], dropped
    small = world.chunk(9100)  # a chunk that would fit the marker's room still goes: the log was cut before it
    assert world.w.post("log", {"job": job, "token": tok, "chunks": [small]}).json() == {"dropped": 1}
    assert [c.decode() for c in world.r.lrange(key, 0, -1)] == big[:8]
    h = world.r.hgetall(world.k.job(job))
    assert (int(h[b"log_bytes"]), int(h[b"log_truncated"]), int(h[b"log_dropped"])) == (LOG_BYTES, LOG_BYTES, 13)
    # a chunk the CAS lacks has no size to count: the call is refused whole, naming it
    resp = world.w.post("log", {"job": job, "token": tok, "chunks": [addr(424242)]})
    assert resp.status_code == 400 and addr(424242) in resp.json()["message"], resp.text
    assert world.r.llen(key) == 8
    v = view(world.d, job)
    assert (v["log_truncated"], v["log_dropped"]) == (LOG_BYTES, 13), v
    shown = world.d.cli("job", "show", job, check=True).stdout
    assert f"truncated at {LOG_BYTES} bytes ([plugins.state] log_max_bytes)" in shown, shown
    # the report names its whole log again: the job keeps what the appends kept
    finish(world, a, log=[*big, small])
    v = view(world.d, job)
    assert v["log"] == big[:8] and v["log_truncated"] == LOG_BYTES, v


def test_a_report_alone_cannot_name_a_log_past_the_byte_cap(world):
    """A worker that never appends and names its whole log in the report: the chunks are sized in the CAS."""
    a = leased(world)
    big = [world.chunk(9200 + i, CHUNK) for i in range(12)]
    marker = world.chunk(9300)  # within the room the cap leaves for the worker's marker
    finish(world, a, log=[*big[:8], marker, *big[8:]])
    v = view(world.d, a["job"])
    assert v["log"] == [*big[:8], marker] and v["log_truncated"] == LOG_BYTES, v
    assert v["log_dropped"] == 4, v


def leased_task(w: World) -> dict:
    args = w.chunk(0)  # any blob: the hand worker never reads it
    spec = {"runner": "task", "argv": ["tests.helpers.tasks_mod:text"], "inputs": {"args.json": args}}
    with w.d.api() as api:
        job = api.call("POST", "/v1/jobs", {"kind": "evaluation", "pool": "gpu", "spec": spec})["job"]
    beat(w.w)
    got = w.w.claim()
    assert got["job"] == job, got
    return got


def test_a_task_result_over_its_cap_fails_the_task_whatever_the_worker_says(world):
    """The worker's own check aside: a report naming a result over the cap ends the task failed, the result not
    named (the CAS collector takes it), naming the key and the size."""
    for size, state in ((RESULT_BYTES + 1024, "failed"), (RESULT_BYTES, "succeeded")):
        a = leased_task(world)
        result = world.chunk(7000 + size, size)
        body = {
            "report_id": "r" + uuid.uuid4().hex[:12],
            "job": a["job"],
            "token": a["token"],
            "outcome": "succeeded",
            "exit_code": 0,
            "outputs": {"result.json": result},
        }
        assert world.w.post("report", body).json()["state"] == state
        v = view(world.d, a["job"])
        if state == "failed":
            assert v["reason"] == "the task's result is 5 KiB, over [plugins.state] result_max_bytes = 4 KiB", v
            assert "result.json" not in v["result"]["outputs"] and result not in str(v), v
        else:
            assert v["result"]["outputs"] == {"result.json": result} and v["reason"] == "", v


def test_a_report_over_the_cap_is_refused_and_the_job_unchanged(world):
    a = leased(world)
    marker = "HUGEBODY" + uuid.uuid4().hex
    outputs = {f"{marker}-{i}": addr(i) for i in range(REPORT_MOST // 64)}  # about 100 bytes an output
    body = {
        "report_id": "r" + uuid.uuid4().hex[:12],
        "job": a["job"],
        "token": a["token"],
        "outcome": "succeeded",
        "exit_code": 0,
        "outputs": outputs,
    }
    before = snapshot(world)
    resp = world.w.post("report", body)
    assert resp.status_code == 413, resp.text
    got = resp.json()
    assert got["error"] == "too_large" and "report_max_bytes" in got["message"] and str(REPORT_MOST) in got["message"]
    after = snapshot(world)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, changed
    assert marker not in repr(snapshot(world, volatile=True))
    v = view(world.d, a["job"])
    assert v["state"] == "leased" and v["token"] == a["token"].split(".")[0] and not v["result"], v
    assert finish(world, a) == {"answer": "accepted", "state": "succeeded"}


def test_a_stale_report_is_kept_as_its_size_and_addresses_not_its_body(world):
    a = leased(world)
    resp = world.w.post("release", {"job": a["job"], "token": a["token"], "reason": "gave it back"})
    assert resp.status_code == 200, resp.text
    world.d.cli("job", "cancel", a["job"], check=True)
    marker = "STALEBODY" + uuid.uuid4().hex
    outputs = {f"{marker}-{i}": addr(1000 + i) for i in range(20)}
    body = {
        "report_id": "r" + uuid.uuid4().hex[:12],
        "job": a["job"],
        "token": a["token"],
        "outcome": "failed",
        "exit_code": 1,
        "reason": marker * 10,
        "outputs": outputs,
        "log": [addr(2000 + i) for i in range(30)],
        "head": "",
        "usage": {"peak_rss_bytes": 1, "cpu_seconds": 1.0},
    }
    got = world.w.post("report", body)
    assert got.status_code == 200 and got.json()["answer"] == "stale", got.text
    stale = [e for e in events(world.d, "lease.stale_report") if e.get("job") == a["job"]]
    assert len(stale) == 1, stale
    assert marker not in repr(snapshot(world, volatile=True))
    # the summary is cut at the event's value cap: what is kept is small, whatever the report's size
    assert len(stale[0]["result"]) <= VALUE_MOST + 3, stale[0]
    assert stale[0]["result"].startswith('{"bytes": '), stale[0]
    assert view(world.d, a["job"])["state"] == "cancelled"


def progress(w: World, a: dict, note: str):
    headers = {"Authorization": f"Bearer {w.w.token}", RELAY_JOB_HEADER: a["job"], RELAY_TOKEN_HEADER: a["token"]}
    return w.w.http.post("/v1/relay/progress", headers=headers, json={"note": note})


def test_a_job_view_is_bounded(world):
    a = leased(world)
    job = a["job"]
    for n in range(3):
        chunks = [world.chunk(5000 + n * LOG_CHUNKS_PER_CALL + i) for i in range(LOG_CHUNKS_PER_CALL)]
        assert world.w.post("log", {"job": job, "token": a["token"], "chunks": chunks}).status_code == 200
    for i in range(PROGRESS_KEEP):
        resp = progress(world, a, f"n{i}-" + "x" * 1900)
        assert resp.status_code == 200, resp.text
    over = progress(world, a, "x" * 2001)  # a note over its cap is refused, naming it
    assert over.status_code == 400 and "2000" in over.json()["message"], over.text
    v = view(world.d, job)
    assert len(v["log"]) == LOG_MOST and v["log"] == [world.chunk(5000 + i) for i in range(LOG_MOST)], len(v["log"])
    assert len(v["progress"]) == PROGRESS_KEEP
    with world.d.api() as api:
        status, raw = api.request("GET", f"/v1/jobs/{job}")
    assert status == 200
    # 50 addresses and 5 notes of 2 KB, and the rest of the view: well under what was sent (768 chunks)
    assert len(raw) < LOG_MOST * 80 + PROGRESS_KEEP * 2100 + 8192, len(raw)
    finish(world, a)


def test_progress_notes_keep_the_configured_number(world):
    a = leased(world)
    try:
        for i in range(PROGRESS_KEEP * 2):
            resp = progress(world, a, f"n{i}")
            assert resp.status_code == 200, resp.text
        assert resp.json() == {"notes": PROGRESS_KEEP}
        notes = [n["note"] for n in view(world.d, a["job"])["progress"]]
        assert notes == [f"n{i}" for i in range(PROGRESS_KEEP, PROGRESS_KEEP * 2)]
    finally:
        finish(world, a)


def test_the_events_stream_is_bounded_after_many_events(world):
    a = leased(world, world.holder)
    ek = world.k.events()
    # each held job a heartbeat names under a token never given to its caller leaves one foreign-token event
    guesses = [{"job": a["job"], "token": f"{9000 + i}.{uuid.uuid4().hex}"} for i in range(HELD_MOST)]
    for _ in range(3):
        resp = world.w.post("heartbeat", world.w.hello(guesses))
        assert resp.status_code == 200, resp.text
        assert resp.json()["jobs"] == {a["job"]: "lost"}, resp.text[:200]
    # long values are cut: a release reason of 500 bytes is kept as its first VALUE_MOST
    resp = world.holder.post("release", {"job": a["job"], "token": a["token"], "reason": "R" * 500})
    assert resp.status_code == 200, resp.text
    last = world.r.xrevrange(ek, count=50)
    rel = next(f for _, f in last if f[b"type"] == b"lease.released" and f[b"job"] == a["job"].encode())
    assert rel[b"reason"] == b"R" * VALUE_MOST + b"...", rel
    # 3 × 1024 events and more were written; the stream keeps about EVENTS_MOST (MAXLEN ~ trims whole nodes)
    n = world.r.xlen(ek)
    assert EVENTS_MOST <= n <= EVENTS_MOST + 200, n
    mem = wait_for(lambda: world.r.memory_usage(ek, samples=0), 5, what="the stream's memory usage")
    assert mem < (EVENTS_MOST + 200) * 400, mem
    world.d.cli("job", "cancel", a["job"], check=True)
