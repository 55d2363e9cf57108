"""The JSON log format's fields, read from the worker's and the server's `event=… key=value` lines."""

from __future__ import annotations

import io
import json
import logging

import pytest

from piloop_common import logformat
from piloop_common.logformat import fields


@pytest.mark.parametrize(
    "line,want",
    [
        (
            "event=job.started job=j1 token=1.abc kind=evaluation worker=w1",
            {"type": "job.started", "job": "j1", "token": "1.abc", "kind": "evaluation", "worker": "w1"},
        ),
        (
            "event=worker.no_cgroups worker=w1 reason='no cgroup v2: x y': jobs' memory grants are not enforced",
            {
                "type": "worker.no_cgroups",
                "worker": "w1",
                "reason": "no cgroup v2: x y",
                "msg": "jobs' memory grants are not enforced",
            },
        ),
        (  # a value with spaces runs to the next key
            "event=job.disk_error job=j1 error=[Errno 28] No space left on device worker=w1",
            {"type": "job.disk_error", "job": "j1", "error": "[Errno 28] No space left on device", "worker": "w1"},
        ),
        ("Started server process [123]", {"msg": "Started server process [123]"}),
        (
            "event=job.ended job=j1 reason=\"it's 'quoted'\" exit_code=1",
            {"type": "job.ended", "job": "j1", "reason": "it's 'quoted'", "exit_code": "1"},
        ),
        ("event=x reason='never closed", {"type": "x", "reason": "never closed"}),
        ("", {}),
    ],
)
def test_fields_of_a_line(line, want):
    assert fields(line) == want


def test_a_key_that_names_a_credential_is_redacted_whatever_its_value():
    got = fields("event=x authorization=Bearer abc password=hunter2 secret=s3 credential=c name=ok")
    assert got == {
        "type": "x",
        "authorization": "[redacted]",
        "password": "[redacted]",
        "secret": "[redacted]",
        "credential": "[redacted]",
        "name": "ok",
    }


def test_a_json_line_keeps_its_own_keys_and_carries_the_traceback():
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    logformat.setup("json", out)
    try:
        log = logging.getLogger("piloop.test")
        log.info("event=x level=forged logger=forged job=j1")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("event=y")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    first, second = (json.loads(x) for x in out.getvalue().splitlines())
    assert (first["level"], first["logger"], first["type"], first["job"]) == ("info", "piloop.test", "x", "j1")
    assert first["ts"].endswith("Z") and second["type"] == "y" and "ValueError: boom" in second["exc"]


def test_the_worker_logger_writes_its_lines_without_looking_up_their_caller():
    """In a process that imports the worker as `piloop worker` does (its entry first), every worker module's logger
    is the callerless one: its lines carry no source line or function."""
    import subprocess
    import sys

    code = (
        "import logging, piloop_worker.main\n"
        "from piloop_worker import fencing\n"
        "got = []\n"
        "h = logging.Handler()\n"
        "h.emit = got.append\n"
        "fencing.log.addHandler(h)\n"
        "fencing.log.warning('event=x job=%s', 'j1')\n"
        "print(type(fencing.log).__name__, got[0].lineno, got[0].funcName, got[0].getMessage())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split(maxsplit=3) == ["CallerlessLogger", "0", "(unknown", "function) event=x job=j1\n"], out
