"""What a started worker is given: its environment from the server, and its PILOOP_PLUGINS."""

from __future__ import annotations

import json
import types

import pytest

from piloop_common.config.provisioner import ProvisionerConfig
from piloop_server.provisioner import StartRefused, platform
from piloop_server.provisioner.local import _plugins


class _Secrets:
    def __init__(self, values: dict[str, str]) -> None:
        self.v = values

    def names(self) -> set[str]:
        return set(self.v)

    def values(self, names: list[str]) -> dict[str, str]:
        return {n: self.v[n] for n in names if n in self.v}

    def server_value(self, name: str) -> str | None:
        return self.v.get(name)


def _rt(network: str, secrets: dict[str, str]):
    pool = types.SimpleNamespace(
        provisioner=ProvisionerConfig(max=1, orphan_exit_seconds=60, compute={"provider": "local"})
    )
    settings = types.SimpleNamespace(plugins=types.SimpleNamespace(network=types.SimpleNamespace(provider=network)))
    return types.SimpleNamespace(
        executor=types.SimpleNamespace(pools={"gpu": pool}),
        server_id="srv1",
        settings=settings,
        secrets=_Secrets(secrets),
    )


@pytest.mark.parametrize("network, credential", [("proxy", "wk-1"), ("token", None)])
def test_a_started_worker_gets_the_proxy_credential_only_behind_the_proxy(network, credential):
    env = platform._env(_rt(network, {"PILOOP_WORKER_CREDENTIAL": "wk-1", "OTHER": "x"}), "gpu", "gpu-3")
    assert env.pop("PILOOP_WORKER_CREDENTIAL", None) == credential
    # told it is on the proxy network, through the env source of `[plugins.network] provider`
    assert env.pop("PILOOP_NETWORK__PROVIDER", None) == ("proxy" if credential else None)
    assert env == {
        "PILOOP_PROVISIONER_TAG": "srv1",
        "PILOOP_PROVISIONED_NAME": "gpu-3",
        "PILOOP_PROVISIONED_POOL": "gpu",
        "PILOOP_ORPHAN_EXIT_SECONDS": "60",
    }


def test_the_computes_plugins_keep_the_servers_cas_unless_they_name_one():
    cas = {"provider": "local", "path": "/srv/cas"}
    assert json.loads(_plugins(cas, {})) == {"cas": cas}
    got = json.loads(_plugins(cas, {"PILOOP_PLUGINS": '{"network": {"provider": "proxy"}}'}))
    assert got == {"cas": cas, "network": {"provider": "proxy"}}
    assert json.loads(_plugins(cas, {"PILOOP_PLUGINS": '{"cas": {"provider": "s3"}}'})) == {"cas": {"provider": "s3"}}


def test_a_start_on_the_proxy_network_without_the_credential_is_refused_naming_the_secret():
    with pytest.raises(StartRefused) as e:
        platform._env(_rt("proxy", {"OTHER": "x"}), "gpu", "gpu-3")
    assert "PILOOP_WORKER_CREDENTIAL" in e.value.message and "piloop secret set" in e.value.message
