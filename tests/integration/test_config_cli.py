"""`piloop config check` and `piloop config schema` as a user runs them: a real PILOOP_HOME, a new process each
time, what is printed and the exit code."""

from __future__ import annotations

import json
import tomllib

import jsonschema

from tests.helpers.serve import piloop

CONFIG = """\
[plugins.executor]
renew_seconds = 5
grace_seconds = 40

[plugins.executor.pools.gpu]
agents = 3

[plugins.cas]
provider = "http"
url = "https://cas.example.com:7701"
token = "plt_cas-token-do-not-show"
"""
PASSWORD = "redis-pw-do-not-show"


def _rows(stdout: str) -> dict[str, tuple[str, str]]:
    """The table under the header, up to the blank line before the note on limits: key -> (value, source)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["KEY", "VALUE", "SOURCE"])
    out = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        key, rest = line.split(None, 1)
        value, source = rest.rsplit("  ", 1)
        out[key] = (value.strip(), source.strip())
    return out


def test_defaults_with_no_config_file(tmp_path):
    home = tmp_path
    r = piloop(home, "config", "check")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("piloop: config valid\n")
    assert f" config.toml: {home / 'config.toml'} (absent" in r.stdout
    rows = _rows(r.stdout)
    assert rows["executor.renew_seconds"] == ("10", "default")
    assert rows["state.url"] == ("unset", "default")
    assert {source for _, source in rows.values()} == {"default"}


def test_file_env_and_masked_secrets(tmp_path):
    home = tmp_path
    (home / "config.toml").write_text(CONFIG)
    env = {"PILOOP_REDIS_URL": f"redis://piloop:{PASSWORD}@redis.internal:6379/0", "PILOOP_EXECUTOR__MAX_LOST": "5"}
    r = piloop(home, "config", "check", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(str(home / "config.toml")) == 1  # the path once, in the header
    rows = _rows(r.stdout)
    assert rows["executor.renew_seconds"] == ("5", "config.toml")
    assert rows["executor.pools.gpu.agents"] == ("3", "config.toml")
    assert rows["executor.max_lost"] == ("5", "env PILOOP_EXECUTOR__MAX_LOST")
    assert rows["state.url"] == ('"redis://piloop:**********@redis.internal:6379/0"', "env PILOOP_REDIS_URL")
    assert rows["cas.token"] == ('"**********"', "config.toml")
    assert rows["cas.url"] == ('"https://cas.example.com:7701"', "config.toml")
    for secret in (PASSWORD, "cas-token-do-not-show"):
        assert secret not in r.stdout and secret not in r.stderr

    j = piloop(home, "config", "check", "--json", env=env)
    assert j.returncode == 0, j.stderr
    got = json.loads(j.stdout)
    assert got["valid"] is True and got["file"] == str(home / "config.toml") and got["file_exists"] is True
    assert got["settings"]["executor.renew_seconds"] == {"value": 5, "source": "config.toml"}
    assert got["settings"]["executor.max_lost"] == {"value": 5, "source": "env PILOOP_EXECUTOR__MAX_LOST"}
    assert got["settings"]["namespace"] == {"value": "piloop", "source": "default"}
    assert PASSWORD not in j.stdout and "cas-token-do-not-show" not in j.stdout


def test_an_invalid_key_exits_2_naming_it(tmp_path):
    home = tmp_path / "bad"
    home.mkdir()
    (home / "config.toml").write_text("[plugins.executor.pools.gpu]\nslots = 3\n")
    r = piloop(home, "config", "check")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("piloop: config: ") and r.stderr.count("\n") == 1
    assert "executor.pools.gpu.slots: unknown key" in r.stderr and "evaluations" in r.stderr
    assert "Traceback" not in r.stderr
    # the line `piloop serve` gives for the same file
    assert piloop(home, "serve").stderr == r.stderr
    j = piloop(home, "config", "check", "--json")
    assert j.returncode == 2 and json.loads(j.stdout) == {
        "valid": False,
        "error": r.stderr.strip().removeprefix("piloop: config: "),
    }
    bad_env = piloop(tmp_path, "config", "check", env={"PILOOP_EXECUTOR__RENEW_SECONDS": "soon"})
    assert bad_env.returncode == 2 and "env PILOOP_EXECUTOR__RENEW_SECONDS" in bad_env.stderr


def test_the_schema_validates_the_config_it_describes(tmp_path):
    home = tmp_path
    (home / "config.toml").write_text(CONFIG)
    r = piloop(home, "config", "schema")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["$schema"].startswith("https://json-schema.org/") and "home" not in got["properties"]
    jsonschema.Draft202012Validator.check_schema(got)
    jsonschema.Draft202012Validator(got).validate(tomllib.loads(CONFIG))
    errors = list(jsonschema.Draft202012Validator(got).iter_errors({"plugins": {"executor": {"renew_second": 3}}}))
    assert errors and "renew_second" in errors[0].message


def test_a_listen_serve_would_refuse_is_refused(tmp_path):
    (tmp_path / "config.toml").write_text('[plugins.network]\nlisten = "0.0.0.0:8443"\n')
    r = piloop(tmp_path, "config", "check")
    assert r.returncode == 2 and "not a loopback address" in r.stderr and "tls" in r.stderr, r.stderr
    assert piloop(tmp_path, "serve").stderr == r.stderr
    (tmp_path / "config.toml").write_text('[plugins.network]\nlisten = "0.0.0.0:8443"\ntls = "proxy"\n')
    assert piloop(tmp_path, "config", "check").returncode == 0
