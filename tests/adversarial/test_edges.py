"""The smaller holes of issue 26 (item 12), over real HTTP against a real `piloop serve` with real worker tokens:
a claim header given twice (on the token network and on the proxy network), ids and event cursors that are no
ids, secret names that shadow a job's environment, and `token purge`. Each refusal is a 4xx naming what was wrong,
never a 500, and the namespace's keys are as they were (every key read by type, whole, before and after).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import redis
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from piloop_common.cas.local import LocalStore
from piloop_common.protocol.worker import JOB_ID, PROTOCOL, RELAY_JOB_HEADER, RELAY_TOKEN_HEADER
from piloop_server.state.keys import Keys
from piloop_server.state.records.secret import SecretRecord
from tests.helpers.adversary import PROXY_NETWORK, executor, pool
from tests.helpers.keyspace import DAEMON_CHURN, keyspace, settled
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.workers import HandWorker, state, submit, token, view

# long timings: nothing of the daemon's own clock fences the silent hand worker's lease while the module runs
CONFIG = executor(120, 600, serve=(1, 1)) + pool("gpu", 1, 4)
# the job writes each TSEC_ variable's name with a hash of its value
ENV_JOB = textwrap.dedent("""
    import hashlib, json, os
    seen = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in os.environ.items() if k.startswith("TSEC_")}
    with open(os.path.join(os.environ["PILOOP_JOB_DIR"], "outputs", "env.json"), "w") as f:
        json.dump(seen, f)
