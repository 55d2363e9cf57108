"""A job attacks through its own relay with paths that a prefix check would pass and an HTTP client would turn into a
worker's or an operator's route (`/v1/relay/../worker/claim`, encoded every way), as the worker's user and under
`run_as`. A real `piloop serve`, a real `piloop worker`, a real process job writing raw HTTP to `$PILOOP_RELAY`.

Each attack is refused by the relay, unforwarded; a queued job that a forged claim would lease (its memory grant fits
no worker's room, and a claim without `room_mb` checks no grant) stays queued, unchanged; the token and secret records
do not move. A normalised path that names a relay route is forwarded as its canonical form. And the server refuses
the relay's marker on any route but the relay's, whoever sends it.
"""

from __future__ import annotations

import json
import os
import pwd
import tempfile
import textwrap
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from piloop_common.protocol.worker import PROTOCOL, RELAY_JOB_HEADER, RELAY_MARKER_HEADER, RELAY_TOKEN_HEADER
from piloop_server.state.keys import Keys
from tests.helpers.adversary import executor, pool
from tests.helpers.redis import wait_for
from tests.helpers.users import system_user
from tests.helpers.workers import RemoteWorker, state, submit, token, view

PYTHON = "/usr/bin/python3"  # a job run as another user cannot run this venv's interpreter under root's home
JOB_USER = "piloop-job-test"
CONFIG = executor(2, 10) + pool("gpu", 0, 2)

# each way to spell "leave /v1/relay/ for <tail>", <tail> being a route under /v1 ("worker/claim")
ENCODINGS = {
    "dots": "/v1/relay/../{t}",
    "encoded dots": "/v1/relay/%2e%2e/{t}",
    "upper-case encoded dots": "/v1/relay/%2E%2E/{t}",
    "half-encoded dots": "/v1/relay/.%2e/{t}",
    "encoded slashes": "/v1/relay/..%2f{ts}",
    "backslashes": "/v1/relay/..\\{tb}",
    "encoded backslash": "/v1/relay/..%5c{t}",
    "double encoding": "/v1/relay/%252e%252e/{t}",
    "through a route": "/v1/relay/job/../../{t}",
    "doubled slashes": "//v1/relay//..//../v1/{t}",
    "dot then dots": "/v1/relay/./../{t}",
    "path parameter": "/v1/relay/..;/{t}",
    "overlong utf-8 dots": "/v1/relay/%c0%ae%c0%ae/{t}",
    "absolute url": "http://piloop/v1/{t}",
    "all encoded": "/v1/relay/%2e%2e%2f%2e%2e%2fv1%2f{ts}",
    "through nested": "/v1/relay/jobs/../../{t}",
}
# the routes a job must never reach with its worker's credential: (method, tail under /v1, body)
TARGETS = [
    ("POST", "worker/claim", {"protocol": PROTOCOL, "want": {"evaluation": 5}}),
    ("POST", "worker/heartbeat", {"protocol": PROTOCOL}),
    ("POST", "worker/report", {}),
    ("POST", "worker/release", {}),
    ("GET", "jobs", None),
    ("GET", "jobs/{victim}", None),
    ("GET", "tokens", None),
    ("GET", "secrets", None),
]
# paths that normalise to a relay route: forwarded, as their canonical path
FORWARDED = ["/v1/relay/x/../job", "/v1/relay//./job", "/v1/relay/%6aob", "/v1%2frelay%2fjob"]

ATTACK = textwrap.dedent("""
    import json, os, socket, sys, time
    calls, out_dir = json.loads(sys.argv[1]), sys.argv[2]
    def call(method, target, body, victim):
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {target} HTTP/1.0\\r\\ncontent-type: application/json\\r\\ncontent-length: {len(data)}\\r\\n"
                f"x-piloop-relayed: 1\\r\\nx-piloop-job: {victim}\\r\\n\\r\\n")
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(os.environ["PILOOP_RELAY"])
        s.sendall(head.encode("latin-1") + data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        s.close()
        status_line, _, rest = got.partition(b"\\r\\n")
        return int(status_line.split()[1]), rest.partition(b"\\r\\n\\r\\n")[2].decode(errors="replace")
    answers = [[m, t, *call(m, t, b, v)] for m, t, b, v in calls]
    # written aside and renamed: the test reads the file the moment it exists
    with open(os.path.join(out_dir, "answers.part"), "w") as f:
        json.dump(answers, f)
    os.chmod(os.path.join(out_dir, "answers.part"), 0o644)
    os.replace(os.path.join(out_dir, "answers.part"), os.path.join(out_dir, "answers.json"))
    end = time.monotonic() + 60
    while not os.path.exists(os.path.join(out_dir, "stop")) and time.monotonic() < end:
        time.sleep(0.1)
""")


