"""`piloop serve`'s own worker `serve`: it speaks to the daemon's socket like any worker and runs its pool's jobs."""

from __future__ import annotations

from tests.helpers.redis import wait_for


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
