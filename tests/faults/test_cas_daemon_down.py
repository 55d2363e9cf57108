"""The daemon stops, with its embedded Redis, while a worker's job runs, and `piloop cas serve` (in the daemon's home,
checking tokens in that Redis) stays up: the spec's row "a worker stops or dies before it sends a report".

The CAS answers 503 naming the daemon, in one line, not a 500 with a Redis traceback. The job ends meanwhile: its
worker (the manual's `cached` → `http` CAS) keeps the blobs it could not put, builds its report and spools it in
`spool/<worker>`, rather than leaving it unbuilt in the job's dir. The daemon comes back: the blobs go to the CAS
first, then the report, and the job ends `succeeded` with its outputs readable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import httpx

from piloop_common.cas.local import LocalStore
from tests.faults.test_worker_startup import LATE_FENCE, cached_over, registered
from tests.helpers.redis import free_port, wait_for
from tests.helpers.s3 import stop, wait_until_answers
from tests.helpers.serve import Daemon, cli_env, short_home
from tests.helpers.workers import GPU, RemoteWorker, kill_tree_of, state, submit, token, view


def test_a_stopped_daemon_is_a_503_of_the_cas_and_the_workers_report_waits_in_its_spool(tmp_path):
    d = Daemon(short_home(), config=LATE_FENCE + GPU)  # no [plugins.state]: the embedded Redis
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    cas_port = free_port()
    cas_url = f"http://127.0.0.1:{cas_port}"
    cas_log = open(d.home / "cas-serve.log", "ab")
    cas = subprocess.Popen(
        [sys.executable, "-m", "piloop_common.cli", "cas", "serve", "--listen", f"127.0.0.1:{cas_port}"],
        env=cli_env(d.home, d.env),
        stdout=cas_log,
        stderr=cas_log,
        stdin=subprocess.DEVNULL,
    )
    w: RemoteWorker | None = None
    try:
        wait_until_answers(f"{cas_url}/v1/cas/identity", cas)
        tok = token(d, "gpu1", "--pool", "gpu")
        w = RemoteWorker(d, tok, same_cas=False)
        (w.home / "config.toml").write_text(cached_over(cas_url, w.home))
        w.start()
        registered(w)
        flag = tmp_path / "go"
        script = f"""
            while [ ! -e {flag} ]; do sleep 0.05; done
            mkdir -p ../outputs && echo done > ../outputs/r.txt
            echo score=3
        """
        job = submit(d, "sh", "-c", textwrap.dedent(script))
        state(d, job, "running", timeout=30)

        d.stop()  # the daemon, and its embedded Redis with it

        def answer() -> httpx.Response | None:
            r = httpx.get(f"{cas_url}/v1/cas/identity", headers={"authorization": f"Bearer {tok}"}, timeout=10)
            return r if r.status_code != 200 else None

        r = wait_for(answer, 30, interval=0.2, what="the CAS to notice the daemon is gone")
        assert r.status_code == 503, r.text
        got = r.json()
        assert got["error"] == "unavailable" and "daemon" in got["message"] and "piloop serve" in got["message"], got
        assert "\n" not in got["message"] and "Traceback" not in (d.home / "cas-serve.log").read_text()

        flag.touch()
        spooled = wait_for(lambda: w.spool("gpu1"), 30, interval=0.1, what="the report in spool/gpu1")  # type: ignore[union-attr]
        report = json.loads(spooled[0].read_text())
        assert report["job"] == job and report["outcome"] == "succeeded", report
        out = report["outputs"]["r.txt"]
        assert not LocalStore(d.home / "cas").has(out)  # kept by the worker until the CAS takes it again
        assert "event=job.report_deferred" not in w.output()

        d.start(listen=f"127.0.0.1:{port}")
        v = state(d, job, timeout=60)
        assert v["state"] == "succeeded", (v, w.output())
        assert LocalStore(d.home / "cas").get_bytes(v["result"]["outputs"]["r.txt"]) == b"done\n"
        assert v["result"]["outputs"]["r.txt"] == out
        wait_for(lambda: not w.spool("gpu1"), 30, interval=0.1, what="the spool emptied")  # type: ignore[union-attr]
        assert view(d, job)["log"], "the job's log reached the CAS too"
    finally:
        if w is not None:
            w.cleanup()
        stop(cas)
        cas_log.close()
        d.cleanup()
        kill_tree_of(str(d.home))
