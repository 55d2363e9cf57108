"""The state URL read into its target: Sentinel's form, credentials from the URL or a file, and the messages that
name a target without its password."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from piloop_common.config.settings import StateConfig
from piloop_common.errors import ConfigError
from piloop_server.state import retry
from piloop_server.state.target import read


def _st(**kw) -> StateConfig:
    return StateConfig(**kw)


def test_a_sentinel_url_names_its_sentinels_service_database_and_user():
    t = read(_st(), "redis+sentinel://app:pw%40x@10.0.0.1:26379,10.0.0.2,[::1]:26380/main/2")
    assert t.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (t.service, t.db, t.username, t.password, t.tls) == ("main", 2, "app", "pw@x", False)
    assert read(_st(), "rediss+sentinel://h:1/s").tls
    assert "pw" not in repr(t) and "pw" not in t.where()
    assert t.where() == "Sentinel 10.0.0.1:26379,10.0.0.2:26379,::1:26380 service 'main'"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel:///main", "names no Sentinel"),
        ("redis+sentinel://h:26379", "names no Sentinel service"),
        ("redis+sentinel://h:port/main", "the port must be a number"),
        ("redis+sentinel://h/main/zero", "must be a number"),
        ("http://h:6379", "must start redis://"),
        ("redis+sentinel://h/main?sentinel_password=x", "takes no"),
    ],
)
def test_a_bad_state_url_is_refused_naming_what_is_wrong(url, says):
    with pytest.raises(ConfigError, match=says):
        read(_st(), url)


def test_the_password_file_wins_over_the_url_and_no_message_names_either(tmp_path):
    f = tmp_path / "pw"
    f.write_text("from-the-file\nignored\n")
    t = read(_st(password_file=f), "rediss://user:in-the-url@db.example:6380/0")
    assert (t.username, t.password, t.tls) == ("user", "from-the-file", True)
    assert "in-the-url" not in t.where() and "from-the-file" not in t.where()
    assert t.where() == "rediss://user:***@db.example:6380/0"
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        read(_st(password_file=tmp_path / "empty"), "redis://h")
    with pytest.raises(ConfigError, match="cannot be read"):
        read(_st(password_file=tmp_path / "none"), "redis://h")
    with pytest.raises(ConfigError, match="ca_file"):
        read(_st(ca_file=tmp_path / "none.pem"), "rediss://h")


def test_the_sentinels_password_is_their_own_and_only_for_a_sentinel_url(tmp_path):
    f = tmp_path / "spw"
    f.write_text("sentinels-own\n")
    t = read(_st(sentinel_password_file=f), "redis+sentinel://piloop:masters@h1:26379,h2/svc")
    assert (t.password, t.sentinel_password) == ("masters", "sentinels-own")
    assert "sentinels-own" not in repr(t) and "sentinels-own" not in t.where()
    with pytest.raises(ConfigError, match="sentinel_password_file is for a redis\\+sentinel:// url"):
        read(_st(sentinel_password_file=f), "redis://h:6379/0")
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match=r"sentinel_password_file .* is empty"):
        read(_st(sentinel_password_file=tmp_path / "empty"), "redis+sentinel://h1/svc")


def test_a_secret_url_reads_the_same(tmp_path):
    st = _st(url=SecretStr("redis+sentinel://s1:5000/svc"))
    assert st.url is not None and read(st, st.url.get_secret_value()).sentinels == (("s1", 5000),)


def test_only_the_scripts_that_are_safe_twice_are_retried():
    assert {"claim", "append_log", "enqueue", "release"} <= retry.ONCE
    assert not {"report", "heartbeat", "expire"} & retry.ONCE
    assert retry.idempotent().get_retries() > 0 and retry.once().get_retries() == 0
