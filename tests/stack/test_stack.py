"""The compose stack for real: docker-compose.yml brought up on a Docker daemon with the images of
tests/stack/compose.stack.yml, then driven and faulted as an operator would. One test, its steps in order (each
needs the stack as the one before left it), each asserted on what the containers and the server say:

up and healthy; a worker token made with `docker compose exec server piloop token create`; `--scale worker=3`; a
process job and a Python task with shipped code (`Client(code=…)`) run in worker containers; a campaign end to end
(git in both images); `docker kill` of a worker mid-job (the job runs again on another, once); `docker compose
restart server` (the running job keeps its lease); `docker compose down` then `up` (the queued job and the finished
results are still there: Redis's AOF and the S3 volume); Redis unreachable from a worker (the `state` network); the
worker image without the server's libraries."""

from __future__ import annotations

import importlib
import json
import sys
import time
import uuid
from typing import Any

import pytest

from piloop_common.tasks import Client
from tests.stack.compose import Stack, wait

pytestmark = pytest.mark.stack

PKG = "stackpkg_" + uuid.uuid4().hex[:8]
WORK = """
import socket, sys
from piloop_common.tasks import task


@task(pool="docker")
def where():
    return {"host": socket.gethostname(), "file": __file__, "python": sys.version.split()[0]}
"""
GIT = "git -c user.name=stack -c user.email=stack@piloop"
AGENT = f'echo "$PILOOP_JOB" >> runs.txt && git add runs.txt && {GIT} commit -qm "run $PILOOP_JOB"'
EVAL = 'echo "score=$(wc -l < runs.txt)"'
REPO_IN_SERVER = "/var/lib/piloop/stack-repo"


@pytest.fixture
def stack(docker_client, compose_bin, stack_images, tmp_path, request):
    s = Stack(compose_bin, tmp_path)
    s.run("down", "--volumes", "--timeout", "5", check=False)  # what a killed run left
    yield s
    if getattr(request.node, "stack_failed", True):
        print(s.logs())
    s.down(volumes=True)


def step(name: str, started: list[float]) -> None:
    now = time.monotonic()
    print(f"stack: {name} ({now - started[0]:.1f}s)")
    started[0] = now


def job(s: Stack, jid: str) -> dict[str, Any]:
    return s.piloop_json("job", "show", jid)


def submit(s: Stack, *argv: str) -> str:
    return s.piloop("job", "submit", "--pool", "docker", "--", *argv).strip()


def ended(s: Stack, jid: str, timeout: float = 120) -> dict[str, Any]:
    return wait(lambda: (v := job(s, jid))["state"] in ("succeeded", "failed", "lost") and v, timeout, f"job {jid}")


def events_of(s: Stack, jid: str, type_: str) -> list[dict[str, Any]]:
    """The events of type `type_` about job `jid`, oldest first (`piloop events --json`)."""
    lines = s.piloop("events", "--last", "5000", "--json").splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == type_ and e.get("job") == jid]


def hostnames(docker_client, s: Stack) -> dict[str, Any]:
    """The running worker containers by hostname (each worker's name, `--name "$HOSTNAME"`)."""
    out = {}
    for c in s.containers("worker"):
        if c["State"] == "running":
            container = docker_client.containers.get(c["ID"])
            out[container.attrs["Config"]["Hostname"]] = container
    return out


def registered(s: Stack, names) -> bool:  # type: ignore[no-untyped-def]
    rows = {w["name"]: w for w in s.piloop_json("worker", "list")}
    return all(n in rows and rows[n]["pool"] == "docker" for n in names)


