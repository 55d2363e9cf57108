"""The `modal` provider against a fake of Modal's SDK: the exact calls it makes, and its errors in piloop's words."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from piloop_common.config.provisioner import ModalCompute
from piloop_server.provisioner import PlatformAuthError, StartRefused, open_provider

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fake_modal"


@pytest.fixture
def modal(monkeypatch):
    for m in [m for m in sys.modules if m == "modal" or m.startswith("modal.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.syspath_prepend(str(FAKE))
    assert "modal" not in sys.modules  # nothing imports it until a pool uses it
    yield lambda: sys.modules["modal"]
    for m in [m for m in sys.modules if m == "modal" or m.startswith("modal.")]:
        del sys.modules[m]


def _provider(**compute):
    cfg = ModalCompute(image="ghcr.io/acme/piloop-worker:0.3", **compute)
    return open_provider(
        "gpu", cfg, url="https://piloop.example.com:8443", home=Path("/nonexistent"), tag="srv1", cas_plugins={}
    )


def test_start_passes_the_image_gpu_secrets_tags_name_and_timeouts(modal):
    p = _provider(
        gpu="A100",
        cpu=4.0,
        memory_mb=32768,
        secrets=["piloop-cas"],
        env={"A": "1"},
        idle_timeout_seconds=600,
        registry={"kind": "aws-ecr", "secret": "piloop-ecr-pull"},
    )
    m = modal()
    h = p.start("gpu-1", "plt_x", {"PILOOP_PROVISIONER_TAG": "srv1"})
    what, args, kwargs = m.calls[-1]
    assert what == "Sandbox.create"
    assert args == (
        "piloop",
        "worker",
        "--server",
        "https://piloop.example.com:8443",
        "--pool",
        "gpu",
        "--name",
        "gpu-1",
    )
    assert kwargs == {
        "app": m.App("piloop-workers"),
        "name": "piloop-srv1-gpu-1",
        "image": m.Image("aws-ecr", "ghcr.io/acme/piloop-worker:0.3", m.Secret("piloop-ecr-pull")),
        "env": {"A": "1", "PILOOP_PROVISIONER_TAG": "srv1", "PILOOP_HTTPS_TOKEN": "plt_x"},
        "secrets": [m.Secret("piloop-cas")],
        "tags": {"piloop-server": "srv1", "piloop-worker": "gpu-1", "piloop-pool": "gpu"},
        "timeout": 24 * 3600,
        "gpu": "A100",
        "cpu": 4.0,
        "memory": 32768,
        "idle_timeout": 600,
    }
    assert (h.name, h.pool, h.id) == ("gpu-1", "gpu", m.Sandbox.live[h.id].object_id)


@pytest.mark.parametrize(
    "registry, image", [(None, ("registry", None)), ({"kind": "basic", "secret": "pull"}, ("registry", "pull"))]
)
def test_a_public_image_and_a_basic_registry(modal, registry, image):
    p = _provider(registry=registry)
    m = modal()
    p.start("gpu-2", "plt_y", {})
    kwargs = m.calls[-1][2]
    kind, secret = image
    assert kwargs["image"] == m.Image(kind, "ghcr.io/acme/piloop-worker:0.3", m.Secret(secret) if secret else None)
    assert "gpu" not in kwargs and "idle_timeout" not in kwargs and kwargs["secrets"] == []


def test_list_finds_only_this_servers_sandboxes_and_stop_is_terminate(modal):
    p = _provider()
    other = open_provider("gpu", ModalCompute(image="x"), url="u", home=Path("/"), tag="srv2", cas_plugins={})
    m = modal()
    mine = p.start("gpu-1", "plt_a", {})
    other.start("gpu-1", "plt_b", {})
    assert p.list("srv1") == [mine]
    p.stop(mine)
    assert m.calls[-1] == ("Sandbox.terminate", (mine.id,), {})
    assert p.list("srv1") == []
    p.stop(mine)  # not found: already stopped


@pytest.mark.parametrize("mode, error", [("quota", StartRefused), ("auth", PlatformAuthError)])
def test_a_quota_is_a_refusal_and_bad_credentials_stop_the_pool(modal, monkeypatch, mode, error):
    p = _provider()
    monkeypatch.setenv("FAKE_MODAL_MODE", mode)
    with pytest.raises(error, match="modal: "):
        p.start("gpu-1", "plt_a", {})
