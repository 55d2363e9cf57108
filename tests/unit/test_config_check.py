"""`piloop config check`'s pure part: each setting in effect, where it came from, and no secret in what it shows;
`piloop config schema`'s schema against real config files."""

from __future__ import annotations

import json
import tomllib

import jsonschema
import pytest

from piloop_common.cli.daemon import CONFIG_TEMPLATE
from piloop_common.config.check import MASK, check, mask_url, masked
from piloop_common.config.load import read_sources, settings_from
from piloop_common.config.schema import schema


def _checked(tmp_path, text: str | None = None, env: dict[str, str] | None = None) -> dict[str, tuple[object, str]]:
    if text is not None:
        (tmp_path / "config.toml").write_text(text)
    sources = read_sources(tmp_path, env=env or {})
    return {e.key: (e.value, e.source) for e in check(settings_from(sources), sources).settings}


def test_defaults_only(tmp_path):
    got = _checked(tmp_path)
    assert got["executor.renew_seconds"] == (10, "default")
    assert got["executor.pools.serve.agents"] == (2, "default")
    assert got["cas.provider"] == ("local", "default") and got["state.url"] == (None, "default")
    assert {source for _, source in got.values()} == {"default"}
    assert "home" not in got and not any(k.startswith("plugins.") for k in got)


def test_each_value_names_the_source_that_gave_it(tmp_path):
    text = "[plugins.executor]\nrenew_seconds = 5\ngrace_seconds = 40\n[plugins.executor.pools.gpu]\nagents = 3\n"
    env = {
        "PILOOP_EXECUTOR__POOLS__GPU__EVALUATIONS": "2",
        "PILOOP_NAMESPACE": "ns1",
        "PILOOP_PLUGINS": '{"executor": {"grace_seconds": 45}}',
    }
    got = _checked(tmp_path, text, env)
    assert got["executor.renew_seconds"] == (5, "config.toml")
    assert got["executor.grace_seconds"] == (45, "env PILOOP_PLUGINS")  # the later source wins, and is named
    assert got["executor.pools.gpu.agents"] == (3, "config.toml")
    assert got["executor.pools.gpu.evaluations"] == (2, "env PILOOP_EXECUTOR__POOLS__GPU__EVALUATIONS")
    assert got["executor.pools.gpu.max_load"] == (None, "default")  # a table given, a key of it not
    assert got["namespace"] == ("ns1", "env PILOOP_NAMESPACE")
    # the daemon's own pool, which the model adds when the file has only others, is a default
    assert got["executor.pools.serve.agents"] == (2, "default")
    assert got["executor.toleration_seconds"] == (300, "default")


def test_no_secret_is_shown(tmp_path):
    text = (
        '[plugins.cas]\nprovider = "s3"\nbucket = "b"\naccess_key_id = "AKIA-id-s3cr3t"\n'
        'secret_access_key = "s3-s3cr3t"\nendpoint_url = "http://minio:mn-s3cr3t@minio:9000"\n'
        "[plugins.executor.pools.gpu.provisioner]\nmax = 1\n"
        '[plugins.executor.pools.gpu.provisioner.compute]\nprovider = "local"\n'
        'env = {API_TOKEN = "env-s3cr3t", REGION = "eu-west-1"}\n'
    )
    env = {"PILOOP_REDIS_URL": "redis://app:pw-s3cr3t@redis.internal:6379/0"}
    got = _checked(tmp_path, text, env)
    assert "s3cr3t" not in json.dumps(got)
    assert got["cas.access_key_id"] == (MASK, "config.toml") and got["cas.secret_access_key"] == (MASK, "config.toml")
    assert got["state.url"] == (f"redis://app:{MASK}@redis.internal:6379/0", "env PILOOP_REDIS_URL")
    assert got["cas.endpoint_url"][0] == f"http://minio:{MASK}@minio:9000"
    assert got["executor.pools.gpu.provisioner.compute.env"][0] == {"API_TOKEN": MASK, "REGION": "eu-west-1"}


def test_urls_keep_all_but_their_password():
    assert mask_url("redis://redis.internal:6379/0") == "redis://redis.internal:6379/0"
    assert mask_url("rediss://:p@ss@h:1/0?ssl_cert_reqs=none") == f"rediss://:{MASK}@h:1/0?ssl_cert_reqs=none"
    assert mask_url("unix:///run/redis.sock?db=0&password=x1") == f"unix:///run/redis.sock?db=0&password={MASK}"
    assert mask_url("not a url") is None
    from pydantic import SecretStr

    assert masked(SecretStr("plain-secret")) == MASK  # a secret that is no URL is hidden whole


def test_an_invalid_config_is_the_loaders_error(tmp_path):
    from piloop_common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"executor\.renew_second: unknown key"):
        _checked(tmp_path, "[plugins.executor]\nrenew_second = 3\n")


FULL = """\
namespace = "prod"
log_format = "json"

[plugins.executor]
renew_seconds = 5
grace_seconds = 30
run_as = "piloop-job"

[plugins.executor.pools.gpu]
agents = 1
evaluations = 4
memory_mb = 8192

[plugins.executor.pools.gpu.provisioner]
max = 3
idle_seconds = 600

[plugins.executor.pools.gpu.provisioner.compute]
provider = "modal"
image = "ghcr.io/example/piloop:1"
gpu = "A100"
secrets = ["hf"]
registry = { kind = "basic", secret = "ghcr" }

[plugins.cas]
provider = "cached"
local_max_gb = 50

[plugins.cas.remote]
provider = "s3"
bucket = "piloop"
region = "eu-west-1"

[plugins.network]
provider = "proxy"
listen = "0.0.0.0:8443"
tls = "proxy"
claims = { email = "X-Auth-Email" }
name_claims = ["email"]

[[plugins.network.rules]]
when = { email = "ops@example.com" }
access = "act"
role = "operator"

[plugins.state]
url = "redis://redis:6379/0"

[plugins.retention]
finished_seconds = 86400
"""


@pytest.mark.parametrize("text", [CONFIG_TEMPLATE, FULL, ""], ids=["init", "full", "empty"])
def test_the_schema_validates_real_configs(text):
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.Draft202012Validator(schema()).validate(tomllib.loads(text))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[plugins.executor]\nrenew_second = 3\n", "renew_second"),
        ('[plugins.executor.pools.gpu]\nagents = "two"\n', "two"),
        ('[plugins.cas]\nprovider = "ftp"\n', "ftp"),
        ('home = "/x"\n', "home"),
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(text, why):
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.Draft202012Validator(schema()).validate(tomllib.loads(text))
    assert why in str(e.value)
