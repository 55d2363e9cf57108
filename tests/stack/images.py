"""The images the compose stack runs where no image registry answers, built here: the base from Debian's archive
(tests/stack/base.sh), a Python base on it, Redis and an S3 endpoint (moto) standing in for the official and MinIO
images (tests/stack/dockerfiles/), and piloop's two images from the project's Dockerfile on that Python base.

Through the Docker SDK for Python (the daemon's classic builder: no buildx needed), each build's seconds and each
image's size written to $PILOOP_STACK_CACHE/images.json for docs/compose.md. `python -m tests.stack.images` builds
them all and prints that table; the stack tests' fixture calls `build_all` (layers cached by the daemon: a second
run with no change is seconds).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = Path(os.environ.get("PILOOP_STACK_CACHE", "/var/cache/piloop-stack"))
CA_BUNDLE = Path(os.environ.get("PILOOP_STACK_CA", "/etc/ssl/certs/ca-certificates.crt"))

BASE = "piloop-base:bookworm"
PYTHON = "piloop-python:bookworm"
REDIS = "piloop-stack-redis:bookworm"
S3 = "piloop-stack-s3:bookworm"
SERVER = "piloop:stack"
WORKER = "piloop-worker:stack"


class BuildError(RuntimeError):
    pass


def base() -> None:
    """piloop-base:bookworm from the cached debootstrap tarball, made once per machine."""
    done = subprocess.run(["sh", str(HERE / "base.sh")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise BuildError(f"tests/stack/base.sh failed: {(done.stderr or done.stdout).strip()[-2000:]}")


def _build(client: Any, *, path: str, tag: str, dockerfile: str = "Dockerfile", **kw: Any) -> float:
    started = time.monotonic()
    last: list[str] = []
    for chunk in client.api.build(path=path, dockerfile=dockerfile, tag=tag, rm=True, forcerm=True, decode=True, **kw):
        if "error" in chunk:
            raise BuildError(f"{tag}: {chunk['error'].strip()}\n{''.join(last[-30:])}")
        if "stream" in chunk:
            last.append(chunk["stream"])
    return time.monotonic() - started


def _context_with_ca(tmp: Path) -> Path:
    """tests/stack/dockerfiles/ and this machine's CA bundle (never committed) as one build context."""
    ctx = tmp / "ctx"
    shutil.copytree(HERE / "dockerfiles", ctx)
    shutil.copy(CA_BUNDLE, ctx / "ca.crt")
    return ctx


def build_all(client: Any) -> dict[str, dict[str, float]]:
    """Every image the stack needs; {tag: {"seconds": build time, "mb": size}}."""
    base()
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="piloop-stack-") as tmp:
        ctx = str(_context_with_ca(Path(tmp)))
        times[PYTHON] = _build(client, path=ctx, tag=PYTHON, dockerfile="python.Dockerfile")
        times[REDIS] = _build(client, path=ctx, tag=REDIS, dockerfile="redis.Dockerfile")
        times[S3] = _build(client, path=ctx, tag=S3, dockerfile="s3.Dockerfile")
    args = {"BASE_IMAGE": PYTHON}
    # the worker first: the server's build then finds the shared `base` stage's layers cached
    times[WORKER] = _build(client, path=str(REPO), tag=WORKER, target="worker", buildargs=args)
    times[SERVER] = _build(client, path=str(REPO), tag=SERVER, target="server", buildargs=args)
    out = {
        tag: {"seconds": round(s, 1), "mb": round(client.images.get(tag).attrs["Size"] / 1e6, 1)}
        for tag, s in times.items()
    }
    if max(times.values()) < 2:
        return out  # every layer was cached: the figures of the run that built them stay
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "images.json").write_text(json.dumps(out, indent=1))
    except OSError:
        pass
    return out


def main() -> int:
    import docker

    client = docker.from_env()
    try:
        got = build_all(client)
    except BuildError as e:
        print(f"stack: {e}", file=sys.stderr)
        return 1
    for tag, v in got.items():
        print(f"{tag:32} {v['seconds']:7.1f}s {v['mb']:8.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
