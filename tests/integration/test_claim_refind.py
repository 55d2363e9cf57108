"""A claim goes out once (state.retry): when its connection is lost after Redis ran it, the leases it granted are
found again by the random parts of their tokens, and none is granted twice."""

from __future__ import annotations

import pytest
import redis

from piloop_common.errors import Unavailable
from piloop_server.state.connection import StateClient
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import Timings


class AnswerLost(redis.Redis):
    """A client whose scripts run in Redis and whose answer then never arrives (the connection cut at that
    instant); `runs` counts the calls that reached Redis."""

    runs = 0

    def evalsha(self, *args, **kw):  # type: ignore[override]
        super().evalsha(*args, **kw)
        AnswerLost.runs += 1
        raise redis.exceptions.ConnectionError("Connection closed by server.")


@pytest.fixture
def leases(redis_server, namespace, tmp_path):
    client = StateClient.from_url(redis_server.url)
    client.once = AnswerLost.from_url(redis_server.url)
    keys = Keys(namespace)
    ensure_generation(client, keys, GenerationRecord(tmp_path / "gen.json"), 0)
    ls = LeasesState(client, keys, Timings(grace_ms=5000, toleration_ms=20000, max_lost=2))
    client.once = redis.Redis.from_url(redis_server.url)  # register and enqueue go out whole
    ls.register("w0", "p", "", "cas1", {"load": 0.1}, protocol=1, by="worker:w0")
    for j in ("j1", "j2", "j3"):
        ls.enqueue(j, "evaluation", "p", {"argv": ["true"]}, by="human:t")
    client.once = AnswerLost.from_url(redis_server.url)
    yield ls
    client.close()


def test_a_claim_whose_answer_was_lost_is_found_again_and_not_granted_twice(leases, redis_client, namespace):
    before = AnswerLost.runs
    got = leases.claim("w0", "p", "evaluation", slots=2, image="", most=2)
    assert AnswerLost.runs == before + 1  # it ran once in Redis, and was not sent again
    assert sorted(lease.job for lease in got.leases) == ["j1", "j2"]
    k = Keys(namespace)
    for lease in got.leases:
        assert redis_client.get(k.lease(lease.job)).decode() == lease.token  # the tokens Redis holds
    held = {m.decode() for m in redis_client.smembers(k.worker_leases("w0", "evaluation"))}
    assert held == {"j1", "j2"}  # nothing more leased by a second send
    # a claim that took nothing while its answer was lost cannot be told from one that never ran: 503
    with pytest.raises(Unavailable):
        leases.claim("w0", "p", "evaluation", slots=2, image="", most=2)