""")
SHADOWING = ["PATH", "LD_PRELOAD", "PILOOP_HTTPS_TOKEN", "PYTHONPATH", "ld_preload", "PythonHome", "DYLD_X"]
ADDR = "sha256:" + "ab" * 32
ODD_IDS = ["*", "{evil}", "x" * 300, "a b", "x\x00y", "%00", "..", "../x", "a/b"]


@dataclass
class World:
    d: Daemon
    r: redis.Redis
    keys: Keys
    worker: HandWorker  # gpua, holding `lease`
    fleet: str  # a token that may name its worker
    lease: dict  # the hand worker's assignment: job, token, ...

    def before(self) -> dict:
        return settled(self.r, self.keys)

    def unchanged(self, before: dict, what: object) -> None:
        after = keyspace(self.r, self.keys, DAEMON_CHURN)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, (what, changed)


@pytest.fixture(scope="module")
def world(tcp_daemon):
    s = tcp_daemon(CONFIG)
    d = s.d
    w = None
    try:
        w = HandWorker(d, "gpua", token(d, "gpua", "--pool", "gpu"), "gpu").register()
        fleet = token(d, "fleet", "--pool", "gpu", "--rename")
        job = submit(d, "true", pool="gpu")
        lease = w.claim()
        assert lease["job"] == job, lease
        yield World(d, s.r, s.k, w, fleet, lease)
    finally:
        if w is not None:
            w.close()


def refused(resp: httpx.Response, *says: str, status: int = 400) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    msg = resp.json()["message"]
    assert all(s in msg for s in says), (says, msg)
    return msg


# -- a claim header twice ---------------------------------------------------------------------------------------


def test_a_claim_header_given_twice_is_refused_not_first_wins(world):
    w, job, lease = world.worker, world.lease["job"], world.lease["token"]
    auth = ("authorization", f"Bearer {w.token}")
    progress = {"note": "twice"}
    claim = {"protocol": w.protocol, "want": {"evaluation": 1}}
    other = submit(world.d, "true", pool="gpu")  # queued, not leased: a second copy naming it must not count
    # each would go through with its first copy alone: the refusal is the second copy's
    relay = [auth, (RELAY_JOB_HEADER, job), (RELAY_TOKEN_HEADER, lease)]
    fleet = ("authorization", f"Bearer {world.fleet}")
    cases = [
        (RELAY_JOB_HEADER, "/v1/relay/progress", [*relay, (RELAY_JOB_HEADER, other)], progress),
        (RELAY_TOKEN_HEADER, "/v1/relay/progress", [*relay, (RELAY_TOKEN_HEADER, lease + "x")], progress),
        (
            RELAY_TOKEN_HEADER,
            "/v1/relay/progress",
            [auth, (RELAY_JOB_HEADER, job), (RELAY_TOKEN_HEADER.title(), "1.x"), (RELAY_TOKEN_HEADER, lease)],
            progress,
        ),
        # the first copy would claim the queued job `other`
        ("authorization", "/v1/worker/claim", [auth, ("authorization", "Bearer plt_" + "A" * 43)], claim),
        (
            "x-piloop-worker",
            "/v1/worker/register",
            [fleet, ("x-piloop-worker", "gpu-new"), ("x-piloop-worker", "gpua")],
            w.hello(),
        ),
    ]
    before = world.before()
    with httpx.Client(base_url=world.d.url, timeout=10) as c:  # type: ignore[attr-defined]
        for name, path, headers, body in cases:
            resp = c.post(path, headers=headers, json=body)
            refused(resp, f"the header {name} comes 2 times")
        world.unchanged(before, "twice")
        # one copy of each header: the relayed call goes through
        one = c.post(
            "/v1/relay/progress",
            headers=[auth, (RELAY_JOB_HEADER, job), (RELAY_TOKEN_HEADER, lease)],
            json={"note": "once"},
        )
        assert one.status_code == 200, one.text
    notes = view(world.d, job)["progress"]
    assert "once" in str(notes) and "twice" not in str(notes), notes
    world.d.cli("job", "cancel", other, check=True)


def test_a_proxy_claim_header_given_twice_is_refused(redis_server, redis_client, namespace):
    d = Daemon(short_home(), config=FAST_EXECUTOR + PROXY_NETWORK, redis_url=redis_server.url, namespace=namespace)
    keys = Keys(namespace)
    try:
        d.start(listen=f"127.0.0.1:{free_port()}")
        claim = {"protocol": PROTOCOL, "want": {"evaluation": 1}}
        org, principal, worker = ("x-org-id", "acme"), ("x-principal", "key-0123"), ("x-piloop-worker", "w1")
        before = settled(redis_client, keys)
        with httpx.Client(base_url=f"http://{d.listen}", timeout=10) as c:
            # each first copy alone would match a rule: the refusal is the second copy's
            for twice, headers in (
                ("x-org-id", [org, ("x-org-id", "umbrella"), principal, worker]),
                ("x-principal", [org, principal, ("X-Principal", "key-9999"), worker]),
                ("x-piloop-worker", [org, principal, worker, ("x-piloop-worker", "w2")]),
            ):
                resp = c.post("/v1/worker/claim", headers=headers, json=claim)
                assert resp.status_code == 400, (twice, resp.text)
                assert f"the header {twice} comes 2 times" in resp.json()["message"], resp.text
            assert keyspace(redis_client, keys, DAEMON_CHURN) == before
            # one copy of each: the caller is the worker w1 (not registered here)
            resp = c.post("/v1/worker/claim", headers=[org, principal, worker], json=claim)
            assert resp.status_code == 404 and "w1 is not registered" in resp.json()["message"], resp.text
    finally:
        d.cleanup()


# -- ids that are no ids -----------------------------------------------------------------------------------------


def _id_routes(job: str) -> list[tuple[str, str]]:
    """Every route that takes an id in its path, with `{}` where the id goes."""
    return [
        ("GET", "/v1/jobs/{}"),
        ("POST", "/v1/jobs/{}/cancel"),
        ("GET", "/v1/jobs/{}/log/0"),
        ("GET", "/v1/campaigns/{}"),
        ("POST", "/v1/campaigns/{}/pause"),
        ("POST", "/v1/campaigns/{}/resume"),
        ("DELETE", "/v1/campaigns/{}"),
        ("DELETE", "/v1/tokens/{}"),
        ("DELETE", "/v1/secrets/{}"),
        ("POST", "/v1/inbox/{}/ack"),
        ("GET", "/v1/cas/blobs/{}"),
    ]


def with_log_and_notes(world: World) -> dict:
    """The leased job's view once it has a log chunk and a progress note: `job:<id>:log` and `job:<id>:progress`
    are then lists in Redis, which an id with that suffix would read as a job."""
    w, job, lease = world.worker, world.lease["job"], world.lease["token"]
    v = view(world.d, job)
    if not v["log"]:
        chunk = LocalStore(world.d.home / "cas").put_bytes(b"a log chunk\n")  # a chunk is sized in the CAS
        resp = w.post("log", {"job": job, "token": lease, "chunks": [chunk]})
        assert resp.status_code == 200, resp.text
    if not v["progress"]:
        headers = {"authorization": f"Bearer {w.token}", RELAY_JOB_HEADER: job, RELAY_TOKEN_HEADER: lease}
        url = world.d.url + "/v1/relay/progress"  # type: ignore[attr-defined]
        resp = httpx.post(url, headers=headers, json={"note": "a note"})
        assert resp.status_code == 200, resp.text
    v = view(world.d, job)
    assert v["log"] and v["progress"] and world.r.type(world.keys.job_progress(job)) == b"list", v
    return v


def test_ids_that_are_no_ids_answer_4xx_and_make_no_key(world):
    job = world.lease["job"]
    ids = [*ODD_IDS, f"{job}:log", f"{job}:progress", f"{job}:", f"{job}*"]
    was = with_log_and_notes(world)
    before = world.before()
    seen: dict[int, int] = {}
    with world.d.api() as api:
        for given in ids:
            for method, route in _id_routes(job):
                path = route.format(quote(given, safe=""))
                resp = api.http.request(method, path)
                seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
                assert 400 <= resp.status_code < 500, (method, path, resp.status_code, resp.text)
                got = resp.json()
                assert got["error"] and got["message"], (method, path, got)
                # the answer names what it did not find: the id as given, or the path no route matches
                msg = got["message"]
                named = given[:40] in msg or repr(given)[1:40] in msg or "no route" in msg
                assert named, (method, path, got)
        world.unchanged(before, "ids")
    assert not [k for k in world.r.scan_iter(match=world.keys.prefix() + "*") if b"evil" in k or b"xxxxx" in k]
    # the job those suffixes pointed into is whole
    assert view(world.d, job) == was
    assert 500 not in seen and seen.get(404), seen


BAD_EVENT_QUERIES = [
    ({"count": -1}, "count"),
    ({"count": 0}, "count"),
    ({"count": 10**30}, "count"),
    ({"count": "ten"}, "count"),
    ({"count": "1e3"}, "count"),
    ({"last": -5}, "last"),
    ({"last": 10**6}, "last"),
    ({"last": "x"}, "last"),
    ({"block_ms": -1}, "block_ms"),
    ({"block_ms": 10**12}, "block_ms"),
    ({"after": "abc"}, "after"),
    ({"after": "-1"}, "after"),
    ({"after": "1-2-3"}, "after"),
    ({"after": "$"}, "after"),
    ({"after": "+"}, "after"),
    ({"after": "99999999999999999999-0"}, "after"),
    ({"after": "1-99999999999999999999"}, "after"),
    ({"after": "x" * 300}, "after"),
    ({"after": "abc", "block_ms": 5}, "after"),
]


@pytest.mark.parametrize(
    "params,names", BAD_EVENT_QUERIES, ids=[f"{n}-{i}" for i, (_, n) in enumerate(BAD_EVENT_QUERIES)]
)
def test_bad_event_queries_answer_400_naming_the_parameter(world, params, names):
    with world.d.api() as api:
        resp = api.http.get("/v1/events", params=params)
    refused(resp, names)


def test_good_event_cursors_still_read(world):
    with world.d.api() as api:
        first = api.call("GET", "/v1/events", params={"after": "0", "count": 10_000})
        assert first, first
        cursor = first[0]["id"]
        later = api.call("GET", "/v1/events", params={"after": cursor, "count": 1})
        assert later == first[1:2], (later, first[:2])
        ms = cursor.split("-")[0]
        assert api.call("GET", "/v1/events", params={"after": ms, "count": 10_000})  # `<ms>` alone is an id
        assert api.call("GET", "/v1/events", params={"last": 10_000})[-1]["id"] >= first[-1]["id"]
        top = str(2**64 - 1)
        assert api.call("GET", "/v1/events", params={"after": f"{top}-0", "count": 5}) == []


# -- secret names that shadow the environment -----------------------------------------------------------------------


def test_secret_names_that_shadow_the_environment_are_refused_everywhere(world):
    d = world.d
    d.cli("secret", "set", "EDGE_OK", input="fine", check=True)  # a good name goes through: the rule is the name's
    before = world.before()
    with d.api() as api:
        for name in SHADOWING:
            p = d.cli("secret", "set", name, input="evil")
            lines = p.stderr.strip().splitlines()
            assert p.returncode != 0 and len(lines) == 1 and "Traceback" not in p.stderr, (name, p.stderr)
            assert f"secret name {name!r}" in lines[0] and "shadow the environment" in lines[0], (name, lines)
            # past the CLI's own check: the server holds the same rule
            resp = api.http.put(f"/v1/secrets/{name}", json={"value": "evil"})
            refused(resp, f"secret name {name!r}", "shadow the environment")
            # a job naming one is refused, by the CLI and by the API
            p = d.cli("job", "submit", "--pool", "gpu", "--secret", name, "--", "true")
            assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1, (name, p.stderr)
            assert f"secret name {name!r}" in p.stderr and "Traceback" not in p.stderr, (name, p.stderr)
            spec = {"argv": ["true"], "secrets": ["EDGE_OK", name]}
            resp = api.http.post("/v1/jobs", json={"pool": "gpu", "spec": spec})
            refused(resp, f"secret name {name!r}")
        # the server's own credential is a secret `secret set` takes, but no job may name it
        resp = api.http.post(
            "/v1/jobs", json={"pool": "gpu", "spec": {"argv": ["true"], "secrets": ["PILOOP_WORKER_CREDENTIAL"]}}
        )
        refused(resp, "PILOOP_WORKER_CREDENTIAL", "never a job's")
    world.unchanged(before, "shadowing secrets")
    listed = json.loads(d.cli("secret", "list", "--json", check=True).stdout)
    assert [r["name"] for r in listed] == ["EDGE_OK"], listed


def test_ids_that_are_no_ids_in_worker_calls_change_nothing(world):
    w, job, lease = world.worker, world.lease["job"], world.lease["token"]
    ids = [*ODD_IDS, f"{job}:log", f"{job}:progress", f"{job}:"]
    was = with_log_and_notes(world)
    before = world.before()
    with httpx.Client(base_url=world.d.url, timeout=10) as c:  # type: ignore[attr-defined]
        for given in ids:
            rid = "r" + uuid.uuid4().hex[:12]
            calls = [
                ("heartbeat", w.post("heartbeat", w.hello([{"job": given, "token": lease}]))),
                ("release", w.post("release", {"job": given, "token": lease, "reason": "odd"})),
                ("log", w.post("log", {"job": given, "token": lease, "chunks": [ADDR]})),
                (
                    "report",
                    w.post(
                        "report",
                        {"report_id": rid, "job": given, "token": lease, "outcome": "succeeded", "exit_code": 0},
                    ),
                ),
            ]
            if "\x00" not in given:  # no HTTP client sends a NUL in a header
                relay = {"authorization": f"Bearer {w.token}", RELAY_JOB_HEADER: given, RELAY_TOKEN_HEADER: lease}
                calls.append(("relay", c.post("/v1/relay/progress", headers=relay, json={"note": "odd"})))
            for what, resp in calls:
                # the body's ids are held to the protocol's pattern, the relay's header to the same; `..` is an id
                # that names no live lease
                if what != "relay":
                    # a NUL is refused before the pattern is looked at (protocol.text_problem)
                    refused(resp, "a NUL character is refused" if "\x00" in given else "should match pattern")
                elif re.fullmatch(JOB_ID, given):
                    refused(resp, f"job {given}", status=409)
                else:
                    refused(resp, "job id", "is refused")
    world.unchanged(before, "worker ids")
    assert view(world.d, job) == was


# -- secret rotate-key -----------------------------------------------------------------------------------------------


def _records(r: redis.Redis, keys: Keys) -> dict[str, SecretRecord]:
    """The records of this test's secrets (TSEC_*), by name."""
    got = {k.decode(): SecretRecord.from_redis(v) for k, v in r.hgetall(keys.secrets()).items()}
    return {n: rec for n, rec in got.items() if n.startswith("TSEC_")}


