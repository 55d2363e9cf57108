"""The proxy network's claims and rules, and the secrets' sealing and key handling, without processes."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from piloop_common.config.network import NetworkConfig
from piloop_common.errors import BadRequest, ConfigError, Forbidden, NotFound, Refused
from piloop_server.network.proxy import identify_proxy, match_rule
from piloop_server.secrets import KEY_FILE, Secrets, key_id
from piloop_server.state.keys import Keys

SPEC = NetworkConfig(
    provider="proxy",
    listen="0.0.0.0:8443",
    url="https://piloop.example.com",
    claims={"org": "x-org-id", "kind": "x-subject-kind", "user": "x-user-id", "principal": "x-principal"},
    name_claims=["user", "principal"],
    rules=[
        {"when": {"org": "acme", "principal": "key-0123"}, "access": "worker"},
        {"when": {"org": "acme", "kind": "service_account"}, "access": "act", "caller": "service"},
        {"when": {"org": "acme"}, "access": "act"},
    ],
)


@pytest.mark.parametrize(
    "headers,kind,name",
    [
        ({"x-org-id": "acme", "x-principal": "key-0123", "x-piloop-worker": "gpu1"}, "worker", "gpu1"),
        # the worker rule comes first: a service account holding the workers' key is a worker
        (
            {
                "x-org-id": "acme",
                "x-principal": "key-0123",
                "x-subject-kind": "service_account",
                "x-piloop-worker": "w",
            },
            "worker",
            "w",
        ),
        ({"x-org-id": "acme", "x-subject-kind": "service_account", "x-principal": "ci"}, "service", "ci"),
        (
            {"x-org-id": "acme", "x-subject-kind": "service_account", "x-user-id": "bot", "x-principal": "ci"},
            "service",
            "bot",
        ),
        ({"x-org-id": "acme", "x-user-id": "alice", "x-principal": "key-9"}, "human", "alice"),
        ({"x-org-id": "acme", "x-user-id": "  ", "x-principal": "key-9"}, "human", "key-9"),
        # an act caller's x-piloop-worker names nothing: its rule says what it is
        ({"x-org-id": "acme", "x-user-id": "alice", "x-piloop-worker": "gpu1"}, "human", "alice"),
    ],
)
def test_the_first_matching_rule_wins_and_names_the_caller(headers, kind, name):
    who = identify_proxy(headers, SPEC)
    assert (who.kind, who.name) == (kind, name)


@pytest.mark.parametrize(
    "headers,error,says",
    [
        ({}, Forbidden, "no rule of [plugins.network] rules matches this caller (claims: none)"),
        ({"x-org-id": "ACME", "x-user-id": "a"}, Forbidden, "no rule"),  # values match exactly
        ({"x-org-id": "umbrella", "x-user-id": "a"}, Forbidden, "org='umbrella'"),
        ({"x-org-id": "acme", "x-principal": "key-0123"}, Forbidden, "a worker names itself in x-piloop-worker"),
        ({"x-org-id": "acme", "x-principal": "key-0123", "x-piloop-worker": "../x"}, Forbidden, "is not a worker name"),
        ({"x-org-id": "acme"}, Forbidden, "none of name_claims (user, principal) has a value"),
        (
            {"x-org-id": "acme", "x-user-id": "alice", "authorization": "Bearer plt_abc"},
            Refused,
            "piloop tokens (plt_) are refused on the proxy network",
        ),
        ({"x-org-id": "acme", "x-user-id": "alice", "authorization": "bearer  plt_abc"}, Refused, "plt_"),
    ],
)
def test_callers_are_refused_with_the_reason(headers, error, says):
    with pytest.raises(error) as e:
        identify_proxy(headers, SPEC)
    assert says in e.value.message


def test_other_bearer_credentials_pass_through_to_the_claims():
    who = identify_proxy(
        {"authorization": "Bearer worker-key", "x-org-id": "acme", "x-principal": "key-0123", "x-piloop-worker": "w"},
        SPEC,
    )
    assert who.kind == "worker"


def test_no_rules_refuse_everyone_and_an_empty_when_matches_everyone():
    assert match_rule([], {"org": "acme"}) is None
    net = SPEC.model_copy(update={"rules": []})
    with pytest.raises(Forbidden):
        identify_proxy({"x-org-id": "acme", "x-user-id": "a"}, net)
    assert match_rule(NetworkConfig(rules=[{"when": {}, "access": "act"}]).rules, {}) == 0


class FakeRedis:
    """The hash commands Secrets uses, in memory."""

    def __init__(self) -> None:
        self.h: dict[str, dict[str, bytes]] = {}

    def hset(self, key, field, value):
        self.h.setdefault(key, {})[field] = value.encode() if isinstance(value, str) else value

    def hget(self, key, field):
        return self.h.get(key, {}).get(field)

    def hmget(self, key, fields):
        return [self.h.get(key, {}).get(f) for f in fields]

    def hkeys(self, key):
        return [k.encode() for k in self.h.get(key, {})]

    def hvals(self, key):
        return list(self.h.get(key, {}).values())

    def hdel(self, key, field):
        return 1 if self.h.get(key, {}).pop(field, None) is not None else 0


def test_values_are_sealed_with_a_fresh_nonce_and_their_name(tmp_path: Path):
    r, keys = FakeRedis(), Keys("t")
    s = Secrets(r, keys, tmp_path, env={})
    assert not (tmp_path / KEY_FILE).exists()  # made on first use, not before
    s.put("A", "value-a", "human:me")
    s.put("B", "value-a", "human:me")
    key_path = tmp_path / KEY_FILE
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    recs = {n: json.loads(v) for n, v in r.h[keys.secrets()].items()}
    assert recs["A"]["nonce"] != recs["B"]["nonce"] and recs["A"]["sealed"] != recs["B"]["sealed"]
    assert b"value-a" not in b"".join(r.h[keys.secrets()].values())
    assert s.values(["A", "B"]) == {"A": "value-a", "B": "value-a"}
    # a ciphertext moved to another name does not open: the name is the associated data
    r.hset(keys.secrets(), "B", json.dumps({**recs["A"], "name": "B"}))
    assert s.values(["A", "B", "GONE"]) == {"A": "value-a"}
    key = base64.b64decode(key_path.read_text())
    raw = AESGCM(key).decrypt(base64.b64decode(recs["A"]["nonce"]), base64.b64decode(recs["A"]["sealed"]), b"A")
    assert raw == b"value-a" and recs["A"]["key_id"] == key_id(key)
    assert s.names() == {"A", "B"}
    listed = s.every()
    assert [x["name"] for x in listed] == ["A", "B"] and all(x["readable"] for x in listed)
    assert "value-a" not in json.dumps(listed)
    s.remove("A")
    with pytest.raises(NotFound):
        s.remove("A")


def test_a_key_in_env_wins_and_another_key_cannot_open_the_values(tmp_path: Path):
    r, keys = FakeRedis(), Keys("t")
    k1, k2 = base64.b64encode(os.urandom(32)).decode(), base64.urlsafe_b64encode(os.urandom(32)).decode()
    Secrets(r, keys, tmp_path, env={"PILOOP_SECRET_KEY": k1}).put("A", "v", "human:me")
    assert not (tmp_path / KEY_FILE).exists()
    other = Secrets(r, keys, tmp_path, env={"PILOOP_SECRET_KEY": k2})
    assert other.values(["A"]) == {}
    assert other.every()[0]["readable"] is False
    assert Secrets(r, keys, tmp_path, env={"PILOOP_SECRET_KEY": k1}).values(["A"]) == {"A": "v"}


@pytest.mark.parametrize(
    "env,mode,says",
    [
        ({"PILOOP_SECRET_KEY": "not base64!"}, None, "env PILOOP_SECRET_KEY: not base64"),
        ({"PILOOP_SECRET_KEY": base64.b64encode(b"short").decode()}, None, "the key is 5 bytes; it must be 32"),
        ({}, 0o640, "mode 0640 lets others read the secret key"),
        ({}, 0o604, "chmod 600"),
    ],
)
def test_bad_keys_are_refused_at_start(tmp_path: Path, env, mode, says):
    if mode is not None:
        (tmp_path / KEY_FILE).write_text(base64.b64encode(os.urandom(32)).decode())
        (tmp_path / KEY_FILE).chmod(mode)
    with pytest.raises(ConfigError) as e:
        Secrets(FakeRedis(), Keys("t"), tmp_path, env=env)
    assert says in e.value.message


@pytest.mark.parametrize(
    "name,value,says",
    [
        ("", "v", "secret name ''"),
        ("1A", "v", "secret name '1A'"),
        ("A-B", "v", "secret name"),
        ("A", "", "the value is empty"),
        ("A", "a\0b", "NUL"),
        ("A", "x" * 70_000, "over 65536 bytes"),
    ],
)
def test_bad_names_and_values_are_refused(tmp_path: Path, name, value, says):
    with pytest.raises(BadRequest) as e:
        Secrets(FakeRedis(), Keys("t"), tmp_path, env={}).put(name, value, "human:me")
    assert says in e.value.message
    assert not (tmp_path / KEY_FILE).exists()
