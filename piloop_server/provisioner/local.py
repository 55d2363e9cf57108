"""The `local` provider: workers as `piloop worker` processes on the server's own machine.

Each gets a home of its own (`$PILOOP_HOME/provisioned/<name>`), the server's CAS as `PILOOP_PLUGINS` (the
compute's `env` may override it), its token (none on the proxy network), and the tag: the server's id in its environment, read back from
`/proc/<pid>/environ` when listing, so two servers on one machine never stop each other's workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from piloop_common.config.provisioner import LocalCompute
from piloop_common.prctl import LOCAL_PROVISIONED_ENV
from piloop_server.provisioner.base import NAME_ENV, TAG_ENV, Handle, StartRefused

POOL_ENV = "PILOOP_PROVISIONED_POOL"
STOP_GRACE_SECONDS = 5.0  # SIGTERM (the worker detaches), then SIGKILL
HANG = "import time\nwhile True: time.sleep(60)"
HOMES = "provisioned"  # under the server's home: one home per started worker, removed once it stopped
WORKER_LOG = "worker.log"  # in a started worker's home: its stdout and stderr
NAMED = re.compile(r".+-\d+")  # a started worker's name, `<pool>-<n>` (ProvisionedState.new_name)


def homes(server_home: Path) -> Path:
    """Where the started workers' homes are."""
    return server_home / HOMES


class LocalProvider:
    def __init__(
        self, pool: str, compute: LocalCompute, *, url: str, home: Path, tag: str, cas_plugins: dict[str, Any]
    ) -> None:
        self.pool, self.compute, self.url, self.home, self.tag = pool, compute, url, home, tag
        self.cas_plugins = cas_plugins

    def _home(self, name: str) -> Path:
        return homes(self.home) / name

    def start(self, name: str, token: str | None, env: dict[str, str]) -> Handle:
        if self.compute.refuse:
            raise StartRefused(f"local: pool {self.pool} refuses every start (refuse = true)")
        home = self._home(name)
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        penv = {k: v for k, v in os.environ.items() if not k.startswith("PILOOP_")}
        penv.update(self.compute.env)
        penv.update({"PILOOP_HOME": str(home), "PILOOP_PLUGINS": _plugins(self.cas_plugins, self.compute.env)})
        penv.update(env)
        penv.pop("PILOOP_HTTPS_TOKEN", None)  # the compute's env names no token: the server gives one, or none
        if token:
            penv["PILOOP_HTTPS_TOKEN"] = token
        penv.update({TAG_ENV: self.tag, NAME_ENV: name, POOL_ENV: self.pool, LOCAL_PROVISIONED_ENV: "1"})
        if self.compute.hang:
            # the home in argv lets an operator (and the tests' cleanup) find it like a real worker
            argv = [sys.executable, "-c", HANG, str(home)]
        else:
            argv = [
                sys.executable,
                "-m",
                "piloop_common.cli",
                "--home",
                str(home),
                "worker",
                "--server",
                self.url,
                "--pool",
                self.pool,
                "--name",
                name,
            ]
        try:
            pid = _spawn_detached(argv, penv, home / WORKER_LOG)
        except OSError:
            shutil.rmtree(home, ignore_errors=True)  # no worker ever ran in it: nothing to keep for a re-attach
            raise
        return Handle(name, self.pool, _id(pid))

    def stop(self, handle: Handle) -> None:
        pid = int(handle.id.split(":")[0])
        proc = _same(handle.id)
        if proc is not None:
            leads = False
            with contextlib.suppress(OSError):
                # its own session: the worker and its shim host (jobs' shims have sessions of their own)
                leads = os.getpgid(pid) == pid
                os.killpg(pid, signal.SIGTERM) if leads else proc.terminate()
            if not _ended(handle.id, STOP_GRACE_SECONDS):
                # the whole group: a stopped (SIGSTOPped, silent) worker's shim host never takes the SIGTERM either
                with contextlib.suppress(OSError, psutil.Error):
                    os.killpg(pid, signal.SIGKILL) if leads and _same(handle.id) is not None else proc.kill()
                _ended(handle.id, STOP_GRACE_SECONDS)
        if _same(handle.id) is None and handle.name and handle.pool == self.pool:
            shutil.rmtree(self._home(handle.name), ignore_errors=True)

    def unused_homes(self) -> dict[str, Path]:
        """Every started worker's home (a directory named like one, `<pool>-<n>`, of any pool) that no process of
        ours runs in: none has it as its PILOOP_HOME, whatever its tag (a job's shim inherits it from its worker)."""
        try:
            found = {d.name: d for d in homes(self.home).iterdir() if NAMED.fullmatch(d.name) and d.is_dir()}
        except FileNotFoundError:
            return {}
        if found:
            in_use = set()
            for p in _ours():
                with contextlib.suppress(psutil.Error, OSError):
                    in_use.add(p.environ().get("PILOOP_HOME", ""))
            found = {name: d for name, d in found.items() if str(d) not in in_use}
        return found

    def list(self, tag: str) -> list[Handle]:
        found: dict[int, tuple[str, str, int]] = {}
        for p in _ours():
            try:
                env = p.environ()
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
            except (psutil.Error, OSError):
                continue
            if env.get(TAG_ENV) == tag and env.get(NAME_ENV):
                found[p.pid] = (env[NAME_ENV], env.get(POOL_ENV, ""), p.info.get("ppid") or 0)
        out = []
        for pid, (name, pool, ppid) in found.items():
            # a worker's shim host and jobs inherit its environment: only the top of each tree is the worker
            if ppid in found and found[ppid][0] == name:
                continue
            with contextlib.suppress(psutil.Error):
                out.append(Handle(name, pool, _id(pid)))
        return out


