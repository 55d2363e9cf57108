"""Several reports in one call (`POST /v1/worker/reports`): each is its own report, answered on its own, in order."""

from __future__ import annotations

import uuid

import pytest

from piloop_common.protocol.worker import PROTOCOL
from tests.helpers.simworker import SimWorker
from tests.helpers.workers import kill_tree_of, state, submit, tcp_server, token, view, worker_api

TWO = "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 2\nmax_load = 1000\nmin_memory_gb = 0\n"


@pytest.fixture
def server(redis_server, namespace):
    """A server whose pool `gpu` gives a worker two evaluations at once."""
    d = tcp_server(redis_server.url, namespace, extra=TWO)
    yield d
    d.cleanup()
    kill_tree_of(str(d.home))


def _report(job: str, tok: str, report_id: str | None = None) -> dict:
    return {
        "protocol": PROTOCOL,
        "report_id": report_id or uuid.uuid4().hex,
        "job": job,
        "token": tok,
        "outcome": "succeeded",
        "exit_code": 0,
    }


def _holding_two(api, cas_id: str) -> tuple[SimWorker, dict[str, str]]:
    """A registered worker and the two jobs it leased (job -> token), its pool's two slots full."""
    w = SimWorker(api, "gpu", cas_id)
    w.register()
    held: dict[str, str] = {}
    for _ in range(10):
        held |= {lease["job"]: lease["token"] for lease in w.claim(evaluation=2)["leases"]}
        if len(held) == 2:
            break
    return w, held


def test_reports_in_one_call_are_answered_one_by_one_and_a_resend_gets_the_same_answers(server):
    d = server
    tok = token(d, "wb")
    with d.api() as api:
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    jobs = [submit(d, "true"), submit(d, "true")]
    with worker_api(d, tok) as api:
        _, held = _holding_two(api, cas_id)
        assert set(held) == set(jobs), held
        a, b = jobs
        batch = {
            "protocol": PROTOCOL,
            "reports": [_report(a, held[a]), _report(b, "0." + "0" * 32, report_id="wrong-token"), _report(b, held[b])],
        }
        got = api.call("POST", "/v1/worker/reports", batch)["answers"]
        assert [x["answer"] for x in got] == ["accepted", "stale", "accepted"], got
        assert all(x["error"] is None for x in got), got
        assert api.call("POST", "/v1/worker/reports", batch)["answers"] == got  # idempotent, as one report is
    for job in jobs:
        assert state(d, job)["state"] == "succeeded"


def test_reports_carry_a_claim_into_the_slots_they_free(server):
    d = server
    tok = token(d, "wc")
    with d.api() as api:
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    jobs = [submit(d, "true") for _ in range(3)]
    with worker_api(d, tok) as api:
        w, held = _holding_two(api, cas_id)
        assert len(held) == 2, held
        claim = {"protocol": PROTOCOL, "want": {"evaluation": 2}, "wait_seconds": 30}
        # both slots full: a claim alone gets nothing, as a claim carried by reports that free no slot
        assert w.claim(evaluation=2)["reason"] == "slots"
        first = next(iter(held))
        one = _report(first, held[first])
        got = api.call("POST", "/v1/worker/reports", {"protocol": PROTOCOL, "reports": [one], "claim": claim})
        assert [x["answer"] for x in got["answers"]] == ["accepted"], got
        (lease,) = got["claim"]["leases"]  # the slot the report freed, taken in the same call; no wait (30 s asked)
        (third,) = set(jobs) - set(held)
        assert lease["job"] == third and view(d, third)["state"] == "leased"
        plain = api.call("POST", "/v1/worker/reports", {"protocol": PROTOCOL, "reports": [one]})
        assert plain["claim"] is None and plain["answers"][0]["answer"] == "accepted"  # a resend: the same answer
    assert state(d, first)["state"] == "succeeded"


def test_a_forged_report_with_a_too_large_inline_result_is_refused_and_changes_nothing(server):
    """An inline result over INLINE_MAX_BYTES (or also named as a CAS address) is refused at the door with a 400
    naming the cap; the job stays leased under its token, and its report sent right then is accepted."""
    import base64

    from piloop_common.bytecaps import INLINE_MAX_BYTES
    from piloop_common.errors import PiloopError

    d = server
    tok = token(d, "wf")
    with d.api() as api:
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    jobs = [submit(d, "true"), submit(d, "true")]
    with worker_api(d, tok) as api:
        _, held = _holding_two(api, cas_id)
        a = jobs[0]
        big = base64.b64encode(b"x" * (INLINE_MAX_BYTES + 1)).decode()
        both = base64.b64encode(b"{}").decode()
        for forged, says in (
            ({"inline_outputs": {"result.json": big}}, "over 65536"),
            (
                {"inline_outputs": {"result.json": both}, "outputs": {"result.json": "sha256:" + "ab" * 32}},
                "both inline and a CAS address",
            ),
        ):
            for path, body in (
                ("/v1/worker/report", _report(a, held[a]) | forged),
                ("/v1/worker/reports", {"protocol": PROTOCOL, "reports": [_report(a, held[a]) | forged]}),
            ):
                with pytest.raises(PiloopError) as e:
                    api.call("POST", path, body)
                assert e.value.status == 400 and says in e.value.message, (path, e.value.message)
                assert view(d, a)["state"] in ("leased", "running")
        ok = _report(a, held[a]) | {"inline_outputs": {"result.json": both}}
        assert api.call("POST", "/v1/worker/report", ok) == {"answer": "accepted", "state": "succeeded"}
    assert view(d, a)["result"]["inline_outputs"] == {"result.json": both}
