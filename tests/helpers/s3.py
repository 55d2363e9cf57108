"""A real S3 endpoint for tests: `moto_server` in a subprocess on a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.slowdown import scaled

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_answers(url: str, proc: subprocess.Popen[bytes], deadline_seconds: float = 30) -> None:
    """Poll `url` until any HTTP answer comes back; fail early if `proc` died."""
    deadline_seconds = scaled(deadline_seconds)
    deadline = time.monotonic() + deadline_seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before answering at {url}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # an HTTP error is still an answer
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing answered at {url} within {deadline_seconds}s") from None
            time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def start_moto() -> Iterator[str]:
    """Start moto's S3 server, yield its endpoint URL, stop it on exit; sets dummy AWS credentials."""
    for name, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    port = free_port()
    binary = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **DUMMY_CREDENTIALS},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(url, proc)
        yield url
    finally:
        stop(proc)