@pytest.mark.timeout(900)
def test_the_compose_stack(stack: Stack, docker_client, tmp_path):
    s, clock = stack, [time.monotonic()]

    # -- up, healthy ---------------------------------------------------------------------------------------------
    s.run("up", "-d", "--wait", "server", timeout=400)
    ps = {c["Service"]: c for c in s.ps()}
    for service in ("redis", "minio", "server"):
        assert ps[service]["State"] == "running" and ps[service]["Health"] == "healthy", ps[service]
    assert ps["minio-init"]["State"] == "exited" and ps["minio-init"]["ExitCode"] == 0, ps["minio-init"]
    step("up: redis, minio, server healthy; minio-init exited 0", clock)

    # -- the workers' token, three workers -----------------------------------------------------------------------
    token = s.compose_exec("server", "piloop", "token", "create", "compose", "--pool", "docker", "--rename").strip()
    assert token.startswith("plt_"), token
    s.values["PILOOP_HTTPS_TOKEN"] = token
    s.write_env()
    s.run("up", "-d", "--wait", "--scale", "worker=3", timeout=400)
    workers = hostnames(docker_client, s)
    assert len(workers) == 3 and all(c["Health"] == "healthy" for c in s.containers("worker")), s.ps()
    wait(lambda: registered(s, workers), 60, "three workers registered in pool docker")
    step("token from `compose exec server piloop token create`; --scale worker=3: three healthy workers", clock)

    # -- a process job and a Python task with shipped code -------------------------------------------------------
    first = submit(s, "sh", "-c", "echo stack-job-output; echo score=0.9")
    v = ended(s, first)
    assert v["state"] == "succeeded" and v["worker"] in workers, v
    operator = s.piloop("token", "create", "stack-tester", "--role", "operator").strip()
    code = tmp_path / "code" / PKG
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "work.py").write_text(WORK)
    sys.path.insert(0, str(code.parent))
    try:
        work = importlib.import_module(f"{PKG}.work")
    finally:
        sys.path.remove(str(code.parent))
    with Client.from_env(server=f"http://127.0.0.1:{s.port}", token=operator, code=code) as client:
        got = work.where.apply_async(client=client).get(timeout=120)
    assert got["host"] in workers and got["python"].startswith("3.11"), got
    assert got["file"].endswith(f"/{PKG}/work.py") and "/code/" in got["file"], got
    step(f"a process job and a shipped Python task ran in worker containers ({got['python']})", clock)

    # -- a campaign, end to end ----------------------------------------------------------------------------------
    s.exec(
        "server", "sh", "-c",
        f"set -e; rm -rf {REPO_IN_SERVER}; git init -q -b main {REPO_IN_SERVER}; cd {REPO_IN_SERVER}; "
        f": > runs.txt; git add runs.txt; {GIT} commit -qm base",
    )  # fmt: skip
    s.piloop(
        "campaign", "create", "stack", "--repo", REPO_IN_SERVER, "--agent-cmd", AGENT, "--eval-cmd", EVAL,
        "--agents", "1", "--agent-pool", "docker", "--eval-pool", "docker",
    )  # fmt: skip
    runs = wait(
        lambda: [r for r in s.piloop_json("campaign", "show", "stack")["runs"] if r["score"] is not None],
        240,
        "a scored run of the campaign",
        interval=2,
    )
    s.piloop("campaign", "pause", "stack")
    assert runs[0]["score"] == 1 and runs[0]["branch"].startswith("runs/"), runs
    assert job(s, runs[0]["job"])["worker"] in workers and job(s, runs[0]["evaluation"])["worker"] in workers
    step("a campaign: the agent's commit came back, its evaluation scored 1", clock)

    # -- docker kill of a worker mid-job -------------------------------------------------------------------------
    killed_job = submit(s, "sh", "-c", "sleep 6; echo score=1")
    holder = wait(lambda: (v := job(s, killed_job))["state"] == "running" and v["worker"], 60, "the job runs")
    workers[holder].kill()
    v = ended(s, killed_job, timeout=180)
    assert v["state"] == "succeeded" and v["worker"] != holder and v["worker"] in workers, v
    granted = [e["worker"] for e in events_of(s, killed_job, "lease.granted")]
    expired = [(e["worker"], e["then"]) for e in events_of(s, killed_job, "lease.expired")]
    assert granted == [holder, v["worker"]] and expired == [(holder, "queued")], (granted, expired)
    step(f"docker kill {holder}: its lease expired, and the job ran again on {v['worker']}, once", clock)
    live = {n: c for n, c in workers.items() if n != holder}

    # -- docker compose restart server ---------------------------------------------------------------------------
    held = submit(s, "sh", "-c", "sleep 15; echo score=1")
    holder = wait(lambda: (v := job(s, held))["state"] == "running" and v["worker"], 60, "the job runs")
    token_before = job(s, held)["token"]
    s.run("restart", "server", timeout=200)
    wait(lambda: s.exec("server", "piloop", "status", check=False).returncode == 0, 120, "the server answers")
    v = ended(s, held, timeout=120)
    assert v["state"] == "succeeded" and v["worker"] == holder, v
    assert v["token"] == token_before, "the lease was found again, not handed out anew"
    assert [e["worker"] for e in events_of(s, held, "lease.granted")] == [holder]
    assert not events_of(s, held, "lease.expired")
    wait(lambda: registered(s, live), 60, "the live workers are registered again")
    step("docker compose restart server: the running job kept its lease and worker", clock)

    # -- docker compose down, then up: queued jobs and finished results are still there ------------------------
    s.run("stop", "worker", timeout=200)
    queued = submit(s, "sh", "-c", "echo score=0.5")
    assert job(s, queued)["state"] == "queued"
    log_before = job(s, first)["log"]
    assert log_before, "the first job's log is in the CAS"
    s.run("down", "--timeout", "30", timeout=300)
    assert not s.ps(), "every container is gone"
    s.run("up", "-d", "--wait", "server", timeout=400)
    assert job(s, queued)["state"] == "queued", "the queued job outlived down and up (Redis's AOF)"
    v = job(s, first)
    assert v["state"] == "succeeded" and v["log"] == log_before, v
    with Client.from_env(server=f"http://127.0.0.1:{s.port}", token=operator) as client:
        text = b"".join(client.get_blob(a) for a in v["log"])
    assert b"stack-job-output" in text, "the finished job's log is read back from the bucket (the S3 volume)"
    s.run("up", "-d", "--wait", "--scale", "worker=2", timeout=400)
    assert ended(s, queued)["state"] == "succeeded"
    step("docker compose down, up: the queued job ran, the finished job's log read back from S3", clock)

    # -- the state network: no worker reaches Redis --------------------------------------------------------------
    probe = "import socket; socket.create_connection(('redis', 6379), timeout=3); print('connected')"
    from_server = s.exec("server", "python3", "-c", probe, check=False)
    assert from_server.returncode == 0 and "connected" in from_server.stdout, from_server.stderr
    from_worker = s.exec("worker", "python3", "-c", probe, check=False)
    assert from_worker.returncode != 0 and "connected" not in from_worker.stdout
    assert "gaierror" in from_worker.stderr or "Name or service not known" in from_worker.stderr, from_worker.stderr
    redis = docker_client.containers.get(s.containers("redis")[0]["ID"])
    ip = next(iter(redis.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
    by_ip = s.exec("worker", "python3", "-c", probe.replace("'redis'", repr(ip)), check=False)
    assert by_ip.returncode != 0 and "connected" not in by_ip.stdout, by_ip
    step(f"redis is unreachable from a worker by name and by its address {ip}; the server reaches it", clock)

    # -- the worker image has none of the server's libraries -----------------------------------------------------
    mods = "import importlib.util as u; print([m for m in ('redis', 'fastapi', 'uvicorn', 'rq') if u.find_spec(m)])"
    assert s.exec("worker", "python3", "-c", mods).stdout.strip() == "[]"
    assert s.exec("server", "python3", "-c", mods).stdout.strip() == "['redis', 'fastapi', 'uvicorn', 'rq']"
    refused = s.exec("worker", "piloop", "serve", check=False)
    assert refused.returncode == 2 and "pip install 'piloop-jobs[server]'" in refused.stderr, refused.stderr
    step("the worker image: no redis, fastapi, uvicorn, rq; `piloop serve` names the extra", clock)
