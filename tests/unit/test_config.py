"""Config: every source, the order they win in, and one clear line for each mistake."""

from __future__ import annotations

import pytest

from piloop_common.config.load import load_settings
from piloop_common.errors import ConfigError


def _home(tmp_path, text: str | None = None):
    if text is not None:
        (tmp_path / "config.toml").write_text(text)
    return tmp_path


def test_defaults(tmp_path):
    s = load_settings(_home(tmp_path), env={})
    ex = s.plugins.executor
    assert (ex.renew_seconds, ex.grace_seconds, ex.toleration_seconds) == (10, 50, 300)
    assert ex.provider == "workers" and "serve" in ex.pools
    assert s.plugins.cas.provider == "local" and s.plugins.state.url is None
    assert s.home == tmp_path and s.namespace == "piloop"


def test_sources_win_in_order(tmp_path):
    home = _home(
        tmp_path,
        "[plugins.executor]\nrenew_seconds = 5\ngrace_seconds = 40\n[plugins.executor.pools.gpu]\nagents = 3\n",
    )
    s = load_settings(home, env={})
    assert s.plugins.executor.renew_seconds == 5 and s.plugins.executor.pools["gpu"].agents == 3
    assert "serve" in s.plugins.executor.pools  # the daemon's own pool stays
    env = {"PILOOP_EXECUTOR__RENEW_SECONDS": "4", "PILOOP_EXECUTOR__POOLS__GPU__EVALUATIONS": "2"}
    s = load_settings(home, env=env)
    assert s.plugins.executor.renew_seconds == 4
    assert s.plugins.executor.pools["gpu"].agents == 3 and s.plugins.executor.pools["gpu"].evaluations == 2
    env["PILOOP_PLUGINS"] = '{"executor": {"renew_seconds": 3}, "network": {"provider": "proxy"}}'
    s = load_settings(home, env=env)
    assert s.plugins.executor.renew_seconds == 3 and s.plugins.executor.grace_seconds == 40
    assert s.plugins.network.provider == "proxy"


def test_home_from_env_and_redis_url(tmp_path):
    _home(tmp_path, "[plugins.executor.pools.serve]\nagents = 7\n")
    s = load_settings(env={"PILOOP_HOME": str(tmp_path), "PILOOP_REDIS_URL": "redis://h:1/0", "PILOOP_NAMESPACE": "x"})
    assert s.home == tmp_path and s.plugins.executor.pools["serve"].agents == 7
    assert s.plugins.state.url.get_secret_value() == "redis://h:1/0" and s.namespace == "x"
    assert "redis://h:1/0" not in repr(s)  # a credential never shows in a repr or a log


def _error(tmp_path, text: str | None = None, env: dict | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        load_settings(_home(tmp_path, text), env=env or {})
    msg = e.value.message
    assert "\n" not in msg
    return msg


def test_bad_toml_names_the_file(tmp_path):
    msg = _error(tmp_path, "[plugins.executor\n")
    assert str(tmp_path / "config.toml") in msg and "not valid TOML" in msg


def test_wrong_type_names_the_key_and_the_value(tmp_path):
    msg = _error(tmp_path, '[plugins.executor.pools.gpu]\nagents = "two"\n')
    assert str(tmp_path / "config.toml") in msg
    assert "executor.pools.gpu.agents" in msg and "'two'" in msg and "integer" in msg


def test_unknown_key_is_refused_naming_what_is_allowed(tmp_path):
    msg = _error(tmp_path, "[plugins.executor]\nrenew_second = 3\n")
    assert "executor.renew_second: unknown key" in msg and "renew_seconds" in msg
    msg = _error(tmp_path, "[plugins.executor.pools.gpu]\nslots = 3\n")
    assert "executor.pools.gpu.slots: unknown key" in msg and "evaluations" in msg
    msg = _error(tmp_path, "[plugins.nope]\nx = 1\n")
    assert "nope: unknown key" in msg


def test_env_errors_name_the_variable(tmp_path):
    msg = _error(tmp_path, env={"PILOOP_EXECUTOR__RENEW_SECONDS": "soon"})
    assert "env PILOOP_EXECUTOR__RENEW_SECONDS" in msg and "executor.renew_seconds" in msg
    msg = _error(tmp_path, env={"PILOOP_PLUGINS": "{not json"})
    assert "PILOOP_PLUGINS" in msg and "JSON" in msg
    msg = _error(tmp_path, env={"PILOOP_PLUGINS": '{"cas": {"provider": "ftp"}}'})
    assert "env PILOOP_PLUGINS" in msg and "cas" in msg


def test_timings_are_checked_with_the_arithmetic(tmp_path):
    msg = _error(tmp_path, "[plugins.executor]\nrenew_seconds = 10\ngrace_seconds = 50\ntoleration_seconds = 60\n")
    assert "toleration_seconds (60) must exceed" in msg and "50 + 2 × 10 + 10 + 5 = 85" in msg
    msg = _error(tmp_path, "[plugins.executor]\nrenew_seconds = 10\ngrace_seconds = 5\n")
    assert "grace_seconds (5) must exceed renew_seconds (10)" in msg


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    from tests.helpers.serve import piloop

    (tmp_path / "config.toml").write_text("[plugins.executor]\nrenew_second = 3\n")
    r = piloop(tmp_path, "serve")
    assert r.returncode == 2 and r.stderr.startswith("piloop: config: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr


def test_only_loopback_goes_without_tls_on_either_network(tmp_path):
    from piloop_common.listen import check_listen

    s = load_settings(_home(tmp_path), env={})
    assert check_listen(s, "127.0.0.1:8443") == ("127.0.0.1", 8443)
    with pytest.raises(ConfigError, match="not a loopback address"):
        check_listen(s, "0.0.0.0:8443")
    s = load_settings(tmp_path, env={"PILOOP_PLUGINS": '{"network": {"provider": "proxy"}}'})
    with pytest.raises(ConfigError, match=r"\[plugins.network\] tls is not set"):
        check_listen(s, "0.0.0.0:8443")
    assert check_listen(s, "[::1]:8443") == ("::1", 8443)
    s = load_settings(tmp_path, env={"PILOOP_PLUGINS": '{"network": {"provider": "proxy", "tls": "proxy"}}'})
    assert check_listen(s, "0.0.0.0:8443") == ("0.0.0.0", 8443)
    s = load_settings(tmp_path, env={"PILOOP_PLUGINS": '{"network": {"tls": "proxy"}}'})
    assert check_listen(s, "0.0.0.0:8443") == ("0.0.0.0", 8443)
