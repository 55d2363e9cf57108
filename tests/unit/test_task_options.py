"""Task options in Celery's words, without processes: what each becomes in the job's spec, and bad input refused
with a ValueError naming it before anything is submitted (on the CLI, exit 2)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest

from piloop_common.protocol.worker import JobSpec
from piloop_common.sdk.taskoptions import TaskOptions
from piloop_common.tasks import Client, task
from tests.helpers import tasks_mod


class Refusing:
    """An API that fails the test if it is called: nothing may reach the server."""

    def __getattr__(self, name):
        raise AssertionError(f"the API was called ({name}) for input that should be refused first")


def test_the_options_become_the_specs_fields():
    o = TaskOptions(priority=7, countdown=30, expires=120, retry_on=(OSError, tasks_mod.Flaky))
    spec = o.timing(now=1000.0)
    assert spec == {
        "priority": 7,
        "countdown_seconds": 30.0,
        "expires_seconds": 120.0,
        "retry_on": ["builtins.OSError", "tests.helpers.tasks_mod.Flaky"],
    }
    JobSpec(argv=["m:f"], **spec)  # the server's model takes them as they are
    eta = dt.datetime.fromtimestamp(1060, dt.UTC)
    assert TaskOptions(eta=eta, expires=eta + dt.timedelta(seconds=5)).timing(now=1000.0) == {
        "countdown_seconds": 60.0,
        "expires_seconds": 65.0,
    }
    assert TaskOptions(retries=3, retry_backoff=True).max_attempts() == 4
    assert TaskOptions(retry_backoff=True).backoff_seconds() == 1.0
    assert TaskOptions(memory_gb=1.5).memory_mb() == 1536


def test_apply_async_options_win_over_the_tasks_own():
    base = tasks_mod.flaky.options
    o = TaskOptions(priority=3, retry_on=(ValueError,)).over(base)
    assert o.retries == 2 and o.retry_backoff == 1 and o.priority == 3 and o.retry_on == (ValueError,)
    assert TaskOptions(eta=dt.datetime.now(dt.UTC)).over(TaskOptions(countdown=5)).countdown is None


@pytest.mark.parametrize(
    "options, says",
    [
        ({"priority": 12}, "priority=12: give a whole number from 0 to 9"),
        ({"priority": -1}, "priority=-1"),
        ({"priority": True}, "priority=True"),
        ({"countdown": 5, "eta": dt.datetime.now(dt.UTC)}, "countdown and eta: give one"),
        ({"countdown": -1}, "countdown=-1: a countdown cannot be negative"),
        ({"expires": dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)}, "in the past"),
        ({"expires": 0}, "expires=0"),
        ({"countdown": 60, "expires": 30}, "it would expire before it may start"),
        ({"eta": dt.datetime(2030, 1, 1)}, "without a timezone"),
        ({"retry_on": ("ValueError",)}, "'ValueError' is not an exception class"),
        ({"retry_on": (int,)}, "is not an exception class"),
        ({"retry_on": "ValueError"}, "give a tuple of exception classes"),
        ({"retries": 1000}, "retries=1000"),
        ({"memory_gb": 0}, "memory_gb=0"),
    ],
)
def test_bad_input_is_a_value_error_naming_it_before_anything_is_submitted(options, says):
    client = Client(Refusing())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        tasks_mod.add.apply_async((1, 2), client=client, **options)


def test_the_decorator_refuses_bad_options_at_import():
    with pytest.raises(ValueError, match="priority=10"):
        task(priority=10)
    with pytest.raises(ValueError, match="not an exception class"):
        task(retry_on=(str,))

    class Local(Exception):
        pass

    with pytest.raises(ValueError, match="defined inside a function"):
        task(retry_on=(Local,))


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--priority", "12"], "--priority"),
        (["--countdown", "-5"], "--countdown"),
        (["--expires", "0"], "--expires"),
        (["--countdown", "1m", "--expires", "30s"], "expire before it may start"),
        (["--countdown", "soon"], "--countdown 'soon'"),
    ],
)
def test_the_cli_refuses_bad_timing_flags_with_exit_2(tmp_path, flags, says):
    env = {"PILOOP_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    p = subprocess.run(
        [sys.executable, "-m", "piloop_common.cli", "job", "submit", *flags, "--", "true"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert says in p.stderr and "Traceback" not in p.stderr, p.stderr