def _ours() -> list[psutil.Process]:
    """The processes of this user."""
    me = os.getuid()
    return [p for p in psutil.process_iter(["pid", "ppid", "uids"]) if (u := p.info.get("uids")) and u.real == me]


def _plugins(cas: dict[str, Any], env: dict[str, str]) -> str:
    """The server's CAS, under the compute's own PILOOP_PLUGINS (such as the proxy network), which wins."""
    try:
        theirs = json.loads(env.get("PILOOP_PLUGINS") or "{}")
    except ValueError:
        return env["PILOOP_PLUGINS"]  # the worker says what is wrong with it
    return json.dumps({"cas": cas, **theirs} if isinstance(theirs, dict) else theirs)


# Run by a short-lived interpreter between us and the worker: it starts the worker in a session of its own, says
# its pid, and exits, so the worker's parent is init. So a worker never dies with (nor is reaped by, nor lingers as
# a zombie of) the background process that started it, which may be restarted at any time.
_LAUNCH = """import json, subprocess, sys
a = json.load(sys.stdin)
with open(a["log"], "ab") as out:
    p = subprocess.Popen(a["argv"], env=a["env"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                         start_new_session=True)
print(p.pid)
"""


def _spawn_detached(argv: list[str], env: dict[str, str], log: Path) -> int:
    # the worker's environment goes through stdin, so the launcher itself never carries our tag (and is never
    # listed as a worker)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _LAUNCH],
        input=json.dumps({"argv": argv, "env": env, "log": str(log)}),
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("PILOOP_")},
    )
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise OSError(f"local: could not start {argv[0]}: {done.stderr.strip()[-500:] or done.returncode}")
    return int(done.stdout.strip())


def _id(pid: int) -> str:
    return f"{pid}:{psutil.Process(pid).create_time():.2f}"


def _ended(hid: str, timeout: float) -> bool:
    """Wait until the process has ended. Not psutil's wait: the worker is not our child, and its zombie lasts until
    init reaps it, which need not be soon."""
    end = time.monotonic() + timeout
    while _same(hid) is not None:
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def _same(hid: str) -> psutil.Process | None:
    """The process a handle names, unless it ended (and its pid was reused)."""
    pid, _, created = hid.partition(":")
    try:
        p = psutil.Process(int(pid))
        if f"{p.create_time():.2f}" != created or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.Error, ValueError):
        return None