def _opens(rec: SecretRecord, key: bytes) -> str | None:
    try:
        return (
            AESGCM(key).decrypt(base64.b64decode(rec.nonce), base64.b64decode(rec.sealed), rec.name.encode()).decode()
        )
    except InvalidTag:
        return None


def _key(home: Path) -> bytes:
    return base64.b64decode((home / "secret.key").read_text().strip())


def test_rotate_key_reseals_every_secret_under_a_new_key(world):
    d, keys, redis_client = world.d, world.keys, world.r
    values = {n: f"v-{n}-{uuid.uuid4().hex}" for n in ("TSEC_A", "TSEC_B", "TSEC_C")}
    for n, v in values.items():
        d.cli("secret", "set", n, input=v, check=True)
    old_key = _key(d.home)
    old = _records(redis_client, keys)
    assert {n: _opens(r, old_key) for n, r in old.items()} == values

    total = redis_client.hlen(keys.secrets())  # this test's, and any an earlier test set
    assert total >= len(values)
    p = d.cli("secret", "rotate-key", "--json", check=True)
    got = json.loads(p.stdout)
    assert (got["resealed"], got["left"]) == (total, 0), got
    new_key = _key(d.home)
    assert new_key != old_key and len(new_key) == 32
    assert oct((d.home / "secret.key").stat().st_mode & 0o777) == oct(0o600)
    assert not (d.home / "secret.key.new").exists()
    new = _records(redis_client, keys)
    assert set(new) == set(values)
    for n, rec in new.items():
        assert rec.key_id == got["key_id"] != old[n].key_id, (n, rec)
        assert rec.sealed != old[n].sealed and rec.nonce != old[n].nonce
        assert rec.created_ms == old[n].created_ms
        assert _opens(rec, old_key) is None, n  # the old key opens none of them
        assert _opens(rec, new_key) == values[n], n
    listed = json.loads(d.cli("secret", "list", "--json", check=True).stdout)
    assert {(r["name"], r["key_id"], r["readable"]) for r in listed} >= {(n, got["key_id"], True) for n in values}
    assert all(r["readable"] for r in listed), listed  # the others (EDGE_OK) were resealed too
    for v in values.values():
        assert v not in p.stdout + p.stderr + d.daemon_log()

    # a job still gets the values, opened with the new key
    job = d.cli(
        "job",
        "submit",
        "--pool",
        "serve",
        "--secret",
        "TSEC_A",
        "--secret",
        "TSEC_C",
        "--",
        sys.executable,
        "-c",
        ENV_JOB,
        check=True,
    ).stdout.strip()
    v = state(d, job, timeout=40)
    assert v["state"] == "succeeded", v
    seen = json.loads(LocalStore(d.home / "cas").get_bytes(v["result"]["outputs"]["env.json"]))
    assert seen == {n: hashlib.sha256(values[n].encode()).hexdigest() for n in ("TSEC_A", "TSEC_C")}
    # the CLI says it in words, and a second rotation moves on again
    p = d.cli("secret", "rotate-key", check=True)
    assert p.stdout.startswith(f"resealed {total} secrets under key "), p.stdout
    assert _key(d.home) != new_key
    assert {n: _opens(r, _key(d.home)) for n, r in _records(redis_client, keys).items()} == values


