"""Every Redis key piloop uses, built here and nowhere else.

All keys share the hash tag `{<namespace>}` so that multi-key scripts work on Redis Cluster
and managed Redis. Scripts that find job ids inside Lua get `prefix()` in ARGV and append
`job:<id>` etc. themselves; the helpers below and the Lua files use the same suffixes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    namespace: str = "piloop"

    def prefix(self) -> str:
        return "{" + self.namespace + "}:"

    def _k(self, *parts: str) -> str:
        return self.prefix() + ":".join(parts)

    # counters and markers
    def generation(self) -> str:
        return self._k("generation")

    def token_seq(self) -> str:
        return self._k("seq", "token")

    def daemon(self) -> str:
        """Hash: the daemon's last pass time, its id, the generation it saw, the hold after a data loss."""
        return self._k("daemon")

    def leader(self) -> str:
        """String with a TTL: `<fencing token> <instance>`, held (SET NX PX) by the one server that runs the pass."""
        return self._k("leader")

    def leader_seq(self) -> str:
        """Counter of the pass leader's fencing tokens (INCR at each takeover, never backwards)."""
        return self._k("seq", "leader")

    # jobs and queues
    def job(self, job_id: str) -> str:
        return self._k("job", job_id)

    def job_log(self, job_id: str) -> str:
        return self._k("job", job_id, "log")

    def job_progress(self, job_id: str) -> str:
        """List of the job's own progress notes (JSON), sent through its worker's relay; capped."""
        return self._k("job", job_id, "progress")

    def jobs(self) -> str:
        """Sorted set of every job id by creation time (listing)."""
        return self._k("jobs")

    def ended(self) -> str:
        """Sorted set of ended job ids by when they ended (ms): what retention prunes, oldest first."""
        return self._k("ended")

    def ended_kept(self) -> str:
        """Sorted set of ended jobs whose states are kept longer (by when they ended): pruned by the longer horizon."""
        return self._k("ended", "kept")

    def campaign_kept(self, name: str) -> str:
        """Set of a campaign's ended jobs past their horizon, kept while the campaign exists."""
        return self._k("campaign", name, "kept")

    def queue(self, pool: str, kind: str) -> str:
        return self._k("queue", pool, kind)

    def active(self, pool: str, kind: str) -> str:
        """Set of leased or running job ids of a pool and kind."""
        return self._k("active", pool, kind)

    def lease(self, job_id: str) -> str:
        """String: the fencing token; its TTL is the toleration stage."""
        return self._k("lease", job_id)

    def deadlines(self) -> str:
        """Sorted set job id -> lease deadline (ms): the index the pass scans."""
        return self._k("deadlines")

    def delayed(self) -> str:
        """Sorted set job id -> when (ms) a failed job waiting out its backoff, or a new one its countdown, goes back to
        its queue."""
        return self._k("delayed")

    def expiring(self) -> str:
        """Sorted set job id -> when (ms) a queued job with an expiry ends `expired` if no lease took it by then."""
        return self._k("expiring")

    # dependencies (state/dependencies.py) and schedules (state/schedules.py)
    def job_children(self, job_id: str) -> str:
        """Set of the jobs waiting on this one (`after`) and those it queued from inside itself (nested): the pass
        settles them once it has ended, then deletes the set."""
        return self._k("job", job_id, "children")

    def dependencies_cursor(self) -> str:
        """String: the `ended` score (ms) the pass's next look for ended parents starts at (dependencies.lua)."""
        return self._k("dependencies", "cursor")

    def schedules(self) -> str:
        """Hash schedule name -> its record (JSON: cron, the job to queue, who added it)."""
        return self._k("schedules")

    def schedule_ticks(self) -> str:
        """Sorted set schedule name -> its next tick (ms): the pass queues each due one once."""
        return self._k("schedules", "ticks")

    def workers(self) -> str:
        return self._k("workers")

    def worker(self, name: str) -> str:
        return self._k("worker", name)

    def worker_hash_prefix(self) -> str:
        """What `worker(name)` puts before the name (register.lua finds a token's names' hashes by it)."""
        return self._k("worker", "")

    def token_workers(self, token: str) -> str:
        """Set of the worker names a token holds (register.lua caps them: [plugins.state] worker_names_max)."""
        return self._k("tokens", token, "workers")

    def worker_alive(self, name: str) -> str:
        """String with TTL `grace_seconds`: present while the worker is reachable."""
        return self._k("worker", name, "alive")

    def worker_leases(self, name: str, kind: str) -> str:
        return self._k("worker", name, "leases", kind)

    # the provisioner: workers the server starts
    def provisioned_names(self) -> str:
        """Set of the names of the workers this server started and has not yet forgotten."""
        return self._k("provisioned")

    def provisioned(self, name: str) -> str:
        """Hash: one started worker's pool, state, handle, and when each state began (Redis ms)."""
        return self._k("provisioned", name)

    def provisioned_seq(self) -> str:
        """Counter that names started workers (`<pool>-<n>`)."""
        return self._k("seq", "provisioned")

    def provisioner(self, pool: str) -> str:
        """Hash: a pool's start backoff (delay, until) and its refusals in a row."""
        return self._k("provisioner", pool)

    # the server's background work (piloop_server.tasks)
    def rq_prefix(self) -> str:
        """rq's RQ_KEY_PREFIX: every key rq writes (queues, jobs, registries, its workers) under our hash tag."""
        return self._k("rq")

    # campaigns
    def campaign_live(self) -> str:
        """Hash campaign -> live agents (leased or running)."""
        return self._k("campaign", "live")

    def campaign_names(self) -> str:
        """Set of every campaign's name."""
        return self._k("campaigns")

    def campaign(self, name: str) -> str:
        """Hash: a campaign's repo, specs, target, state, bundle, base commit and workspace manifest."""
        return self._k("campaign", name, "record")

    def campaign_agents(self, name: str) -> str:
        """Set of the campaign's agent jobs not yet ended (queued, leased, running): what counts toward its target."""
        return self._k("campaign", name, "agents")

    def campaign_runs(self, name: str) -> str:
        """Sorted set of every agent job (a run) the campaign launched, by launch time (ms)."""
        return self._k("campaign", name, "runs")

    def campaign_scores(self, name: str) -> str:
        """Sorted set run (agent job id) -> the score its evaluation printed."""
        return self._k("campaign", name, "scores")

    def campaign_pending(self) -> str:
        """Set of campaign jobs that succeeded and whose campaign side (commits, score) is not yet recorded."""
        return self._k("campaign", "pending")

    def campaign_bundle(self, name: str, have: str) -> str:
        """String: the CAS address of an incremental bundle of the campaign's repo from `have`; expires."""
        return self._k("campaign", name, "bundle", have)

    # the CAS garbage collector (piloop_server/cas_gc.py)
    def cas_gc_lock(self) -> str:
        """String with a TTL: held (SET NX) by the one CAS garbage collection that may sweep; renewed while it runs."""
        return self._k("cas", "gc", "lock")

    def cas_gc_last(self) -> str:
        """String: when (epoch ms) the last CAS garbage collection ended, so the pass queues the next one on time."""
        return self._k("cas", "gc", "last")

    # control
    def limits(self) -> str:
        return self._k("limits")

    def tokens(self) -> str:
        """Hash token name -> its record (hash of the token, pool, expiry, who made it)."""
        return self._k("tokens")

    def token_hashes(self) -> str:
        """Hash sha256(token) -> token name."""
        return self._k("tokens", "by_hash")

    def secrets(self) -> str:
        """Hash secret name -> its record: AES-GCM nonce and ciphertext, key id, who set it, when (never a value)."""
        return self._k("secrets")

    def events(self) -> str:
        return self._k("events")

    def inbox(self) -> str:
        """Hash escalation id -> record; acknowledged ones carry `acked`."""
        return self._k("inbox")

    def disruption(self) -> str:
        """Hash: each pool's disruption hold (`hold:<pool>` -> JSON: since, until, counts, escalation, ended), and
        `settle_until` (ms) after the daemon's own absence (state/disruption.py)."""
        return self._k("disruption")

    # the web page (piloop_server/ui/): secrets are keyed by their sha256, never by themselves
    def ui_once(self, secret_hash: str) -> str:
        """String: a one-time login link's session record (JSON), until used once or its TTL ends."""
        return self._k("ui", "once", secret_hash)

    def ui_session(self, sid_hash: str) -> str:
        """String: a page session's record (JSON); its TTL is the idle time left, renewed as the page reads."""
        return self._k("ui", "session", sid_hash)
