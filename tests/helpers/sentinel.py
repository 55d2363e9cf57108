"""A Redis primary, its replica and three Sentinels watching them: real processes on free ports, in a tmp dir.

Sentinel's timings are short (`down-after-milliseconds` 1000, `failover-timeout` 5000), so a SIGKILLed primary is
replaced within a few seconds. The same redis-server binary runs as each (`--sentinel`); with a `password`, the
Sentinels require it (`requirepass`), the primary and replica do not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import redis

from tests.helpers.redis import RedisProcess, free_port, redis_server_binary, wait_for

SERVICE = "piloop"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


class SentinelSet:
    def __init__(self, workdir: Path, sentinels: int = 3, password: str | None = None) -> None:
        self.dir = workdir
        self.password = password  # the Sentinels' own `requirepass` (they use it with each other too)
        self.primary = RedisProcess(workdir / "primary")
        self.replica = RedisProcess(workdir / "replica", extra=("--replicaof", "127.0.0.1", str(self.primary.port)))
        self.ports = [free_port() for _ in range(sentinels)]
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + f"/{SERVICE}"

    def start(self) -> SentinelSet:
        self.primary.start()
        self.replica.start()
        wait_for(lambda: self.link_up(self.replica), 20, what="the replica to sync with the primary")
        for i, port in enumerate(self.ports):
            d = self.dir / f"sentinel{i}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"  # Sentinel rewrites its file as it learns: it must be its own
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n" + (f"requirepass {self.password}\n" if self.password else "")
            )
            log = open(d / "sentinel.log", "ab")
            self.procs.append(
                subprocess.Popen([redis_server_binary(), str(conf), "--sentinel"], stdout=log, stderr=log)
            )
        for port in self.ports:  # each knows the replica and the other Sentinels: a failover can be agreed
            wait_for(lambda p=port: self.knows_all(p), 30, interval=0.1, what=f"Sentinel {port} to see the others")
        return self

    @staticmethod
    def link_up(rp: RedisProcess) -> bool:
        with redis.Redis(port=rp.port, socket_connect_timeout=0.5) as c:
            return c.info("replication").get("master_link_status") == "up"

    def knows_all(self, port: int) -> bool:
        with redis.Redis(port=port, password=self.password, socket_connect_timeout=0.5, decode_responses=True) as c:
            replicas = c.execute_command("SENTINEL", "REPLICAS", SERVICE)
            others = c.execute_command("SENTINEL", "SENTINELS", SERVICE)
            return len(replicas) == 1 and len(others) == len(self.ports) - 1

    def master_port(self) -> int:
        """The primary's port as the first Sentinel that answers names it."""
        for port in self.ports:
            try:
                with redis.Redis(
                    port=port, password=self.password, socket_connect_timeout=0.5, decode_responses=True
                ) as c:
                    return int(c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])
            except redis.exceptions.RedisError:
                continue
        raise AssertionError("no Sentinel answers")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        self.primary.stop(kill=True)
        self.replica.stop(kill=True)