# -- token purge -----------------------------------------------------------------------------------------------------


def _tokens(d: Daemon) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(d.cli("token", "list", "--json", check=True).stdout)}


def _registers(d: Daemon, tok: str, name: str) -> tuple[int, str]:
    """How a worker's register with `tok` is answered: (status, the refusal's message or '')."""
    w = HandWorker(d, name, tok, "gpu")
    try:
        resp = w.post("register", w.hello())
        return resp.status_code, "" if resp.is_success else resp.json()["message"]
    finally:
        w.close()


# last: the workers it registers stay silent
def test_token_purge_removes_the_revoked_tokens_only_and_frees_their_names(world):
    d, keys, redis_client = world.d, world.keys, world.r
    live = {n: token(d, n, "--pool", "gpu") for n in ("keep1", "keep2")}
    expired = token(d, "exp1", "--pool", "gpu", "--expires", "1s")  # expired is not revoked: purge keeps it
    gone = {n: token(d, n, "--pool", "gpu") for n in ("drop1", "drop2")}
    for n in gone:
        d.cli("token", "revoke", n, check=True)
    ends = _tokens(d)["exp1"]["expires_ms"]
    wait_for(lambda: time.time() * 1000 > ends + 50, 10, what="token exp1 to expire")
    revoked = {n: t["revoked"] for n, t in _tokens(d).items()}
    kept = {"fleet", "gpua", "keep1", "keep2", "exp1"}
    assert revoked == {**dict.fromkeys(kept, False), "drop1": True, "drop2": True}, revoked
    p = d.cli("token", "purge", check=True)
    assert p.stdout.strip() == "purged 2 revoked token(s): drop1, drop2", p.stdout
    assert set(_tokens(d)) == kept
    assert not _tokens(d)["keep1"]["revoked"]
    held = {k.decode() for k in redis_client.hkeys(keys.tokens())}
    by_hash = {v.decode() for v in redis_client.hvals(keys.token_hashes())}
    assert held == by_hash == kept, (held, by_hash)
    assert json.loads(d.cli("token", "purge", "--json", check=True).stdout) == {"purged": []}
    assert d.cli("token", "purge", check=True).stdout.strip() == "no revoked tokens"

    # the live tokens still work; the purged ones are unknown; their names are free again
    unknown = (403, "the server does not know this token")
    for n, tok in live.items():
        assert _registers(d, tok, n) == (200, "")
    for n, tok in gone.items():
        assert _registers(d, tok, n) == unknown
    assert _registers(d, expired, "exp1") == (403, "token exp1 expired")
    again = token(d, "drop1", "--pool", "gpu")
    assert again != gone["drop1"] and _registers(d, again, "drop1") == (200, "")
    assert _registers(d, gone["drop1"], "drop1") == unknown
    purged = [e for e in _events(d) if e["type"] == "token.purged"]
    assert [e["names"] for e in purged] == ["drop1,drop2"], purged


