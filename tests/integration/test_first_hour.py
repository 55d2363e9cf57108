"""A new user's first hour (issue 33): what each command prints and its exit code, on a real daemon."""

from __future__ import annotations

from piloop_common.errors import PiloopError


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


def test_an_unknown_route_answers_piloops_own_404(daemon):
    from piloop_common.errors import NotFound

    with daemon.api() as api:
        try:
            api.call("GET", "/v1/nope")
        except NotFound as e:
            assert e.message == "no route GET /v1/nope"
        else:
            raise AssertionError("GET /v1/nope answered")