def _job_user() -> pwd.struct_passwd:
    return system_user(JOB_USER)


@pytest.fixture(scope="module")
def server(tcp_daemon):
    s = tcp_daemon(CONFIG)
    d = s.d
    d.keys = s.k  # type: ignore[attr-defined]
    d.cli("secret", "set", "VICTIM_KEY", input="v-" + uuid.uuid4().hex, check=True)
    return d


def _records(r: redis.Redis, k: Keys, victim: str) -> dict:
    """What a forwarded attack would change: the victim job and its lease, the tokens' and secrets' records."""
    return {
        "victim": r.hgetall(k.job(victim)),
        "victim lease": r.get(k.lease(victim)),
        "tokens": r.hgetall(k.tokens()),
        "secrets": r.hgetall(k.secrets()),
    }


@pytest.mark.parametrize("run_as", [False, True], ids=["worker-user", "run_as"])
def test_a_job_cannot_leave_its_relay_routes_by_any_path_encoding(server, redis_server, run_as):
    if run_as and os.geteuid() != 0:
        pytest.skip("running jobs as another user needs a worker run as root")
    d = server
    name = f"w{uuid.uuid4().hex[:6]}"
    w = RemoteWorker(d, token(d, name))
    if run_as:
        with open(w.home / "config.toml", "a") as f:
            f.write(f'\n[plugins.executor]\nrun_as = "{_job_user().pw_name}"\n')
    w.start()
    r = redis.Redis.from_url(redis_server.url)
    shared = Path(tempfile.mkdtemp(prefix="pl-relay-"))
    shared.chmod(0o777)  # where the job writes its answers (the one place a job run as another user reaches)
    try:
        # a victim that a claim without `room_mb` would lease (its grant fits no worker's room), with a secret
        more = str(2 * psutil.virtual_memory().total // 2**20)  # twice this host's memory, in MiB
        victim = submit(d, "sh", "-c", "echo score=1e9", opts=("--memory-mb", more, "--secret", "VICTIM_KEY"))
        k = d.keys
        # the worker's own claims looked at it and left it queued (they note its grant on the job)
        wait_for(lambda: r.hget(k.job(victim), "grant_mb"), 20, what="the victim looked at by a claim")
        before = _records(r, k, victim)
        calls = []
        for method, tail, body in TARGETS:
            t = tail.format(victim=victim)
            for how in ENCODINGS.values():
                calls.append([method, how.format(t=t, ts=t.replace("/", "%2f"), tb=t.replace("/", "\\")), body, victim])
        for target in FORWARDED:
            calls.append(["GET", target, None, victim])
        job = submit(d, PYTHON, "-c", ATTACK, json.dumps(calls), str(shared))
        answers_file = shared / "answers.json"
        wait_for(answers_file.exists, 60, interval=0.1, what="the job's answers")
        answers = json.loads(answers_file.read_text())
        assert len(answers) == len(calls) >= 8 * len(TARGETS)
        attacks, forwarded = answers[: -len(FORWARDED)], answers[-len(FORWARDED) :]
        for method, target, status, body in attacks:
            assert status == 404, (method, target, status, body)
            got = json.loads(body)
            assert got["error"] == "not_found" and "the relay forwards only its own routes" in got["message"], got
        for _method, target, status, body in forwarded:
            assert status == 200, (target, status, body)
            assert json.loads(body)["id"] == job  # its own view, whatever job it named in a header
        # nothing changed while the job ran: the victim is queued as it was, no lease, no token or secret moved
        assert view(d, job)["state"] in ("leased", "running")
        assert _records(r, k, victim) == before
        log = w.output()
        assert log.count("event=relay.refused") == len(attacks), log[-3000:]
        assert log.count("event=relay.call") == len(forwarded)
        assert all("path=/v1/relay/job " in line for line in log.splitlines() if "event=relay.call" in line)
        (shared / "stop").touch()
        assert state(d, job, timeout=30)["state"] == "succeeded"
        v = view(d, victim)
        assert v["state"] == "queued" and not v.get("worker") and not v.get("result"), v
    finally:
        (shared / "stop").touch()
        d.cli("job", "cancel", victim)
        w.cleanup()
        r.close()


def test_the_server_refuses_the_relays_marker_on_any_other_route(server):
    d = server
    tok = token(d, f"m{uuid.uuid4().hex[:6]}")
    auth = {"authorization": f"Bearer {tok}"}
    admin = d.cli("token", "create", f"a{uuid.uuid4().hex[:6]}", "--role", "admin", check=True).stdout.strip()
    with httpx.Client(base_url=d.url, timeout=10) as c:  # type: ignore[attr-defined]
        plain = c.post("/v1/worker/register", headers=auth, json={"protocol": PROTOCOL, "pool": "gpu"})
        assert plain.status_code != 403, plain.text  # the same call without the marker is the worker's own
        for method, path, headers in (
            ("POST", "/v1/worker/register", auth),
            ("POST", "/v1/worker/claim", auth),
            ("POST", "/v1/worker/heartbeat", auth),
            ("GET", "/v1/tokens", {"authorization": f"Bearer {admin}"}),
            ("GET", "/v1/secrets", {"authorization": f"Bearer {admin}"}),
            ("GET", "/v1/relay/../tokens", {"authorization": f"Bearer {admin}"}),
        ):
            resp = c.request(method, path, headers={**headers, RELAY_MARKER_HEADER: "1"}, json={})
            assert resp.status_code == 403, (path, resp.status_code, resp.text)
            got = resp.json()
            assert got["error"] == "forbidden" and RELAY_MARKER_HEADER in got["message"], got
            assert "\n" not in got["message"]
        # the marker on a relay route is what every relayed call carries: it is judged as before (no lease here)
        resp = c.get(
            "/v1/relay/job",
            headers={**auth, RELAY_MARKER_HEADER: "1", RELAY_JOB_HEADER: "jnope", RELAY_TOKEN_HEADER: "1.ab"},
        )
        assert resp.status_code == 409, resp.text


def test_the_relay_answers_alike_for_a_job_that_does_not_exist_and_one_that_is_not_the_callers(server):
    """A job learns nothing of other jobs through its relay: the same status and body for both, but the id asked."""
    d = server
    w = RemoteWorker(d, token(d, f"w{uuid.uuid4().hex[:6]}")).start()
    shared = Path(tempfile.mkdtemp(prefix="pl-relay-"))
    shared.chmod(0o777)
    other = submit(d, "true", pool="serve")  # queued, and stays so: the serve pool has no slots here
    nobody = "j" + uuid.uuid4().hex[:12]
    calls = []
    for victim in (other, nobody):
        for method, path in (
            ("GET", "/v1/relay/jobs/{v}"),
            ("POST", "/v1/relay/jobs/{v}/cancel"),
            ("GET", "/v1/relay/jobs/{v}/log/0"),
        ):
            calls.append([method, path.format(v=victim), None, victim])
    try:
        job = submit(d, PYTHON, "-c", ATTACK, json.dumps(calls), str(shared))
        wait_for((shared / "answers.json").exists, 60, interval=0.1, what="the job's answers")
        answers = json.loads((shared / "answers.json").read_text())
        (shared / "stop").touch()
        half = len(answers) // 2
        for (_m, _t, s1, b1), (_m2, _t2, s2, b2) in zip(answers[:half], answers[half:], strict=True):
            assert (s1, b1.replace(other, "ID")) == (s2, b2.replace(nobody, "ID")), (s1, b1, s2, b2)
            assert s1 == 404 and json.loads(b1)["error"] == "not_found", b1
        assert state(d, job)["state"] == "succeeded"
        assert view(d, other)["state"] == "queued"
    finally:
        (shared / "stop").touch()
        d.cli("job", "cancel", other)
        w.cleanup()
