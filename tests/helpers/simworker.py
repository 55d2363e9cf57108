"""A protocol-level worker for server tests: real HTTP calls, no job processes.

The real worker (`piloop worker`) is tested on its own; this one lets server tests hold,
renew and drop leases exactly when they want to.
"""

from __future__ import annotations

import uuid

from piloop_common.protocol.worker import PROTOCOL, HostSample
from piloop_common.sdk.client import ApiClient


def sample(load1: float = 0.5, cpus: int = 4, mem: float = 16.0, disk: float = 100.0) -> dict:
    return HostSample(cpus=cpus, load1=load1, memory_available_gb=mem, disk_free_gb=disk).model_dump()


class SimWorker:
    def __init__(self, api: ApiClient, pool: str, cas_id: str, image: str = "", protocol: int = PROTOCOL) -> None:
        self.api, self.pool, self.cas_id, self.image, self.protocol = api, pool, cas_id, image, protocol
        self.held: dict[str, str] = {}
        self.sample = sample()
        self.name = ""

    def hello(self) -> dict:
        return {
            "protocol": self.protocol,
            "pool": self.pool,
            "image": self.image,
            "cas_id": self.cas_id,
            "sample": self.sample,
            "jobs": [{"job": j, "token": t} for j, t in self.held.items()],
        }

    def register(self) -> dict:
        got = self.api.call("POST", "/v1/worker/register", self.hello())
        self.name = got["worker"]
        return got

    def heartbeat(self) -> dict[str, str]:
        got = self.api.call("POST", "/v1/worker/heartbeat", self.hello())["jobs"]
        for j, st in got.items():
            if st == "lost":
                self.held.pop(j, None)
        return got

    def claim(self, agent: int = 0, evaluation: int = 1) -> dict:
        got = self.api.call(
            "POST", "/v1/worker/claim", {"protocol": self.protocol, "want": {"agent": agent, "evaluation": evaluation}}
        )
        for lease in got["leases"]:
            self.held[lease["job"]] = lease["token"]
        return got

    def report(
        self, job: str, outcome: str = "succeeded", token: str | None = None, report_id: str | None = None, **extra
    ) -> dict:
        body = {
            "protocol": self.protocol,
            "report_id": report_id or uuid.uuid4().hex,
            "job": job,
            "token": token or self.held[job],
            "outcome": outcome,
            "exit_code": 0 if outcome == "succeeded" else 1,
            **extra,
        }
        got = self.api.call("POST", "/v1/worker/report", body)
        self.held.pop(job, None)
        return got
