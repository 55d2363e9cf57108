"""`piloop serve`'s own worker `serve`: it speaks to the daemon's socket like any worker and runs its pool's jobs."""

from __future__ import annotations

from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.workers import events, state, submit


def test_the_serve_worker_runs_a_job_over_the_socket(daemon):
    job = daemon.cli("job", "submit", "--", "sh", "-c", "echo via-socket", check=True).stdout.strip()

    def done():
        with daemon.api() as api:
            v = api.call("GET", f"/v1/jobs/{job}")
        return v["state"] in ("succeeded", "failed", "lost") and v

    v = wait_for(done, 30, interval=0.1, what="the serve worker to run the job")
    assert v["state"] == "succeeded" and v["worker"] == "serve", v
    log = (daemon.home / "logs" / "worker-serve.log").read_text()
    assert "event=worker.registered worker=serve pool=serve" in log


# a renew period long enough that an idle worker's claim waits the most it may at the server (5 s)
SLOW_RENEW = (
    FAST_EXECUTOR.replace("renew_seconds = 0.5", "renew_seconds = 5")
    .replace("grace_seconds = 2", "grace_seconds = 12")
    .replace("toleration_seconds = 6", "toleration_seconds = 40")
)


def test_a_retry_the_pass_queues_wakes_the_idle_worker_s_waiting_claim(redis_server, namespace):
    """A failed job's retry is queued by the pass when its backoff has passed; the pass wakes the claims waiting at
    the API, so the idle worker takes it then, not when its claim's 5 s wait ends."""
    d = Daemon(short_home(), config=SLOW_RENEW, redis_url=redis_server.url, namespace=namespace).start()
    try:
        job = submit(d, "false", pool="serve", opts=("--max-attempts", "2", "--backoff", "1s"))
        v = state(d, job, "failed", timeout=60)
        assert v["attempts"] == 2, v
        ev = [e for e in events(d, "job.retrying", "job.requeued", "lease.granted") if e["job"] == job]
        assert [e["type"] for e in ev] == ["lease.granted", "job.retrying", "job.requeued", "lease.granted"], ev
        at = [int(e["id"].split("-")[0]) for e in ev]
        # the worker was idle, its claim waiting, from just after its report: the retry is due 1 s after it, queued
        # by the next pass (0.2 s) and leased at once; a claim left to its wait would take it 5 s after the report
        assert 1000 <= at[3] - at[1] < 3000, (at[3] - at[1], ev)
        assert at[3] - at[2] < 1000, (at[3] - at[2], ev)
    finally:
        d.cleanup()
