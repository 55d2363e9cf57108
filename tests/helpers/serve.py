"""A real `piloop serve` process on a temp home, driven like an operator would."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from piloop_common.errors import Unavailable
from piloop_common.sdk.client import ApiClient
from tests.helpers.slowdown import scaled

# Short timings for tests; the config validates toleration > grace + 2·renew + request timeout + kill grace.
FAST_EXECUTOR = """
[plugins.executor]
renew_seconds = 0.5
grace_seconds = 2
toleration_seconds = 6
request_timeout_seconds = 1
kill_grace_seconds = 0.5
pass_seconds = 0.2

[plugins.executor.pools.serve]
agents = 1
evaluations = 2
max_load = 1000
min_memory_gb = 0
"""


def fast_executor(toleration_seconds: float) -> str:
    """FAST_EXECUTOR with another lease toleration: fenced later, for tests about a restart that takes seconds on a
    loaded machine, not about the fence."""
    config = FAST_EXECUTOR.replace("toleration_seconds = 6\n", f"toleration_seconds = {toleration_seconds:g}\n")
    assert config != FAST_EXECUTOR or toleration_seconds == 6, "FAST_EXECUTOR no longer says toleration_seconds = 6"
    return config


def short_home(prefix: str = "pl") -> Path:
    """A home whose socket path fits in AF_UNIX's 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix + "-", dir="/tmp"))


def cli_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PILOOP_")}
    env["PILOOP_HOME"] = str(home)
    env.update(extra or {})
    return env


def piloop(
    home: Path,
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    timeout: float = 60,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """Run the real CLI as a user would (a new process each time); `timeout` stretched by PILOOP_TEST_SLOWDOWN."""
    proc = subprocess.run(
        [sys.executable, "-m", "piloop_common.cli", *args],
        env=cli_env(home, env),
        capture_output=True,
        text=True,
        input=input,
        timeout=scaled(timeout),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"piloop {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


class Daemon:
    def __init__(
        self,
        home: Path,
        config: str = FAST_EXECUTOR,
        redis_url: str | None = None,
        namespace: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.home = home
        self.home.mkdir(parents=True, exist_ok=True)
        text = config
        if redis_url:
            text += f'\n[plugins.state]\nurl = "{redis_url}"\n'
        (home / "config.toml").write_text(text)
        self.env = dict(env or {})
        if namespace:
            self.env["PILOOP_NAMESPACE"] = namespace
        self.proc: subprocess.Popen | None = None
        self.listen: str | None = None

    def start(self, listen: str | None = None, timeout: float = 30, args: tuple[str, ...] = ()) -> Daemon:
        """`piloop serve [--listen …] [args…]` (args: `--replica`), once it answers."""
        self.listen = listen
        argv = [sys.executable, "-m", "piloop_common.cli", "serve", *(["--listen", listen] if listen else []), *args]
        (self.home / "logs").mkdir(exist_ok=True)
        self.log = open(self.home / "logs" / "test-daemon.log", "ab")
        self.proc = subprocess.Popen(
            argv, env=cli_env(self.home, self.env), stdout=self.log, stderr=self.log, start_new_session=True
        )
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        while not self.healthy():  # raises at once when the daemon exits (a refused start)
            if time.monotonic() > deadline:
                raise AssertionError(f"piloop serve on {self.home} did not answer within {timeout:g}s")
            time.sleep(0.05)
        return self

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"piloop serve exited {self.proc.returncode}: {self.daemon_log()[-2000:]}")
        try:
            with self.api(timeout=2) as api:
                return bool(api.call("GET", "/v1/health")["ok"])
        except Unavailable:
            return False

    def daemon_log(self) -> str:
        p = self.home / "logs" / "test-daemon.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def api(self, timeout: float = 10) -> ApiClient:
        return ApiClient.local(self.home, timeout=timeout)

    def cli(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return piloop(self.home, *args, env={**self.env, **kw.pop("env", {})}, **kw)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(scaled(timeout))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def cleanup(self) -> None:
        self.stop()
        # the serve worker's slot supervisors (their command line names their dir) and the embedded Redis
        subprocess.run(["pkill", "-f", str(self.home)], check=False)
        shutil.rmtree(self.home, ignore_errors=True)
