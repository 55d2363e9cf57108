"""Chains, groups, `depends_on` and nested work on a real `piloop serve` (its serve worker runs the tasks)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from piloop_common.errors import TaskFailed
from piloop_common.protocol.worker import TERMINAL_STATES
from piloop_common.tasks import Client, chain, group
from tests.helpers import canvas_tasks as ct
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled

REPO = str(Path(__file__).resolve().parents[2])
# a pool no worker serves: a nested submit naming it must be refused, not queued there
CONFIG = FAST_EXECUTOR + "\n[plugins.executor.pools.gpu]\nevaluations = 1\n"


@pytest.fixture(scope="module")
def server(redis_server):
    d = Daemon(
        short_home(),
        config=CONFIG,
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
        env={"PYTHONPATH": REPO},
    )
    d.start()
    yield d
    d.cleanup()


@pytest.fixture
def client(server):
    with Client.from_env(server.home) as c:
        yield c


def ended(client, job, timeout=60):
    """The job's view once it has ended."""
    return wait_for(lambda: (v := client.show(job)).state in TERMINAL_STATES and v, timeout, 0.1, f"{job} ended")


def test_a_chain_passes_each_result_on_as_the_next_ones_first_argument(client):
    r = chain(ct.add.s(2, 3), ct.double.s(), ct.as_set.s()).apply_async(client=client)
    assert r.get(timeout=scaled(90)) == {10}  # as_set(double(add(2, 3))), the set kept by pickle
    first, second = r.parents
    assert first.get(timeout=5) == 5 and second.get(timeout=5) == 10
    view = client.show(r.id)
    assert view.spec["after"] == [second.id] and view.spec["pipe"] == second.id
    # the server filled in the parent's result as the link's input: a small one, kept with the parent, inline
    parent = client.show(second.id).result
    assert "result.json" not in parent.outputs
    assert view.spec["inputs"]["parent.json"] == "inline:" + parent.inline_outputs["result.json"]
    assert (ct.add.s(1, 1) | ct.double.s()).apply_async(client=client).get(timeout=scaled(60)) == 4
    # a parent's result past the inline cap goes through the CAS, and its address is the link's input
    big = "x" * (100 * 1024)
    r = chain(ct.add.s(big, "y"), ct.add.s("z")).apply_async(client=client)
    assert r.get(timeout=scaled(90)) == big + "yz"
    (parent,) = r.parents
    address = client.show(parent.id).result.outputs["result.json"]
    assert client.show(r.id).spec["inputs"]["parent.json"] == address


def test_a_failed_parent_ends_its_children_with_the_reason_down_the_tree_and_none_runs(server, client, tmp_path):
    never = tmp_path / "ran"
    blocker = ct.sleepy.apply_async((1.5,), client=client)
    bad = chain(ct.fail.s("no good"), ct.marker.s()).apply_async(client=client)  # marker(<fail's result>)
    parent = bad.parents[0]
    child = ct.marker.apply_async((str(never),), client=client, depends_on=[parent.id, blocker.id])
    assert client.show(child.id).state == "waiting"  # its parents have not ended
    out = server.cli("job", "submit", "--after", child.id, "--", sys.executable, "-c", f"open('{never}', 'w')")
    assert out.returncode == 0, out.stderr
    grandchild = out.stdout.strip()
    for job, why in (
        (bad.id, f"parent {parent.id} failed"),
        (child.id, f"parent {parent.id} failed"),
        (grandchild, f"parent {child.id} cancelled"),
    ):
        v = ended(client, job)
        assert (v.state, v.reason) == ("cancelled", why), job
        assert v.attempts == 0 and not v.worker and not v.result, job  # never leased
    with pytest.raises(TaskFailed, match=f"parent {parent.id} failed"):
        child.get(timeout=5)
    assert not never.exists()
    assert blocker.get(timeout=scaled(60)) == 1.5


def test_a_child_of_parents_that_have_ended_is_settled_at_submit(client):
    ok = ct.add.apply_async((1, 2), client=client)
    assert ok.get(timeout=scaled(60)) == 3
    bad = ct.fail.apply_async(("x",), client=client)
    ended(client, bad.id)
    queued = ct.double.apply_async((4,), client=client, depends_on=[ok.id])
    assert client.show(queued.id).state != "waiting"
    assert queued.get(timeout=scaled(60)) == 8
    view = client.show(ct.double.apply_async((4,), client=client, depends_on=[ok.id, bad.id]).id)
    assert (view.state, view.reason) == ("cancelled", f"parent {bad.id} failed")


def test_depends_on_a_job_that_is_not_there_is_refused_with_its_id(server):
    out = server.cli("job", "submit", "--after", "jnothere", "--", "true")
    assert out.returncode != 0 and "--after jnothere: no such job" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_map_and_group_give_their_results_in_order(client):
    squares = ct.square.map(range(6), client=client)
    assert squares.get(timeout=scaled(90)) == [0, 1, 4, 9, 16, 25]
    assert squares.ready() and squares.successful() and squares.completed_count() == 6
    g = group(ct.add.s(i, 10 * i) for i in range(4)).apply_async(client=client)
    assert g.get(timeout=scaled(90)) == [0, 11, 22, 33]
    mixed = group(ct.add.s(1, 1), ct.fail.s("one of them")).apply_async(client=client)
    with pytest.raises(TaskFailed, match="one of them"):
        mixed.get(timeout=scaled(60))
    assert mixed.ready() and not mixed.successful() and mixed.completed_count() == 1


def test_a_group_result_cancels_every_job_not_ended(client):
    g = group(ct.sleepy.s(60) for _ in range(3)).apply_async(client=client)
    wait_for(lambda: "running" in [client.show(j).state for j in g.ids], 60, 0.1, "a running member")
    states = g.cancel()
    assert set(states.values()) <= {"cancelled", "cancelling"} and "cancelling" in states.values(), states
    for j in g.ids:
        assert ended(client, j).state == "cancelled"
    assert g.ready() and not g.successful() and g.completed_count() == 0


def test_a_task_queues_a_child_from_inside_itself_and_gets_its_result(client):
    got = ct.nested_add.apply_async((20, 22), client=client).get(timeout=scaled(90))
    assert got["value"] == 42
    child = client.show(got["child"])
    assert child.state == "succeeded" and child.pool == "serve" and child.spec["argv"] == [ct.add.name]


def test_a_nested_submit_naming_another_pool_is_refused(client):
    got = ct.nested_elsewhere.apply_async(("gpu",), client=client).get(timeout=scaled(60))
    assert got["error"] == "forbidden", got
    assert "runs in pool serve: the jobs it queues go to its own pool, not gpu" in got["message"], got
    assert not [j for j in client.api.call("GET", "/v1/jobs", params={"pool": "gpu"})], "a job reached pool gpu"


def test_cancelling_a_parent_cancels_the_child_it_queued(client):
    parent = ct.nested_sleeper.apply_async((60,), client=client)
    child = wait_for(lambda: [n["note"] for n in client.show(parent.id).progress], 60, 0.1, "the child's id")[0]
    wait_for(lambda: client.show(child).state in ("leased", "running"), 60, 0.1, "the child running")
    client.api.call("POST", f"/v1/jobs/{parent.id}/cancel")
    assert ended(client, parent.id).state == "cancelled"
    assert ended(client, child).state == "cancelled"
    asked = [
        e
        for e in client.api.call("GET", "/v1/events", params={"last": 2000})
        if e.get("type") == "job.cancel_requested" and e.get("job") == child
    ]
    assert [e["by"] for e in asked] == ["service:daemon"], asked  # the pass, when it saw its parent cancelled
