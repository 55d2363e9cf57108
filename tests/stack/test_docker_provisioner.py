"""The `docker` provisioner against a real Docker daemon: a real `piloop serve` on this machine starts worker
containers of the worker image (tests/stack/images.py) for its pool `dock`.

The containers run on the host's network (`network = "host"`), so a worker reaches the server on its loopback
address, where it listens without TLS, and the S3 endpoint (moto) that is the server's CAS: no certificate, no
address of the Docker bridge to find. docs/provisioner.md says so."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import boto3
import pytest

from piloop_server.provisioner.docker import LABEL_POOL, LABEL_SERVER, LABEL_WORKER
from piloop_server.provisioner.manager import LIST_SECONDS
from tests.helpers.redis import free_port
from tests.helpers.s3 import DUMMY_CREDENTIALS, start_moto
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.stack import images
from tests.stack.compose import wait

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]  # the first test may build the images

BACKOFF = "PILOOP_PROVISIONER_BACKOFF_SECONDS"


@pytest.fixture(scope="module")
def s3_url() -> Any:
    with start_moto() as url:
        yield url


@pytest.fixture
def started(docker_client, stack_images, redis_server, namespace, s3_url):
    made: list[Daemon] = []

    def make(provisioner: str, compute: str = "", *, image: str = images.WORKER, backoff: float = 30) -> Daemon:
        bucket = "dock-" + uuid.uuid4().hex[:8]
        boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1", **_keys()).create_bucket(Bucket=bucket)
        env = json.dumps(DUMMY_CREDENTIALS).replace('":', '" =').replace("{", "{ ").replace("}", " }")
        config = (
            FAST_EXECUTOR
            + f'\n[plugins.cas]\nprovider = "s3"\nbucket = "{bucket}"\nendpoint_url = "{s3_url}"\n'
            + "\n[plugins.executor.pools.dock]\nagents = 0\nevaluations = 1\nmax_load = 1000\nmin_memory_gb = 0\n"
            + "\n[plugins.executor.pools.dock.provisioner]\n"
            + provisioner
            + f'\n[plugins.executor.pools.dock.provisioner.compute]\nprovider = "docker"\nimage = "{image}"\n'
            + f'network = "host"\nenv = {env}\n'
            + compute
        )
        d = Daemon(short_home(), config=config, redis_url=redis_server.url, namespace=namespace,
                   env={BACKOFF: str(backoff), **DUMMY_CREDENTIALS})  # fmt: skip
        made.append(d)
        return d.start(listen=f"127.0.0.1:{free_port()}")

    yield make
    for d in made:
        tag = _server_id(d) if d.proc is not None else None
        d.cleanup()
        if tag:
            for c in docker_client.containers.list(all=True, filters={"label": f"{LABEL_SERVER}={tag}"}):
                c.remove(force=True)


def _keys() -> dict[str, str]:
    return {
        "aws_access_key_id": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }


def _submit(d: Daemon, *argv: str) -> str:
    with d.api() as api:
        return api.call("POST", "/v1/jobs", {"kind": "evaluation", "pool": "dock", "spec": {"argv": list(argv)}})["job"]


def _job(d: Daemon, job: str) -> dict:
    with d.api() as api:
        return api.call("GET", f"/v1/jobs/{job}")


def _prov(d: Daemon) -> dict:
    with d.api() as api:
        return api.call("GET", "/v1/status")["provisioners"][0]


def _events(d: Daemon, type_: str) -> list[dict]:
    with d.api() as api:
        return [e for e in api.call("GET", "/v1/events", params={"count": 10_000}) if e["type"] == type_]


def _server_id(d: Daemon) -> str:
    with d.api() as api:
        return str(api.call("GET", "/v1/health")["server_id"])


def _ours(docker_client, d: Daemon, live_only: bool = True) -> list[Any]:
    found = docker_client.containers.list(all=True, filters={"label": f"{LABEL_SERVER}={_server_id(d)}"})
    return [c for c in found if not live_only or c.status in ("created", "running")]


def test_waiting_jobs_start_containers_that_run_them_and_idle_ones_are_drained_and_removed(started, docker_client):
    d = started("max = 2\nidle_seconds = 2\nregister_seconds = 120\n", "cpus = 0.5\nmemory_mb = 512\n")
    jobs = [_submit(d, "sh", "-c", "sleep 2; echo score=1") for _ in range(3)]
    most, seen = 0, {}

    def all_done() -> bool:
        nonlocal most
        live = _ours(docker_client, d)
        most = max(most, len(live))
        for c in live:
            seen[c.id] = c.attrs
        return all(_job(d, j)["state"] == "succeeded" for j in jobs)

    wait(all_done, 240, "three jobs run in started containers", interval=0.3)
    assert most == 2, f"max = 2, and {most} ran at once"
    names = {e["worker"] for e in _events(d, "provisioner.starting")}
    assert {_job(d, j)["worker"] for j in jobs} <= names
    tag = _server_id(d)
    for attrs in seen.values():
        labels, host = attrs["Config"]["Labels"], attrs["HostConfig"]
        assert labels[LABEL_SERVER] == tag and labels[LABEL_POOL] == "dock" and labels[LABEL_WORKER] in names
        assert attrs["Name"] == f"/piloop-{tag}-{labels[LABEL_WORKER]}"
        assert (host["NanoCpus"], host["Memory"]) == (500_000_000, 512 * 2**20), host
        env = dict(e.split("=", 1) for e in attrs["Config"]["Env"])
        assert env["PILOOP_HTTPS_TOKEN"].startswith("plt_") and env["PILOOP_PROVISIONER_TAG"] == tag
        assert attrs["Config"]["Cmd"][:2] == ["worker", "--server"]
    # each worker's token is its own, made by the provisioner for it
    tokens = {t["name"]: t for t in json.loads(d.cli("token", "list", "--json", check=True).stdout)}
    assert names <= set(tokens), tokens
    wait(lambda: not _ours(docker_client, d, live_only=False), 90, "the idle containers drained and removed")
    assert len(_events(d, "provisioner.draining")) == 2 and len(_events(d, "provisioner.stopped")) == 2
    assert d.daemon_log().count("plt_") == 0, "no token in the server's log"


def test_a_container_killed_from_outside_loses_its_job_which_a_new_container_runs(started, docker_client):
    d = started("max = 1\nidle_seconds = 30\nregister_seconds = 120\n")
    job = _submit(d, "sh", "-c", "sleep 5; echo score=1")
    first = wait(lambda: (v := _job(d, job))["state"] == "running" and v["worker"], 120, "the job runs", interval=0.2)
    (container,) = _ours(docker_client, d)
    container.kill()
    v = wait(lambda: (v := _job(d, job))["state"] == "succeeded" and v, 180, "the job ran again", interval=0.3)
    assert v["worker"] != first, v
    granted = [e["worker"] for e in _events(d, "lease.granted") if e["job"] == job]
    assert granted == [first, v["worker"]], f"it ran on {first}, then once on a new container: {granted}"
    stopping = {e["worker"]: e["reason"] for e in _events(d, "provisioner.stopping")}
    assert stopping.get(first) in ("the platform lost it", "it went silent"), stopping
    with pytest.raises(Exception, match="No such container"):
        docker_client.containers.get(container.id)  # the exited container was removed


def test_an_unknown_container_with_our_tag_is_stopped_and_another_servers_is_left_alone(started, docker_client):
    d = started("max = 1\n")
    tag, run = _server_id(d), []
    for server in (tag, "another-server-" + uuid.uuid4().hex[:6]):
        run.append(
            docker_client.containers.run(
                images.WORKER, entrypoint=["sleep"], command=["600"], detach=True,
                labels={LABEL_SERVER: server, LABEL_WORKER: "dock-999", LABEL_POOL: "dock"},
            )
        )  # fmt: skip
    ours, theirs = run
    try:
        wait(lambda: _events(d, "provisioner.unknown_stopped"), 60, "the unknown container of ours is stopped")
        (ev,) = _events(d, "provisioner.unknown_stopped")
        assert ev["worker"] == "dock-999" and ev["handle"] == ours.id
        # three more listings (every 2 s) find it: it is never stopped
        holds(lambda: theirs.reload() or theirs.status == "running", 3 * LIST_SECONDS + 1, "theirs keeps running")
        theirs.reload()
        assert theirs.status == "running", "another server's container is never stopped"
        with pytest.raises(Exception, match="No such container"):
            docker_client.containers.get(ours.id)
    finally:
        for c in run:
            try:
                c.remove(force=True)
            except Exception:
                pass


def holds(cond, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """`cond` stays true for `seconds` (polled): a thing that must not happen, watched for a while."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert cond(), what
        time.sleep(0.2)


