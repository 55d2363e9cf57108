"""The Python API on a real `piloop serve`: Client.submit/wait, and @task functions run on the serve worker in
processes forked from its warm shim host (never a new interpreter), their values and errors back through the CAS."""

from __future__ import annotations

import base64
import json
import re
import sys
import uuid
from pathlib import Path

import pytest

from piloop_common.bytecaps import INLINE_MAX_BYTES
from piloop_common.cas.address import hash_bytes
from piloop_common.errors import BlobMissing, TaskFailed, WaitTimeout
from piloop_common.tasks import Client
from tests.helpers import tasks_mod
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled

REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def server(redis_server):
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR,
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
        env={"PYTHONPATH": REPO},
    )  # the worker imports tests.helpers
    d.start()
    yield d
    d.cleanup()


@pytest.fixture
def client(server):
    with Client.from_env(server.home) as c:
        yield c


def test_submit_and_wait(client):
    job = client.submit([sys.executable, "-c", "print('hi')"], pool="serve")
    view = client.wait(job, timeout=scaled(60))
    assert view.state == "succeeded" and view.result.exit_code == 0
    assert client.log(job) == b"hi\n"
    slow = client.submit([sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(WaitTimeout, match="still"):
        client.wait(slow, timeout=0.3)
    client.api.call("POST", f"/v1/jobs/{slow}/cancel")


def test_a_task_returns_its_value(server, client, monkeypatch):
    monkeypatch.setenv("PILOOP_HOME", str(server.home))
    monkeypatch.delenv("PILOOP_SERVER", raising=False)
    monkeypatch.setattr(tasks_mod.add, "_client", None)  # .delay's own client, from the environment
    r = tasks_mod.add.delay(2, 40)
    assert r.get(timeout=scaled(60)) == 42
    view = client.show(r.id)
    assert view.spec["runner"] == "task" and view.spec["argv"] == ["tests.helpers.tasks_mod:add"]
    # small arguments travel in the spec, never through the CAS
    assert list(view.spec["inline_inputs"]) == ["args.json"] and not view.spec["inputs"]
    assert list(view.result.inline_outputs) == ["result.json"] and "result.json" not in view.result.outputs
    assert tasks_mod.pair.apply_async((7,), client=client).get(timeout=scaled(60)) == (7, {7})


def test_small_arguments_skip_the_cas_and_large_ones_go_through_it(server, client):
    """Arguments and results up to INLINE_MAX_BYTES ride in the spec and the claim's answer, and in the report and
    the job's record: the CAS never holds their blobs; a 100 KiB argument and result go through the CAS, as before."""
    small = tasks_mod.add.encode((2, 40))
    r = tasks_mod.add.apply_async((2, 40), client=client)
    assert r.get(timeout=scaled(60)) == 42
    result = base64.b64decode(client.show(r.id).result.inline_outputs["result.json"])
    assert json.loads(result) == {"value": 42}
    shown = server.cli("job", "show", r.id, check=True).stdout
    assert re.search(rf"output result\.json +inline, {len(result)} bytes", shown), shown
    for blob in (small, result):
        with pytest.raises(BlobMissing):
            client.get_blob(hash_bytes(blob))
    big_text = "x" * (100 * 1024)
    big = tasks_mod.add.encode((big_text, "y"))
    assert len(big) > INLINE_MAX_BYTES
    r = tasks_mod.add.apply_async((big_text, "y"), client=client)
    assert r.get(timeout=scaled(60)) == big_text + "y"
    view = client.show(r.id)
    assert view.spec["inputs"] == {"args.json": hash_bytes(big)} and not view.spec.get("inline_inputs")
    assert client.get_blob(hash_bytes(big)) == big
    assert "result.json" in view.result.outputs and not view.result.inline_outputs
    assert json.loads(client.get_blob(view.result.outputs["result.json"])) == {"value": big_text + "y"}


def test_a_task_that_raises_is_a_failed_job_with_its_traceback(client):
    r = tasks_mod.boom.apply_async(("no good",), client=client)
    with pytest.raises(TaskFailed) as e:
        r.get(timeout=scaled(60))
    assert "ValueError: no good" in e.value.message and "raise ValueError(message)" in e.value.message
    view = client.show(r.id)
    assert view.state == "failed" and view.result.exit_code == 1
    log = client.log(r.id).decode()
    assert "Traceback (most recent call last)" in log and "ValueError: no good" in log


def test_a_task_is_forked_from_its_slot_s_supervisor_not_a_new_interpreter(client):
    first = tasks_mod.whoami.apply_async(client=client)
    second = tasks_mod.whoami.apply_async(client=client)
    a, b = first.get(timeout=scaled(60)), second.get(timeout=scaled(60))
    for got in (a, b):
        # a new interpreter has its own command line (python -m …, -c …); a fork keeps its supervisor's
        assert got["cmdline"][1:3] == ["-m", "piloop_worker.slots.supervisor"], got
        # the module imported once in the process that runs the slot's tasks (a warm one), or its supervisor
        assert got["imported_by"] in (got["pid"], got["ppid"]), got
        assert got["job"] in (first.id, second.id) and got["cwd"].endswith("/work")
    if a["pid"] == b["pid"]:
        assert a["imported_by"] == b["imported_by"]  # one warm process: imported once for every task after
    # whether the two ran in one warm process or two: tests/integration/test_warm_tasks.py


def test_a_tasks_prints_reach_its_log_in_order(client):
    r = tasks_mod.chatty.apply_async((5,), client=client)
    assert r.get(timeout=scaled(60)) == 5
    assert client.log(r.id).decode().splitlines() == [f"step {i}" for i in range(5)]
