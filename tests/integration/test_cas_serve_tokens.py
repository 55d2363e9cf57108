"""Which piloop tokens `piloop cas serve` takes: a worker's, an operator's and an admin's (the CAS takes writes); a
viewer's, a revoked one and no token at all are refused. Against the real token records in a real Redis."""

from __future__ import annotations

import json
import uuid

import redis

from piloop_common.config.load import load_settings
from piloop_server.state.keys import Keys
from piloop_server.tokens import TokenStore, open_namer


def test_cas_serve_takes_workers_operators_and_admins_but_no_viewer(redis_server, tmp_path):
    namespace = "cas" + uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(redis_server.url)
    store = TokenStore(client, Keys(namespace))
    made = {
        role or "worker": store.create(f"c-{role or 'worker'}", by="test", role=role)
        for role in (None, "viewer", "operator", "admin")
    }
    gone = store.create("c-gone", by="test", role="admin")
    store.revoke("c-gone")
    client.close()
    env = {"PILOOP_PLUGINS": json.dumps({"state": {"url": redis_server.url}}), "PILOOP_NAMESPACE": namespace}
    name_of = open_namer(load_settings(tmp_path, env=env), tmp_path)
    assert {kind: name_of(token) for kind, token in made.items()} == {
        "worker": "c-worker",
        "viewer": None,
        "operator": "c-operator",
        "admin": "c-admin",
    }
    assert name_of(gone) is None and name_of("plt_" + "A" * 43) is None and name_of("garbage") is None
