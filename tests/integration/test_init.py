"""`piloop init` on a fresh home: the embedded Redis with AOF, the local CAS, the daemon and its worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.redis import wait_for
from tests.helpers.serve import cli_env, piloop, short_home


def test_init_runs_everything_on_the_embedded_defaults_and_stop_keeps_the_data():
    home = short_home("init")
    try:
        r = piloop(home, "init", timeout=90)
        assert r.returncode == 0, r.stderr
        assert "wrote" in r.stdout and "the daemon is running" in r.stdout
        assert (home / "config.toml").read_text().startswith("# piloop's config")
        assert oct((home / "piloop.sock").stat().st_mode & 0o777) == "0o600"
        assert oct(home.stat().st_mode & 0o777) == "0o700"
        assert (home / "redis" / "redis.sock").exists()
        # the default pool keeps jobs off a host over 1.5 load per CPU, which a loaded test machine can be: this
        # test is about init, so lift that threshold with a limit (the rest stays the embedded defaults)
        piloop(home, "limits", "set", "executor.pools.serve.max_load=1000", "--reason", "test machine load", check=True)
        job = piloop(home, "job", "submit", "--", "sh", "-c", "echo hi", check=True).stdout.strip()
        assert piloop(home, "job", "wait", job, timeout=60).returncode == 0
        st = json.loads(piloop(home, "status", "--json", check=True).stdout)
        assert st["redis"]["embedded"] and st["cas"]["provider"] == "local"
        aof = list((home / "redis").glob("appendonly*"))
        assert aof, "the embedded Redis keeps an AOF"
        again = piloop(home, "init")
        assert "already running" in again.stdout
        assert piloop(home, "stop", timeout=90).returncode == 0
        wait_for(
            lambda: not (home / "redis" / "redis.sock").exists() or not _redis_up(home),
            15,
            what="the embedded Redis to stop with the daemon",
        )
        # a new daemon finds the job where the old one left it: the AOF kept it
        proc = subprocess.Popen(
            [sys.executable, "-m", "piloop_common.cli", "serve", "--detach"],
            env=cli_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        shown = json.loads(piloop(home, "job", "show", job, "--json", check=True).stdout)
        assert shown["state"] == "succeeded" and shown["worker"] == "serve"
    finally:
        piloop(home, "stop", timeout=90)
        subprocess.run(["pkill", "-f", str(home)], check=False)


def _redis_up(home) -> bool:
    import redis

    try:
        with redis.Redis(unix_socket_path=str(home / "redis" / "redis.sock"), socket_connect_timeout=0.5) as c:
            return bool(c.ping())
    except (redis.exceptions.RedisError, OSError):
        return False


def test_events_follow_prints_new_events_as_they_happen(daemon):
    proc = subprocess.Popen(
        [sys.executable, "-m", "piloop_common.cli", "events", "--follow", "--last", "0"],
        env=cli_env(daemon.home, daemon.env),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: proc.poll() is None, 5, what="events --follow to start")
        job = daemon.cli("job", "submit", "--", "true", check=True).stdout.strip()
        os.set_blocking(proc.stdout.fileno(), False)
        seen = []

        def got_it() -> bool:
            line = proc.stdout.readline()
            if line:
                seen.append(line)
            return any("job.queued" in s and job in s and "human:" in s for s in seen)

        wait_for(got_it, 15, interval=0.05, what="job.queued in events --follow")
    finally:
        proc.terminate()
        proc.wait(10)
