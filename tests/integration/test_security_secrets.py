"""Secrets end to end: `piloop secret set|list|rm`, a job that gets exactly the secrets it names, and the
value nowhere else: not in Redis in plain text, not in any file under `$PILOOP_HOME` (logs, the CAS, the
worker's dir), not in events or `job show --json`."""

from __future__ import annotations

import hashlib
import json
import secrets as pysecrets
import stat
import textwrap
from pathlib import Path

import pytest
import redis

from piloop_common.cas.local import LocalStore
from tests.helpers.redis import wait_for
from tests.helpers.serve import Daemon, short_home

# the job writes each TSEC_ variable's name with a hash of its value: the values themselves must not reach the CAS
ENV_JOB = textwrap.dedent("""
    import hashlib, json, os
    seen = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in os.environ.items() if k.startswith("TSEC_")}
    with open(os.path.join(os.environ["PILOOP_JOB_DIR"], "outputs", "env.json"), "w") as f:
        json.dump(seen, f)
""")


def _everything_in(r: redis.Redis, namespace: str) -> bytes:
    """Every key of the namespace with all it holds, whatever its type."""
    out = []
    for key in r.scan_iter(match="{" + namespace + "}:*", count=1000):
        t = r.type(key).decode()
        if t == "string":
            v = [r.get(key)]
        elif t == "hash":
            v = [x for kv in r.hgetall(key).items() for x in kv]
        elif t == "list":
            v = r.lrange(key, 0, -1)
        elif t == "set":
            v = list(r.smembers(key))
        elif t == "zset":
            v = [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
        elif t == "stream":
            v = [x for _, f in r.xrange(key) for kv in f.items() for x in kv]
        else:
            v = []
        out += [key, *[x or b"" for x in v]]
    return b"\n".join(out)


def _files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
                hits.append(str(p))
        except OSError:
            continue
    return hits


def test_a_job_gets_exactly_its_secrets_and_the_values_are_nowhere_else(daemon, redis_server, redis_client, namespace):
    d = daemon
    values = {n: f"v-{n}-{pysecrets.token_hex(16)}" for n in ("TSEC_A", "TSEC_B", "TSEC_C")}
    for name, value in values.items():
        got = d.cli("secret", "set", name, input=value, check=True)
        assert value not in got.stdout + got.stderr
    key_file = d.home / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    job = d.cli(
        "job",
        "submit",
        "--pool",
        "serve",
        "--secret",
        "TSEC_A",
        "--secret",
        "TSEC_B",
        "--",
        "python3",
        "-c",
        ENV_JOB,
        check=True,
    ).stdout.strip()

    def ended() -> dict | None:
        with d.api() as api:
            v = api.call("GET", f"/v1/jobs/{job}")
        return v if v["state"] in ("succeeded", "failed", "lost") else None

    v = wait_for(ended, 40, interval=0.1, what=f"job {job} to end")
    assert v["state"] == "succeeded", v
    seen = json.loads(LocalStore(d.home / "cas").get_bytes(v["result"]["outputs"]["env.json"]))
    assert seen == {n: hashlib.sha256(values[n].encode()).hexdigest() for n in ("TSEC_A", "TSEC_B")}

    shown = d.cli("job", "show", job, "--json", check=True).stdout
    assert json.loads(shown)["spec"]["secrets"] == ["TSEC_A", "TSEC_B"]
    with d.api() as api:
        events = json.dumps(api.call("GET", "/v1/events", params={"last": 10_000}))
    assert any(e["type"] == "secret.set" and e["name"] == "TSEC_A" for e in json.loads(events))
    stored = _everything_in(redis_client, namespace)
    assert b"TSEC_A" in stored  # the scan sees the secrets' records
    logs = d.daemon_log() + "".join(p.read_text(errors="replace") for p in (d.home / "logs").glob("*"))
    for value in values.values():
        assert value not in shown and value not in events and value not in logs
        assert value.encode() not in stored
        assert _files_holding(d.home, value.encode()) == []  # logs, the CAS, the worker's dir, the key file
        assert _files_holding(redis_server.dir, value.encode()) == []  # the AOF


def test_secret_cli_sets_lists_removes_and_refuses_in_one_line(daemon):
    d = daemon
    for args, given, says in (
        (("secret", "set", "EMPTY"), "", "the value is empty"),
        (("secret", "set", "1BAD-NAME"), "v", "secret name '1BAD-NAME'"),
        (("secret", "set", "a/b"), "v", "secret name 'a/b'"),
        (("secret", "rm", "NOPE"), None, "no secret named NOPE"),
        (("job", "submit", "--secret", "NOPE", "--", "true"), None, "no secret named NOPE"),
    ):
        got = d.cli(*args, input=given)
        assert got.returncode != 0 and says in got.stderr, got.stderr
        assert got.stderr.strip().count("\n") == 0 and "Traceback" not in got.stderr
    value = "hunter2-" + pysecrets.token_hex(8)
    assert "API_KEY: set" in d.cli("secret", "set", "API_KEY", input=value, check=True).stdout
    assert "API_KEY: replaced" in d.cli("secret", "set", "API_KEY", input=value + "x", check=True).stdout
    listed = d.cli("secret", "list", check=True).stdout
    rows = json.loads(d.cli("secret", "list", "--json", check=True).stdout)
    assert value not in listed and value not in json.dumps(rows)
    assert listed.split("\n")[0].split() == ["name", "created", "updated", "by", "key"]
    assert [(r["name"], r["by"], r["readable"]) for r in rows] == [("API_KEY", f"human:{_user()}", True)]
    assert rows[0]["updated_ms"] >= rows[0]["created_ms"] > 0
    assert d.cli("secret", "rm", "API_KEY", check=True).stdout.strip() == "API_KEY: removed"
    assert d.cli("secret", "list", check=True).stdout.strip() == "no secrets"


def test_the_daemon_refuses_a_secret_key_file_others_can_read(redis_server, namespace):
    d = Daemon(short_home(), redis_url=redis_server.url, namespace=namespace)
    try:
        key = d.home / "secret.key"
        key.write_text("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n")
        key.chmod(0o644)
        with pytest.raises(AssertionError) as e:
            d.start(timeout=30)
        assert "mode 0644 lets others read the secret key" in str(e.value) and "chmod 600" in str(e.value)
        assert "Traceback" not in d.daemon_log()
    finally:
        d.cleanup()


def _user() -> str:
    import getpass

    return getpass.getuser()
