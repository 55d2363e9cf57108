"""The `docker` provider's compute in config.toml: what it accepts, and a one-line refusal naming the key."""

from __future__ import annotations

import pytest

from piloop_common.config.docker import DockerCompute
from piloop_common.config.load import load_settings
from piloop_common.errors import ConfigError

POOL = """
[plugins.executor.pools.gpu]
[plugins.executor.pools.gpu.provisioner]
max = 2
[plugins.executor.pools.gpu.provisioner.compute]
provider = "docker"
image = "piloop-worker:0.3"
"""


def test_a_docker_pool_loads_with_its_limits(tmp_path):
    (tmp_path / "config.toml").write_text(
        POOL + 'network = "host"\ncpus = 1.5\nmemory_mb = 2048\ngpus = "all"\nvolumes = ["/srv/cache:/cache:ro"]\n'
    )
    c = load_settings(tmp_path, env={}).executor.pools["gpu"].provisioner.compute  # type: ignore[union-attr]
    assert isinstance(c, DockerCompute)
    assert (c.image, c.network, c.cpus, c.memory_mb, c.gpus, c.pull) == (
        "piloop-worker:0.3", "host", 1.5, 2048, "all", "missing",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('gpus = 1\ngpu_ids = ["0"]\n', "give gpus (1) or gpu_ids (['0']), not both"),
        ('volumes = ["cache:/cache"]\n', "volumes: 'cache:/cache' is not HOST:CONTAINER[:ro|rw] with absolute paths"),
        ("cpus = 0\n", "cpus"),
        ('pull = "sometimes"\n', "pull"),
    ],
)
def test_a_bad_docker_compute_is_refused_naming_what_is_wrong(tmp_path, extra, says):
    (tmp_path / "config.toml").write_text(POOL + extra)
    with pytest.raises(ConfigError) as e:
        load_settings(tmp_path, env={})
    assert says in e.value.message and "executor.pools.gpu.provisioner.compute" in e.value.message, e.value.message
    assert "\n" not in e.value.message.strip()


def test_a_docker_pool_without_an_image_is_refused(tmp_path):
    (tmp_path / "config.toml").write_text(POOL.replace('image = "piloop-worker:0.3"\n', ""))
    with pytest.raises(ConfigError) as e:
        load_settings(tmp_path, env={})
    assert "image" in e.value.message, e.value.message
