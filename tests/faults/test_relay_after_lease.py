"""Faults table: an agent runs `piloop` after its lease ended, and the call is refused. Here the lease ends the
ordinary way (the run is reported) while something the agent left behind still holds the lease's token; the
killed-worker and cancel cases are in tests/integration/test_relay.py."""

from __future__ import annotations

import sys

import pytest

from piloop_common.errors import LeaseLost
from piloop_common.protocol.worker import RELAY_JOB_HEADER, RELAY_TOKEN_HEADER
from piloop_common.sdk.client import ApiClient
from tests.helpers.workers import events, lease_token, state, submit, token, view


def test_a_piloop_call_after_the_lease_ended_is_refused(server, workers):
    d = server
    tok = token(d, "gpu1")
    workers(d, tok).start()
    job = submit(
        d,
        "sh",
        "-c",
        f'{sys.executable} -m piloop_common.cli progress "while leased"',
        kind="agent",
        opts=("--campaign", "c1"),
    )
    v = state(d, job)
    assert v["state"] == "succeeded" and [n["note"] for n in v["progress"]] == ["while leased"], v
    lease = lease_token(d, job)
    # the same relayed calls under the ended lease (what the worker's relay forwards): 409 lease_lost, nothing written
    with ApiClient(url=d.url, token=tok) as api:
        api.headers.update({RELAY_JOB_HEADER: job, RELAY_TOKEN_HEADER: lease})
        for method, path, body in (
            ("POST", "/v1/relay/progress", {"note": "too late"}),
            ("GET", "/v1/relay/job", None),
            ("POST", "/v1/relay/submit", {"commit": "0" * 40}),
        ):
            with pytest.raises(LeaseLost):
                api.call(method, path, body)
    assert [n["note"] for n in view(d, job)["progress"]] == ["while leased"]
    assert not [e for e in events(d, "job.queued") if e.get("parent") == job]
