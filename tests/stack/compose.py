"""The compose stack under test: docker-compose.yml with tests/stack/compose.stack.yml (the images built here) and
compose.test.yml (short lease timings), under a project name of its own, an env file of its own, and free host
ports, so it never touches a stack of the same machine's user."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.helpers.redis import free_port
from tests.stack import images

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROJECT = "piloop-stacktest"


class Stack:
    def __init__(self, compose: str, workdir: Path) -> None:
        self.compose, self.port = compose, free_port()
        self.env_file = workdir / "stack.env"
        self.values = {
            "MINIO_ROOT_USER": "stack-admin",
            "MINIO_ROOT_PASSWORD": "stack-root-secret",
            "PILOOP_S3_ACCESS_KEY_ID": "piloop",
            "PILOOP_S3_SECRET_ACCESS_KEY": "stack-s3-secret",
            "PILOOP_HTTPS_TOKEN": "",
            "PILOOP_PORT": str(self.port),
            "MINIO_CONSOLE_PORT": str(free_port()),
            "PILOOP_IMAGE_TAG": images.SERVER,
            "PILOOP_WORKER_IMAGE_TAG": images.WORKER,
        }
        self.write_env()

    def write_env(self) -> None:
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.values.items()))

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [
            self.compose, "-p", PROJECT, "--env-file", str(self.env_file), "--project-directory", str(REPO),
            "-f", str(REPO / "docker-compose.yml"), "-f", str(HERE / "compose.stack.yml"),
            "-f", str(HERE / "compose.test.yml"), *args,
        ]  # fmt: skip
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        if check and p.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
        return p

    def compose_exec(self, service: str, *cmd: str) -> str:
        """`docker compose exec -T service cmd…`: its stdout. Compose v2.40 answers 0 whatever the command's exit
        status on Engine 20.10 (Debian's), so a failure shows only as what it printed: for commands whose output
        is checked; `exec` is the one whose status counts."""
        return self.run("exec", "-T", service, *cmd, timeout=120).stdout

    def exec(self, service: str, *cmd: str, check: bool = True, index: int = 1) -> subprocess.CompletedProcess[str]:
        """`cmd` in the service's container (its `index`th), through the Docker API: its real exit status."""
        import docker

        (container,) = docker.from_env().containers.list(
            filters={"label": [f"com.docker.compose.project={PROJECT}", f"com.docker.compose.service={service}",
                               f"com.docker.compose.container-number={index}"]}
        )  # fmt: skip
        code, (out, err) = container.exec_run(list(cmd), demux=True)
        p = subprocess.CompletedProcess(list(cmd), code, (out or b"").decode(), (err or b"").decode())
        if check and code != 0:
            raise AssertionError(f"{service}: {' '.join(cmd)} exited {code}:\n{p.stderr[-3000:]}")
        return p

    def piloop(self, *args: str) -> str:
        """`docker compose exec server piloop …`: its stdout."""
        return self.exec("server", "piloop", *args).stdout

    def piloop_json(self, *args: str) -> Any:
        return json.loads(self.piloop(*args, "--json"))

    def ps(self) -> list[dict[str, Any]]:
        out = self.run("ps", "--all", "--format", "json").stdout.strip()
        if out.startswith("["):
            return json.loads(out)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def containers(self, service: str) -> list[dict[str, Any]]:
        return [c for c in self.ps() if c["Service"] == service]

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "60", check=False, timeout=60).stdout[-12000:]

    def down(self, volumes: bool = False) -> None:
        self.run("down", "--timeout", "30", *(["--volumes"] if volumes else []), timeout=300)


def wait(cond, timeout: float, what: str, interval: float = 0.5):  # type: ignore[no-untyped-def]
    """Poll `cond` until truthy (exceptions count as not yet), or fail naming `what` and the last exception."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            if v := cond():
                return v
        except Exception as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:g}s (last error: {last!r})")
