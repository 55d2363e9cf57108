"""A new user's first hour (issue 33): what each command prints and its exit code, on a real daemon."""

from __future__ import annotations

import re

from piloop_common.errors import PiloopError
from tests.helpers.redis import wait_for


def test_job_list_refuses_an_unknown_state_naming_the_choices(daemon):
    r = daemon.cli("job", "list", "--state", "bogus")
    assert r.returncode == 2
    assert "'bogus' is not one of" in r.stderr and "running" in r.stderr and "Traceback" not in r.stderr
    # the API refuses it too, naming the parameter, where it once answered an empty list
    with daemon.api() as api:
        try:
            api.call("GET", "/v1/jobs", params={"state": "bogus"})
        except PiloopError as e:
            assert "state" in e.message
        else:
            raise AssertionError("GET /v1/jobs?state=bogus answered")
    assert daemon.cli("job", "list", "--state", "running", check=True).stdout.startswith(" job")


def test_job_show_prints_when_the_job_was_created_and_updated_and_how_long_it_ran(daemon):
    job = daemon.cli("job", "submit", "--", "sh", "-c", "sleep 0.3; exit 3", check=True).stdout.strip()
    r = daemon.cli("job", "wait", job, timeout=60)
    assert r.returncode == 1 and r.stdout.startswith(f"{job}  failed  exit 3")
    shown = dict(
        line.split(None, 1) if " " in line else (line, "")
        for line in daemon.cli("job", "show", job, check=True).stdout.splitlines()
    )
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+$")
    assert stamp.match(shown["created"].strip()), shown
    assert stamp.match(shown["updated"].strip()), shown
    assert shown["created"] <= shown["updated"]
    ran = float(shown["ran"].strip().removesuffix(" s"))
    assert 0.3 <= ran < 30, shown


def test_job_wait_exit_codes_are_the_documented_ones(daemon):
    ok = daemon.cli("job", "submit", "--", "true", check=True).stdout.strip()
    assert daemon.cli("job", "wait", ok, timeout=60).returncode == 0
    slow = daemon.cli("job", "submit", "--", "sleep", "30", check=True).stdout.strip()
    r = daemon.cli("job", "wait", slow, "--timeout", "1s", timeout=60)
    assert r.returncode == 124 and "gave up after 1s" in r.stderr
    daemon.cli("job", "cancel", slow, check=True)
    assert daemon.cli("job", "wait", slow, timeout=60).returncode == 1
    helped = daemon.cli("job", "wait", "--help", check=True).stdout
    assert "124" in helped and "0    every job succeeded" in helped


def test_limits_set_refuses_a_boolean_for_a_number_naming_the_key(daemon):
    r = daemon.cli("limits", "set", "executor.pools.serve.max_load=true", "--reason", "typo")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "executor.pools.serve.max_load = 'true' is refused" in r.stderr, r.stderr
    assert daemon.cli("limits", "list", check=True).stdout.strip() == "no limits"
    r = daemon.cli("limits", "set", "executor.pools.serve.evaluations=True", "--reason", "typo")
    assert r.returncode == 2 and "executor.pools.serve.evaluations" in r.stderr and "integer" in r.stderr


def test_worker_list_drops_a_load_reason_once_the_hosts_sample_fits_again(server):
    from tests.helpers.workers import HandWorker, token

    d = server
    hand = HandWorker(d, "gpu7", token(d, "gpu7"), "gpu").register()
    try:
        d.cli("limits", "set", "executor.pools.gpu.max_load=2", "--reason", "test", check=True)
        busy = hand.hello()
        busy["sample"]["load1"] = 5.0
        assert hand.post("heartbeat", busy).status_code == 200
        assert hand.post("claim", {"want": {"evaluation": 1}}).json()["reason"] == "load"
        # the host is idle again, and no claim has come since the one refused for load; read at once through the API
        # (the table's `no lease` column), as a CLI process could start after grace and find it unreachable
        assert hand.post("heartbeat", hand.hello()).status_code == 200
        with d.api() as api:
            (row,) = [w for w in api.call("GET", "/v1/workers") if w["name"] == "gpu7"]
        assert row["reachable"] and row["no_lease"] == "nothing", row
    finally:
        hand.close()


def test_worker_list_wide_names_each_workers_host(daemon):
    import socket

    def serve_row() -> list[str] | None:
        lines = daemon.cli("worker", "list", "--wide", check=True).stdout.splitlines()
        return next((line.split() for line in lines[1:] if line.split()[0] == "serve"), None)

    row = wait_for(serve_row, 20, interval=0.2, what="the serve worker in worker list")
    header = daemon.cli("worker", "list", "--wide", check=True).stdout.splitlines()[0].split()
    assert header[-3:] == ["host", "room", "granted"]
    assert socket.gethostname() in row, row
    # the default table stays the spec's, word for word
    assert daemon.cli("worker", "list", check=True).stdout.splitlines()[0].split()[-2:] == ["no", "lease"]


def test_status_shows_a_running_agents_last_lines_and_how_to_follow_it(daemon):
    job = daemon.cli(
        "job",
        "submit",
        "--kind",
        "agent",
        "--",
        "sh",
        "-c",
        "echo one; echo two; echo three; echo four; sleep 60",
        check=True,
    ).stdout.strip()
    try:

        def shown() -> str | None:
            out = daemon.cli("status", check=True).stdout
            return out if "| four" in out else None

        out = wait_for(shown, 45, interval=0.5, what="status to show the agent's last lines")
        section = out[out.index("agents running (1)") :].splitlines()
        assert "`piloop attach JOB` follows one" in section[0]
        assert section[1].split() == [job, "on", "serve"]
        assert [ln.strip() for ln in section[2:5]] == ["| two", "| three", "| four"]  # the last three
    finally:
        daemon.cli("job", "cancel", job)


def test_an_unknown_route_answers_piloops_own_404(daemon):
    from piloop_common.errors import NotFound

    with daemon.api() as api:
        try:
            api.call("GET", "/v1/nope")
        except NotFound as e:
            assert e.message == "no route GET /v1/nope"
        else:
            raise AssertionError("GET /v1/nope answered")
