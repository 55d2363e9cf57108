"""A queued job that no worker takes says why, in every place an operator looks: `job show`, `job wait`'s progress,
`piloop status`, `/v1/status` (what the page shows) and `/metrics` — from a real `piloop serve` whose own worker is
held back by a real limit: its pool's `max_load` set under the host's real load, or its one slot taken."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.workers import state, submit, view


@pytest.fixture
def served(redis_server):
    port = free_port()
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + f'\n[plugins.network]\nmetrics_listen = "127.0.0.1:{port}"\n',
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
    )
    d.start()
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    yield d
    d.cleanup()


def _waiting_metric(d: Daemon, reason: str) -> float:
    r = httpx.get(d.metrics_url, timeout=10)  # type: ignore[attr-defined]
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if s.name == "piloop_queue_waiting" and s.labels == {
                "pool": "serve",
                "kind": "evaluation",
                "reason": reason,
            }:
                return s.value
    raise AssertionError(f"no piloop_queue_waiting sample for {reason}: {r.text[-2000:]}")


def _serve(d: Daemon) -> dict:
    with d.api() as api:
        return next(w for w in api.call("GET", "/v1/workers") if w["name"] == "serve")


def test_a_job_held_by_its_workers_load_says_so_everywhere(served):
    d = served
    w = wait_for(lambda: (w := _serve(d))["sample"] and w, 30, interval=0.1, what="serve's worker to send a sample")
    hog = None
    if w["sample"]["load1"] == 0:  # an idle host: give it a load to measure
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        w = wait_for(lambda: (w := _serve(d))["sample"]["load1"] > 0 and w, 60, interval=0.5, what="a load above 0")
    try:
        per_cpu = w["sample"]["load1"] / w["sample"]["cpus"]
        limit = f"{per_cpu / 10:.6f}".rstrip("0")
        d.cli("limits", "set", f"executor.pools.serve.max_load={limit}", "--reason", "the host is busy", check=True)
        job = submit(d, "true", pool="serve")
        v = wait_for(lambda: (v := view(d, job))["waiting"] and v, 30, interval=0.1, what="the job to say why")
        assert v["state"] == "queued", v
        assert v["waiting"].startswith("worker serve's load "), v["waiting"]
        assert f"per CPU) is over max_load {float(limit):g} (a limit: the host is busy)" in v["waiting"], v["waiting"]
        shown = d.cli("job", "show", job, check=True).stdout.splitlines()
        assert shown[4].split(None, 1) == ["waiting", v["waiting"]], shown  # under its state
        st = json.loads(d.cli("status", "--json", check=True).stdout)
        pool = next(p for p in st["pools"] if p["pool"] == "serve")
        assert pool["waiting"]["evaluation"].startswith("worker serve's load "), pool
        assert pool["waiting_codes"] == {"evaluation": "load"}, pool
        text = d.cli("status", check=True).stdout
        assert " waiting: pool serve's evaluations: worker serve's load " in text, text
        assert _waiting_metric(d, "load") == 1 and _waiting_metric(d, "slots") == 0
        # off a terminal, `job wait` prints the reason once, as a line of its own
        r = d.cli("job", "wait", job, "--timeout", "1s")
        assert r.returncode == 124, r
        assert r.stderr.splitlines()[0].startswith("waiting: worker serve's load "), r.stderr
        d.cli("limits", "unset", "executor.pools.serve.max_load", check=True)
        assert state(d, job)["state"] == "succeeded"
        assert view(d, job)["waiting"] == ""
        assert "waiting" not in d.cli("status", check=True).stdout
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def test_a_job_behind_a_full_slot_says_which_worker_is_full(served, tmp_path):
    d = served
    d.cli("limits", "set", "executor.pools.serve.evaluations=1", "--reason", "one at a time", check=True)
    gate = tmp_path / "go"
    first = submit(d, "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done", pool="serve")
    state(d, first, "running")
    second = submit(d, "true", pool="serve")
    want = "worker serve's 1 evaluation slot is full"
    assert wait_for(lambda: view(d, second)["waiting"] == want, 30, interval=0.1, what="the second to say why")
    with d.api() as api:
        assert api.call("GET", f"/v1/jobs/{second}")["waiting"] == want
        assert next(p for p in api.call("GET", "/v1/status")["pools"] if p["pool"] == "serve")["waiting"] == {
            "evaluation": want
        }
    assert _waiting_metric(d, "slots") == 1
    gate.touch()
    assert state(d, second)["state"] == "succeeded" and view(d, second)["waiting"] == ""
    d.cli("limits", "set", "executor.pools.serve.evaluations=0", "--reason", "no evaluations now", check=True)
    third = submit(d, "true", pool="serve")
    assert view(d, third)["waiting"] == (
        "pool serve has 0 evaluation slots: evaluations = 0 (a limit: no evaluations now)"
    )
    d.cli("job", "cancel", third, check=True)
