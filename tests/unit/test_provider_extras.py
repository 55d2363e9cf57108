"""A pool whose provider's client library is an extra that is not installed is refused when the config loads,
naming the pool and the extra (issue 33: it failed silently for 2.5 minutes, at the pool's first start)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from piloop_common.config.load import load_settings
from piloop_common.errors import ConfigError

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fake_modal"
MODAL_POOL = """
[plugins.executor.pools.gpu]
[plugins.executor.pools.gpu.provisioner]
max = 2
[plugins.executor.pools.gpu.provisioner.compute]
provider = "modal"
image = "ghcr.io/acme/piloop-worker:0.3"
"""


@pytest.fixture
def no_modal():
    if importlib.util.find_spec("modal") is not None:
        pytest.skip("modal is installed here: the refusal needs an install without piloop-jobs[modal]")


def test_a_modal_pool_without_the_modal_extra_is_refused_naming_the_extra(tmp_path, no_modal):
    (tmp_path / "config.toml").write_text(MODAL_POOL)
    with pytest.raises(ConfigError) as e:
        load_settings(tmp_path, env={})
    assert e.value.message == (
        f'{tmp_path / "config.toml"}: executor.pools.gpu.provisioner.compute.provider = "modal" needs the '
        "piloop-jobs[modal] extra, which is not installed: pip install 'piloop-jobs[modal]'"
    )


def test_the_same_pool_from_the_environment_names_the_environment(tmp_path, no_modal):
    env = {
        "PILOOP_PLUGINS": '{"executor": {"pools": {"gpu": {"provisioner": {"max": 1, "compute": '
        '{"provider": "modal", "image": "x"}}}}}}'
    }
    with pytest.raises(ConfigError, match=r"^env PILOOP_PLUGINS: executor\.pools\.gpu\..*piloop-jobs\[modal\]"):
        load_settings(tmp_path, env=env)


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path, no_modal):
    (tmp_path / "config.toml").write_text(MODAL_POOL)
    r = subprocess.run(
        [sys.executable, "-m", "piloop_common.cli", "--home", str(tmp_path), "serve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("piloop: config: ") and "pip install 'piloop-jobs[modal]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "redis").exists()  # nothing started


def test_with_modal_importable_the_pool_loads(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE))
    importlib.invalidate_caches()
    (tmp_path / "config.toml").write_text(MODAL_POOL)
    s = load_settings(tmp_path, env={})
    assert s.executor.pools["gpu"].provisioner.compute.provider == "modal"
