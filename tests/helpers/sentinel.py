"""A Redis primary, its replica and three Sentinels watching them: real processes on free ports, in a tmp dir.

Sentinel's timings are short (`down-after-milliseconds` 1000, `failover-timeout` 5000), so a SIGKILLed primary is
replaced within a few seconds. The same redis-server binary runs as each (`--sentinel`); with a `password`, the
Sentinels require it (`requirepass`), the primary and replica do not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import redis

from tests.helpers.certs import Pki
from tests.helpers.redis import RedisProcess, free_port, redis_server_binary, wait_for

SERVICE = "piloop"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


class SentinelSet:
    def __init__(
        self,
        workdir: Path,
        sentinels: int = 3,
        password: str | None = None,
        pki: Pki | None = None,
        binary: str | None = None,
    ) -> None:
        self.dir = workdir
        self.password = password  # the Sentinels' own `requirepass` (they use it with each other too)
        # with a `pki`, every link is TLS too (a TLS port beside each plain one, which these helpers use): the
        # replica's to the primary, the Sentinels' to them and to each other, and a client's (`url`)
        self.pki, self.binary = pki, binary
        self.tls_ports = [free_port() for _ in range(2 + sentinels)] if pki is not None else []
        tls = self._tls_args
        self.primary = RedisProcess(workdir / "primary", binary=binary, extra=tls(0))
        leader = self.tls_ports[0] if pki is not None else self.primary.port
        self.replica = RedisProcess(
            workdir / "replica", binary=binary, extra=("--replicaof", "127.0.0.1", str(leader), *tls(1))
        )
        self.ports = [free_port() for _ in range(sentinels)]
        self.procs: list[subprocess.Popen] = []

    def _tls(self, i: int) -> list[tuple[str, str]]:
        """The TLS settings of process `i` (0 the primary, 1 the replica, then each Sentinel): its port, the test
        PKI, clients unchecked, and TLS for the links it makes."""
        if self.pki is None:
            return []
        p = self.pki
        return [
            *[("tls-port", str(self.tls_ports[i])), ("tls-cert-file", str(p.cert)), ("tls-key-file", str(p.key))],
            *[("tls-ca-cert-file", str(p.ca)), ("tls-auth-clients", "no"), ("tls-replication", "yes")],
        ]

    def _tls_args(self, i: int) -> tuple[str, ...]:
        return tuple(x for k, v in self._tls(i) for x in (f"--{k}", v))

    @property
    def url(self) -> str:
        if self.pki is not None:
            return "rediss+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.tls_ports[2:]) + f"/{SERVICE}"
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + f"/{SERVICE}"

    def start(self) -> SentinelSet:
        self.primary.start()
        self.replica.start()
        wait_for(lambda: self.link_up(self.replica), 20, what="the replica to sync with the primary")
        for i, port in enumerate(self.ports):
            d = self.dir / f"sentinel{i}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"  # Sentinel rewrites its file as it learns: it must be its own
            watched = self.tls_ports[0] if self.pki is not None else self.primary.port
            tls = "".join(f"{k} {v}\n" for k, v in self._tls(2 + i))
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\n" + tls + f"sentinel monitor {SERVICE} 127.0.0.1 {watched} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n" + (f"requirepass {self.password}\n" if self.password else "")
            )
            log = open(d / "sentinel.log", "ab")
            self.procs.append(
                subprocess.Popen(
                    [self.binary or redis_server_binary(), str(conf), "--sentinel"], stdout=log, stderr=log
                )
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
