"""piloop's settings: the whole `config.toml` tree, each key typed and described once (`load.load_settings`
reads it from its sources; `reference` writes docs/configuration.md from it). `[plugins.network]` is in
`network`, `[plugins.provisioner]` in `provisioner`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from piloop_common.bytecaps import LOG_MAX_BYTES, RESULT_MAX_BYTES
from piloop_common.cas.config import CasConfig, LocalCasConfig
from piloop_common.config.model import ConfigModel
from piloop_common.config.network import NetworkConfig
from piloop_common.config.provisioner import ProvisionerConfig

CONFIG_FILE = "config.toml"


RUNNER_PROCESS: Literal["process"] = "process"


# --- executor ----------------------------------------------------------------------------


class PoolConfig(ConfigModel):
    agents: int = Field(2, ge=0, description="Agent slots per worker of this pool.")
    evaluations: int = Field(
        1,
        ge=0,
        description="Evaluation slots per worker of this pool; the pool `serve`'s: the host's CPUs (at least 2).",
    )
    max_load: float | None = Field(
        None,
        gt=0,
        description="A worker whose 1-minute load per CPU is over this takes no job; unset: the load holds none back "
        '(docs/worker.md, "Load and pressure").',
    )
    min_memory_gb: float = Field(0.5, ge=0, description="A worker with less free memory than this takes no job.")
    memory_mb: int | None = Field(
        None,
        gt=0,
        description="The memory grant (MiB) of a job of this pool that asks for none; unset: such a job has no grant and is limited to its worker's room.",
    )
    memory_max_mb: int | None = Field(
        None,
        gt=0,
        description="The most a grant raised after an out-of-memory attempt may reach (MiB), unless the job says; unset: its worker's room.",
    )
    memory_reserve_mb: int = Field(
        512, ge=0, description="A worker's room (the memory it grants) is its available memory less this (MiB)."
    )
    memory_held_seconds: float = Field(
        60,
        gt=0,
        description="A job held at its memory limit (reclaiming pages it needs again) this long is stopped and reported out of memory.",
    )
    runners: list[Literal["process"]] = Field(
        default_factory=lambda: [RUNNER_PROCESS], description="How jobs run on its workers."
    )
    provisioner: ProvisionerConfig | None = Field(None, description="Start and stop this pool's workers.")


def _default_pools() -> dict[str, PoolConfig]:
    return {"serve": PoolConfig()}


class ExecutorConfig(ConfigModel):
    provider: Literal["workers"] = Field("workers", description="Jobs run on workers that lease them.")
    renew_seconds: float = Field(10, gt=0, description="The worker's heartbeat period.")
    grace_seconds: float = Field(
        50, gt=0, description="After this much silence a worker is unreachable: its slots count zero."
    )
    toleration_seconds: float = Field(
        300,
        gt=0,
        description="After this much silence a worker's leases expire and their jobs go back with a new token.",
    )
    request_timeout_seconds: float = Field(
        10, gt=0, description="The longest a worker waits on one call to the server."
    )
    kill_grace_seconds: float = Field(5, ge=0, description="Between SIGTERM and SIGKILL when a job is stopped.")
    pass_seconds: float = Field(1, gt=0, description="The period of the daemon's pass (expiry, requeue, limits).")
    max_lost: int = Field(3, ge=1, description="An evaluation lost this many times in a row ends `lost`.")
    memory_pressure_max: float = Field(
        40.0,
        ge=0,
        le=100,
        description="A worker whose memory pressure (PSI `some avg10`, %) is above this claims nothing.",
    )
    pools: dict[str, PoolConfig] = Field(default_factory=_default_pools, description="The pools, by name.")
    run_as: str | None = Field(
        None,
        min_length=1,
        description=(
            "A worker's own key: the user its jobs run as when the worker runs as root (their dirs become theirs, "
            "and they cannot read the worker's files or each other's `/proc/<pid>/environ`). A worker that is not "
            "root, or a user that does not exist, is refused at start."
        ),
    )

    @model_validator(mode="after")
    def _serve_pool(self) -> ExecutorConfig:
        # `piloop serve`'s own worker always has its pool; give it 0 slots to keep jobs off it
        if "serve" not in self.pools:
            self.pools = {"serve": PoolConfig(), **self.pools}
        serve = self.pools["serve"]
        if "evaluations" not in serve.model_fields_set:  # a fan-out of tasks runs as wide as the host
            serve.__dict__["evaluations"] = max(2, len(os.sched_getaffinity(0)))
        return self

    @model_validator(mode="after")
    def _timings(self) -> ExecutorConfig:
        if self.grace_seconds <= self.renew_seconds:
            raise ValueError(
                f"grace_seconds ({self.grace_seconds:g}) must exceed renew_seconds ({self.renew_seconds:g}): "
                "one late heartbeat must not make a worker unreachable"
            )
        need = self.grace_seconds + 2 * self.renew_seconds + self.request_timeout_seconds + self.kill_grace_seconds
        if self.toleration_seconds <= need:
            raise ValueError(
                f"toleration_seconds ({self.toleration_seconds:g}) must exceed grace_seconds + 2 × renew_seconds + "
                f"request_timeout_seconds + kill_grace_seconds = {self.grace_seconds:g} + 2 × {self.renew_seconds:g} + "
                f"{self.request_timeout_seconds:g} + {self.kill_grace_seconds:g} = {need:g}, so that a silent worker "
                "has stopped its jobs before they are handed on"
            )
        return self


# --- state -------------------------------------------------------------------------------


class StateConfig(ConfigModel):
    url: SecretStr | None = Field(
        None,
        description="The Redis URL (`redis://`, `rediss://`, `unix://`, or Sentinel's "
        "`redis+sentinel://[user:pass@]host:26379,host2:26379/service[/db]`, `rediss+sentinel://` with TLS); "
        "absent: the embedded Redis under `$PILOOP_HOME`.",
    )
    password_file: Path | None = Field(
        None, description="A file holding the Redis password (its first line), instead of one in `url`; never logged."
    )
    ca_file: Path | None = Field(
        None, description="The CA certificate (PEM) that a `rediss://` Redis's certificate must chain to."
    )
    sentinel_password_file: Path | None = Field(
        None,
        description="A file holding the Sentinels' own password (`requirepass` in sentinel.conf; its first line), for "
        "a `redis+sentinel://` url; unset: the Sentinels are asked without one. Never logged.",
    )
    events_max: int = Field(
        100_000, ge=1000, description="The events stream keeps about this many of the newest events."
    )
    inbox_max: int = Field(
        10_000,
        ge=100,
        description="The inbox keeps at most about this many escalations: past it the oldest acknowledged ones go "
        "first, then the oldest.",
    )
    event_value_bytes: int = Field(
        1024,
        ge=64,
        description="An event's field value past this many bytes is cut, so "
        "the stream's memory is bounded whatever a caller sends.",
    )
    log_chunks_max: int = Field(
        20_000,
        ge=1,
        description="The log chunks a job keeps (one every few seconds: over a "
        "day of an agent's session); later ones are dropped and `job show` says how many.",
    )
    report_max_bytes: int = Field(
        256 * 1024,
        ge=4096,
        description="The largest result a report may carry, its log's "
        "chunk list aside; a larger report is refused naming this key.",
    )
    log_max_bytes: int = Field(
        LOG_MAX_BYTES,
        ge=4096,
        description="The bytes of a job's log it keeps (output.log as the worker ships it): a day of an agent "
        "printing 10 KiB/s is under 1 GiB, an evaluation's log far less. Past it the worker stops shipping and "
        "ends the log with a marker; the server keeps no chunk past it, and `job show` says the log was truncated.",
    )
    result_max_bytes: int = Field(
        RESULT_MAX_BYTES,
        ge=1024,
        description="The largest result a Python task may return (its `result.json` or `result.pickle`); a task "
        "whose result is larger fails, naming this key and the size, and its result is not kept.",
    )
    progress_keep: int = Field(200, ge=1, description="The newest progress notes a job keeps.")
    claim_want_max: int = Field(
        256,
        ge=1,
        le=100_000,
        description="The most jobs of one kind a claim may ask for (`want`); a claim is also cut to the worker's free "
        "slots before anything is built.",
    )
    worker_info_max_bytes: int = Field(
        16 * 1024, ge=256, description="The largest `info` (as JSON) and `image` a worker may register with."
    )
    worker_names_max: int = Field(
        1000, ge=1, description="The most worker names one `--rename` token holds at once (its workers' records)."
    )
    job_argv_max: int = Field(4096, ge=1, description="The most arguments a job's argv may have.")
    job_env_max: int = Field(1024, ge=0, description="The most variables a job's env may set.")
    job_inputs_max: int = Field(4096, ge=0, description="The most inputs (files from the CAS) a job may name.")
    job_spec_max_bytes: int = Field(
        1024 * 1024,
        ge=4096,
        description="The largest total of a job's argv, env and inputs (their names and values, in bytes); a "
        "schedule's job counts the same.",
    )
    schedule_min_period_seconds: float = Field(
        1, ge=1, description="A schedule's cron may fire at most once in this many seconds (the closest two ticks)."
    )

    @property
    def embedded(self) -> bool:
        return self.url is None


# --- retention ---------------------------------------------------------------------------


DAY = 24 * 3600


class RetentionConfig(ConfigModel):
    finished_seconds: float = Field(
        7 * DAY,
        ge=0,
        description="A job that succeeded, was cancelled or expired is removed from Redis this long after it ended "
        "(0: kept forever). A campaign's jobs are kept while the campaign exists.",
    )
    failed_seconds: float = Field(
        30 * DAY, ge=0, description="The same for a job that failed, was lost or lost its worker (0: kept forever)."
    )
    events_seconds: float = Field(
        7 * DAY,
        ge=0,
        description="Events older than this leave the stream, and an acknowledged inbox item this long after its "
        "acknowledgement (0: only `events_max` and `inbox_max` bound them).",
    )
    cas_grace_seconds: float = Field(
        2 * DAY,
        ge=0,
        description="The CAS garbage collector removes an unreferenced blob only once it was last put longer ago "
        "than this: a blob uploaded for a job not yet submitted is never taken.",
    )
    cas_gc_seconds: float = Field(
        DAY, ge=0, description="How often the pass queues a CAS garbage collection (`piloop cas gc`; 0: never)."
    )
    log_max_bytes: int = Field(
        64 * 2**20,
        ge=0,
        description="A log file the daemon or its children write under `$PILOOP_HOME` (docs/retention.md) that grows "
        "past this is copied to `<name>.1` and emptied, checked once a minute (0: never).",
    )
    log_keep: int = Field(
        2,
        ge=0,
        description="How many copies of a rotated log are kept (`.1` the newest); older ones are removed "
        "(0: a log over `log_max_bytes` is emptied, keeping none).",
    )


class TasksConfig(ConfigModel):
    path: list[str] = Field(
        default_factory=list,
        description="The dirs a worker imports Python tasks' modules from, first on its path, in order (relative: to "
        "the dir the worker started in); `piloop worker --tasks-path` replaces them. The worker's start dir and its "
        "PYTHONPATH stay on the path after them (empty: only those, as before). A task shipped with `Client(code=…)` "
        "imports from its own code first.",
    )
    processes: Literal["warm", "fresh"] = Field(
        "warm",
        description="The process a Python task runs in: `warm`, one that ran the worker's earlier tasks and keeps "
        "their modules imported (replaced when a task is stopped or crashes, and past `warm_max_tasks` or "
        "`warm_max_rss_mb`), or `fresh`, forked for the task alone; `piloop worker --task-processes` overrides it "
        "(docs/worker.md).",
    )
    warm_max_tasks: int = Field(
        1000, ge=1, le=1_000_000, description="The tasks a warm process runs before a fresh one replaces it."
    )
    warm_max_rss_mb: int = Field(
        1024,
        ge=16,
        le=1 << 20,
        description="A warm process whose resident memory is past this after a task is replaced (a leak ends there).",
    )


class Plugins(ConfigModel):
    executor: ExecutorConfig = Field(
        default_factory=ExecutorConfig, description="How jobs run: workers, their pools and the timings of silence."
    )
    cas: CasConfig = Field(
        default_factory=LocalCasConfig,
        description="The content-addressed store that holds every byte; a worker's must be the server's.",
    )
    network: NetworkConfig = Field(
        default_factory=NetworkConfig,
        description="Where the daemon listens beside its socket, and how callers authenticate.",
    )
    state: StateConfig = Field(
        default_factory=StateConfig,
        description="Redis: its URL (absent: the embedded one) and the caps on what callers may write.",
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig,
        description="How long finished jobs and events stay in Redis, unreferenced blobs in the CAS, and how large "
        "the daemon's logs grow.",
    )
    tasks: TasksConfig = Field(
        default_factory=TasksConfig, description="Where workers import Python tasks (`@task`) from."
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid")

    home: Path = Field(description="`$PILOOP_HOME`: config, socket, spool, logs.")
    namespace: str = Field("piloop", pattern=r"^[a-z0-9_-]{1,32}$", description="The Redis hash tag of every key.")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="How `piloop serve` and `piloop worker` write their logs: `text` (`event=… key=value` lines) or "
        "`json` (one object a line, the events stream's keys; docs/operations.md). `--log-format` overrides it.",
    )
    plugins: Plugins = Field(default_factory=Plugins, description="The `[plugins.*]` tables.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings merges the sources itself, so errors can name the one at fault.
        return (init_settings,)

    @property
    def executor(self) -> ExecutorConfig:
        return self.plugins.executor
