"""A job's log and a task's result bounded in bytes ([plugins.state] log_max_bytes, result_max_bytes) on a real
`piloop serve` and its worker: a log past the cap ends with the worker's marker, the CAS holds none of the bytes
past it, and `job show` and `piloop attach` say where it was cut; a task whose result is over its cap fails naming
the key, one under it succeeds."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest

from piloop_common.bytecaps import log_marker
from piloop_common.cas.local import LocalStore
from piloop_common.errors import TaskFailed
from piloop_common.tasks import Client
from tests.helpers import tasks_mod
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled

REPO = str(Path(__file__).resolve().parents[2])
CAP, RESULT_CAP = 64 * 1024, 16 * 1024
LINE = 64  # a numbered line: the bytes past the cap would name a line past CAP // LINE
CONFIG = FAST_EXECUTOR + f"\n[plugins.state]\nlog_max_bytes = {CAP}\nresult_max_bytes = {RESULT_CAP}\n"
WRITER = f"import sys\nfor i in range({16 * CAP // LINE}):\n    sys.stdout.write(f'line {{i:08d}} '.ljust({LINE - 1}, '.') + '\\n')\n"


@pytest.fixture(scope="module")
def server(redis_server):
    d = Daemon(
        short_home(),
        config=CONFIG + f'url = "{redis_server.url}"\n',
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


def blobs(d: Daemon) -> dict[str, int]:
    return {b.address: b.size for b in LocalStore(d.home / "cas").blobs()}


def test_a_log_past_the_cap_ends_with_a_marker_and_the_cas_holds_nothing_past_it(server, client):
    before = blobs(server)
    job = client.submit([sys.executable, "-c", WRITER], pool="serve")  # 1 MiB: 16 times the cap
    view = client.wait(job, timeout=scaled(60))
    assert view.state == "succeeded", view
    whole = b"".join(f"line {i:08d} ".ljust(LINE - 1, ".").encode() + b"\n" for i in range(16 * CAP // LINE))
    assert client.log(job) == whole[:CAP] + log_marker(CAP)
    assert view.log_truncated == CAP, view
    new = {a: n for a, n in blobs(server).items() if a not in before}
    assert sum(new.values()) <= CAP + len(log_marker(CAP)), new  # nothing past the cap was put
    store = LocalStore(server.home / "cas")
    past = f"line {CAP // LINE:08d}".encode()
    assert not any(past in store.get_bytes(a) for a in new), "a blob holds the log past its cap"
    shown = server.cli("job", "show", job, check=True).stdout
    assert re.search(rf"log cut\s+truncated at {CAP} bytes \(\[plugins.state\] log_max_bytes\)", shown), shown
    attached = server.cli("attach", job, timeout=30)
    assert attached.returncode == 0, attached.stderr
    assert attached.stdout.endswith(log_marker(CAP).decode()), attached.stdout[-200:]
    assert f"the log was cut: truncated at {CAP} bytes" in attached.stderr, attached.stderr


def test_a_log_under_the_cap_is_whole(server, client):
    job = client.submit([sys.executable, "-c", "print('short')"], pool="serve")
    view = client.wait(job, timeout=scaled(60))
    assert client.log(job) == b"short\n" and view.log_truncated == 0 and view.log_dropped == 0, view
    assert "log cut" not in server.cli("job", "show", job, check=True).stdout


def test_a_task_result_over_its_cap_fails_naming_the_key_and_one_under_it_succeeds(server, client):
    assert tasks_mod.text.apply_async((1000,), client=client).get(timeout=scaled(60)) == "x" * 1000
    before = blobs(server)
    big = tasks_mod.text.apply_async((RESULT_CAP + 4096,), client=client)
    with pytest.raises(TaskFailed, match=r"over \[plugins.state\] result_max_bytes = 16 KiB"):
        big.get(timeout=scaled(60))
    view = client.show(big.id)
    assert view.state == "failed", view
    assert view.reason == "the task's result is 20.0 KiB, over [plugins.state] result_max_bytes = 16 KiB", view
    assert "result.json" not in view.result.outputs, view.result
    assert all(n < RESULT_CAP for a, n in blobs(server).items() if a not in before)  # never put in the CAS
