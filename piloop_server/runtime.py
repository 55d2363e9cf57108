"""What the API and the pass share: settings, the Redis client and the stores built on it."""

from __future__ import annotations

import getpass
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from piloop_common.cas import Store
from piloop_common.config.settings import ExecutorConfig, Settings
from piloop_server.limits import Limits
from piloop_server.secrets import Secrets
from piloop_server.state.campaigns import CampaignsState
from piloop_server.state.connection import Client
from piloop_server.state.dependencies import DependenciesState
from piloop_server.state.disruption import DisruptionState
from piloop_server.state.events import EventsState
from piloop_server.state.failover import Failover, Watch
from piloop_server.state.generation import GenerationCheck, GenerationRecord, current_generation, ensure_generation
from piloop_server.state.jobs import JobsState
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.nested import NestedState
from piloop_server.state.provisioned import ProvisionedState
from piloop_server.state.records.lease import Caps, Timings
from piloop_server.state.relay import RelayState
from piloop_server.state.retention import RetentionState
from piloop_server.state.schedules import SchedulesState
from piloop_server.state.taskqueue import TaskQueues
from piloop_server.state.workers import WorkersState
from piloop_server.tokens import CACHE_SECONDS, TokenStore


@dataclass
class Runtime:
    settings: Settings
    home: Path
    redis: Client
    store: Store
    cas_id: str
    keys: Keys = field(init=False)
    caps: Caps = field(init=False)
    leases: LeasesState = field(init=False)
    disruption: DisruptionState = field(init=False)
    tokens: TokenStore = field(init=False)
    limits: Limits = field(init=False)
    events: EventsState = field(init=False)
    secrets: Secrets = field(init=False)
    provisioned: ProvisionedState = field(init=False)
    jobs: JobsState = field(init=False)
    workers: WorkersState = field(init=False)
    campaigns: CampaignsState = field(init=False)
    relay: RelayState = field(init=False)
    dependencies: DependenciesState = field(init=False)
    schedules: SchedulesState = field(init=False)
    nested: NestedState = field(init=False)
    taskqueues: TaskQueues = field(init=False)
    retention: RetentionState = field(init=False)
    user: str = field(default_factory=getpass.getuser)
    server_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    executor: ExecutorConfig = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    replid_kept: str = ""  # the replication id the generation record holds (state.failover)

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)
        self.executor = self.settings.plugins.executor
        self.caps = Caps.from_state(self.settings.plugins.state)
        self.leases = LeasesState(self.redis, self.keys, Timings.from_executor(self.executor), self.caps)
        self.disruption = DisruptionState(self.redis, self.keys, self.caps.events)
        self.tokens = TokenStore(self.redis, self.keys, cache_seconds=CACHE_SECONDS)
        self.limits = Limits(self.redis, self.keys)
        self.events = EventsState(self.redis, self.keys, self.caps.events)
        self.secrets = Secrets(self.redis, self.keys, self.home)  # refuses a key file others can read
        self.provisioned = ProvisionedState(self.redis, self.keys)
        self.jobs = JobsState(self.redis, self.keys)
        self.workers = WorkersState(self.redis, self.keys)
        self.campaigns = CampaignsState(self.redis, self.keys)
        self.taskqueues = TaskQueues(self.redis, self.keys.rq_prefix())
        self.retention = RetentionState(self.redis, self.keys)
        self.relay = RelayState(self.redis, self.keys, self.caps.progress_keep)  # one per runtime: its SHAs load once
        self.dependencies = DependenciesState(self.redis, self.keys, self.caps.events)
        self.schedules = SchedulesState(self.redis, self.keys, self.caps.events)
        self.nested = NestedState(self.redis, self.keys, self.caps.events)
        self.refresh_limits()

    def check_generation(self, record: GenerationRecord) -> GenerationCheck:
        """The generation marker against the daemon's record; after a data loss no work is handed out for grace."""
        return ensure_generation(self.redis, self.keys, record, int(self.executor.grace_seconds * 1000))

    def check_failover(self, record: GenerationRecord) -> Failover | None:
        """A new primary that may lack the last writes (state.failover): the generation moved up, claims held."""
        watch = getattr(self.redis, "repl_watch", None)
        if not isinstance(watch, Watch):
            return None
        ns = self.keys.namespace
        if not self.replid_kept:  # the first look since the start: from the primary the record names
            self.replid_kept = record.read_replid(ns)
            watch.seed(self.replid_kept)
        found = watch.check(self.redis, self.keys, record.read(ns), int(self.executor.grace_seconds * 1000))
        if found is not None and found.generation > record.read(ns):
            record.write(ns, found.generation)
        seen = watch.seen.replid if watch.seen is not None else ""
        if seen and seen != self.replid_kept:
            record.write_replid(ns, seen)
            self.replid_kept = seen
        return found

    def generation(self) -> int | None:
        return current_generation(self.redis, self.keys)

    def refresh_limits(self) -> list[str]:
        """Apply the limits to config.toml's executor (each pass, and at once after a change)."""
        executor, bad = Limits.apply(self.settings.plugins.executor, self.limits.all())
        self.executor = executor
        return bad