def test_a_bad_image_is_a_refused_start_that_backs_off_and_the_third_is_one_inbox_item(started):
    d = started("max = 1\n", image="registry.invalid/piloop/nope:1", backoff=0.2)
    _submit(d, "true")
    wait(lambda: _prov(d)["refusals"] >= 4, 120, "four refused starts", interval=0.3)
    backoffs = sorted(_events(d, "provisioner.backoff"), key=lambda e: e["id"])
    assert all(e["refused"] == "1" and "cannot pull registry.invalid/piloop/nope:1" in e["reason"] for e in backoffs)
    seconds = [float(e["seconds"]) for e in backoffs[:4]]
    assert seconds == [0.2, 0.4, 0.8, 1.6], seconds
    with d.api() as api:
        inbox = [e for e in api.call("GET", "/v1/inbox") if e["what"] == "provisioner.refused"]
    assert len(inbox) == 1 and "refused 3 starts in a row for pool dock" in inbox[0]["message"], inbox


def test_a_gpu_the_host_lacks_is_a_refused_start_naming_the_device_request(started, docker_client):
    """`gpus` reaches Docker as a device request: on this machine (no NVIDIA runtime) Docker refuses it, which the
    pool counts as a refusal; nothing is left under our tag."""
    d = started("max = 1\n", "gpus = 1\n", backoff=5)
    _submit(d, "true")
    wait(lambda: _prov(d)["refusals"] >= 1, 120, "a refused start", interval=0.3)
    why = _prov(d)["last_failure"]
    assert "gpu" in why and "docker: cannot start" in why, why
    assert not _ours(docker_client, d, live_only=False)
