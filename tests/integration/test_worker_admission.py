"""What keeps a real `piloop worker` from taking or starting a job, seen through a real `piloop serve`:
memory pressure (PSI from a file the test controls), a job for another image, a name its token does not
allow, and `piloop worker list`'s rows and reasons as the spec prints them."""

from __future__ import annotations

import json

import redis

from piloop_server.state.keys import Keys
from tests.helpers.redis import wait_for
from tests.helpers.workers import state, submit, token, view

PSI = "some avg10={:.2f} avg60=1.00 avg300=0.50 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def rows(d) -> dict[str, dict]:
    return {w["name"]: w for w in json.loads(d.cli("worker", "list", "--json", check=True).stdout)}


def table(d) -> list[list[str]]:
    return [line.split() for line in d.cli("worker", "list", check=True).stdout.splitlines()]


def test_memory_pressure_over_the_maximum_claims_nothing_until_it_falls(
    server, workers, tmp_path, redis_server, namespace
):
    d = server
    psi = tmp_path / "pressure"
    psi.write_text(PSI.format(90.0))  # over memory_pressure_max (40)
    workers(d, token(d, "gpu1"), env={"PILOOP_PSI_MEMORY": str(psi)}).start()
    wait_for(lambda: rows(d).get("gpu1", {}).get("no_lease") == "memory", 20, interval=0.1, what="gpu1 to say memory")
    job = submit(d, "true")
    # two heartbeats after the submit (and so at least one claim round each), the job is still queued
    r = redis.Redis.from_url(redis_server.url)
    seen_key = Keys(namespace).worker("gpu1")
    seen = [r.hget(seen_key, "seen")]
    wait_for(
        lambda: (s := r.hget(seen_key, "seen")) != seen[-1] and seen.append(s) is None and len(seen) >= 3,
        10,
        interval=0.05,
        what="two more heartbeats",
    )
    assert view(d, job)["state"] == "queued"
    (row,) = [x for x in table(d) if x[0] == "gpu1"]
    assert row[1] == "gpu" and row[-1] == "memory", row
    assert rows(d)["gpu1"]["sample"]["memory_pressure"] == 90.0
    psi.write_text(PSI.format(5.0))
    v = state(d, job, "succeeded", "failed", "lost")
    assert v["state"] == "succeeded" and v["worker"] == "gpu1"
    r.close()


def test_a_job_for_another_image_is_released_and_runs_where_the_image_is(server, workers, redis_server, namespace):
    d = server
    mine = workers(d, token(d, "gpu1"), args=("--image", "mine")).start()
    wait_for(lambda: rows(d).get("gpu1", {}).get("image") == "mine", 20, interval=0.1, what="gpu1 to register")
    # the server matches jobs to the image a worker registered; make its record wrong (as a stale or
    # mistaken server would have it), so it hands gpu1 a job that gpu1 itself must refuse
    r = redis.Redis.from_url(redis_server.url)
    r.hset(Keys(namespace).worker("gpu1"), "image", "other")
    r.close()
    job = d.cli("job", "submit", "--pool", "gpu", "--image", "other", "--", "true", check=True).stdout.strip()

    def released() -> dict | None:
        for line in d.cli("events", "--json", check=True).stdout.splitlines():
            e = json.loads(line)
            if e["type"] == "lease.released" and e["job"] == job:
                return e
        return None

    e = wait_for(released, 20, interval=0.1, what="gpu1 to release the job")
    assert e["by"] == "worker:gpu1" and e["reason"] == "image"
    wait_for(lambda: rows(d)["gpu1"]["image"] == "mine", 10, interval=0.1, what="gpu1 to register its image again")
    assert view(d, job)["state"] == "queued"
    workers(d, token(d, "gpu2"), args=("--image", "other")).start()
    v = state(d, job, "succeeded", "failed", "lost")
    assert v["state"] == "succeeded" and v["worker"] == "gpu2", v
    assert f"event=job.released job={job} reason=image wants=other have=mine" in mine.output()
    assert f"event=job.started job={job}" not in mine.output()


def test_a_worker_chooses_its_name_only_where_its_token_allows(server, workers):
    d = server
    plain = workers(d, token(d, "w1"), args=("--name", "gpu7")).start()
    assert plain.wait(20) == 3
    assert "token w1 does not let a worker choose its name (`piloop token create --rename`)" in plain.output()
    workers(d, token(d, "w2", "--rename"), args=("--name", "gpu7")).start()
    wait_for(lambda: "gpu7" in rows(d), 20, interval=0.1, what="gpu7 to register")
    assert "w1" not in rows(d) and "w2" not in rows(d)


def test_worker_list_shows_a_remote_worker_and_serve_as_the_spec_does(server, workers):
    d = server
    for kind in ("agents", "evaluations"):  # serve's pool: no free slot
        d.cli("limits", "set", f"executor.pools.serve.{kind}=0", "--reason", "the GPU box takes them", check=True)
    workers(d, token(d, "gpu1")).start()
    job = d.cli("job", "submit", "--kind", "agent", "--pool", "gpu", "--", "sleep", "60", check=True).stdout.strip()
    state(d, job, "running")

    def settled():
        t = table(d)
        got = {r[0]: r for r in t[1:]}
        return (got.get("gpu1", [""])[-1] == "nothing" and got.get("serve", [""])[-1] == "slots") and t

    t = wait_for(settled, 20, interval=0.2, what="gpu1 nothing and serve slots")
    assert t[0] == ["worker", "pool", "seen", "load", "memory", "disk", "agents", "evaluations", "no", "lease"]
    got = {r[0]: r for r in t[1:]}
    for name, pool, agents in (("gpu1", "gpu", "1"), ("serve", "serve", "0")):
        r = got[name]
        # worker  pool  6s ago  21.8/32  103.8 GB  816.4 GB  agents  evaluations  no lease
        assert r[1] == pool and r[3] == "ago" and r[2].endswith("s"), r
        assert "/" in r[4] and r[6] == "GB" and r[8] == "GB", r
        assert r[9:] == [agents, "0", "nothing" if name == "gpu1" else "slots"], r
    d.cli("job", "cancel", job, check=True)