def _events(d: Daemon) -> list[dict]:
    with d.api() as api:
        return api.call("GET", "/v1/events", params={"last": 10_000})


@pytest.mark.parametrize("limit", [-1, 0, 5001, "x"])
def test_a_job_listing_limit_out_of_range_answers_400_naming_it(world, limit):
    with world.d.api() as api:
        refused(api.http.get("/v1/jobs", params={"limit": limit}), "limit")


def test_what_a_user_types_into_a_path_names_that_thing_and_no_other_route(world):
    """A name with `/` or `..` is one path segment: `job show ../tokens` asks for the job `../tokens`, not the token
    list, and `token revoke a/b` for the token `a/b`."""
    d = world.d
    tokens_before = _tokens(d)
    for args, says in [
        (("job", "show", "../tokens"), "../tokens"),
        (("job", "cancel", "../../v1/tokens/gpua"), "../../v1/tokens/gpua"),
        (("token", "revoke", "gpua/../fleet"), "gpua/../fleet"),
        (("campaign", "show", "../jobs"), "../jobs"),
    ]:
        p = d.cli(*args)
        lines = p.stderr.strip().splitlines()
        assert p.returncode != 0 and len(lines) == 1 and "Traceback" not in p.stderr, (args, p.stderr)
        assert says in lines[0], (args, lines[0])
    assert _tokens(d) == tokens_before  # nothing revoked by a name that walked out of its segment
    p = d.cli("job", "list", "--limit", "0")
    assert p.returncode == 2 and "--limit" in p.stderr, p.stderr
