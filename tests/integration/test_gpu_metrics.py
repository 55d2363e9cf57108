"""GPU figures in a job's metrics.jsonl from a real `piloop worker`, through NVML: the fake bindings
(tests/helpers/fake_pynvml, two GPUs) on the worker's PYTHONPATH stand in for `nvidia-ml-py` on a GPU host."""

from __future__ import annotations

import json
import os
from pathlib import Path

from piloop_common.cas.local import LocalStore
from tests.helpers.redis import wait_for
from tests.helpers.workers import state, submit, token

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fake_pynvml"
# runs until the shim has written two samples beside it (the first 1 s into the job, then one every 5 s)
TWO_SAMPLES = 'until [ "$(cat "$PILOOP_JOB_DIR/metrics.jsonl" 2>/dev/null | wc -l)" -ge 2 ]; do sleep 0.1; done'


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    smi = tmp_path / "bin" / "nvidia-smi"  # an nvidia-smi that only says it ran: NVML must leave it alone
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'smi.log'}\nexit 1\n")
    smi.chmod(0o755)
    path = os.pathsep.join(p for p in (str(FAKE), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "PYTHONPATH": path,
        "PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}",
        "FAKE_PYNVML_LOG": str(tmp_path / "nvml.log"),
        **extra,
    }


def _metrics(d, job: str) -> list[dict]:
    v = state(d, job, "succeeded", "failed", "lost", timeout=60)
    assert v["state"] == "succeeded", v
    raw = LocalStore(d.home / "cas").get_bytes(v["result"]["metrics"])
    return [json.loads(line) for line in raw.splitlines()]


def _calls(log: Path) -> list[tuple[str, int]]:
    return [(call, int(pid)) for call, pid in (line.split() for line in log.read_text().splitlines())]


def test_gpu_figures_come_from_nvml_initialised_once_per_process(server, workers, tmp_path):
    d = server
    w = workers(d, token(d, "nv1"), env=_env(tmp_path)).start()
    jobs = [submit(d, "sh", "-c", TWO_SAMPLES) for _ in range(2)]
    rows = [row for job in jobs for row in _metrics(d, job)]
    assert len(rows) >= 4
    for row in rows:
        assert row["gpus"] == [
            {"index": 0, "util_percent": 37.0, "memory_used_mb": 1024.0, "memory_total_mb": 81920.0},
            {"index": 1, "util_percent": 81.0, "memory_used_mb": 40960.0, "memory_total_mb": 81920.0},
        ], row
    calls = _calls(tmp_path / "nvml.log")
    samplers = {pid for call, pid in calls if call == "count"}
    assert sum(call == "count" for call, _ in calls) >= len(rows)  # every sample read NVML
    # each process that sampled initialised NVML once, however many samples (and jobs) it took
    assert sorted(pid for call, pid in calls if call == "init") == sorted(samplers), calls
    assert not (tmp_path / "smi.log").exists()  # no nvidia-smi fork while NVML answers
    # a shim that ends shuts NVML down: the worker's stop lets its idle shims go
    w.terminate()
    wait_for(
        lambda: {pid for call, pid in _calls(tmp_path / "nvml.log") if call == "shutdown"} == samplers,
        20,
        what="each shim to shut NVML down",
    )
    assert "Traceback" not in w.output()


def test_no_nvml_library_means_no_gpus_and_no_traceback(server, workers, tmp_path):
    d = server
    w = workers(d, token(d, "nv2"), env=_env(tmp_path, FAKE_PYNVML_MODE="missing")).start()
    rows = _metrics(d, submit(d, "sh", "-c", TWO_SAMPLES))
    assert len(rows) >= 2 and all("gpus" not in row and "cpu_percent" in row for row in rows), rows
    calls = _calls(tmp_path / "nvml.log")
    # one try per process, not one a sample; and nvidia-smi is not run instead (it needs the same library)
    assert [call for call, _ in calls] == ["init"], calls
    assert not (tmp_path / "smi.log").exists()
    assert "Traceback" not in w.output() and "NVML" not in w.output()
