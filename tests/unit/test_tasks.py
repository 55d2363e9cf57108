"""The task decorator's checks and the worker's task runner, without processes."""

from __future__ import annotations

import json
import pickle

import pytest

from piloop_common.tasks import task
from piloop_worker import tasks as runner
from piloop_worker.jobdir import JobDir
from tests.helpers.jobrecords import job_record


def test_a_task_is_still_a_function_here_and_refuses_what_a_worker_cannot_run():
    from tests.helpers.tasks_mod import add

    assert add(2, 3) == 5 and add.name == "tests.helpers.tasks_mod:add"
    with pytest.raises(ValueError, match="serializer"):
        task(serializer="yaml")(lambda: 1)

    def local():
        return 1

    with pytest.raises(ValueError, match="top level"):
        task(local)


def _jobdir(tmp_path, ser: str, payload: dict) -> JobDir:
    jd = JobDir(tmp_path / "j")
    jd.create(job_record("j1"))
    data = json.dumps(payload).encode() if ser == "json" else pickle.dumps(payload)
    jd.inputs.mkdir()  # as the worker does with a job's first input
    (jd.inputs / f"args.{ser}").write_bytes(data)
    return jd


def test_runner_writes_the_value_as_the_serializer_says(tmp_path):
    jd = _jobdir(tmp_path, "json", {"args": [2], "kwargs": {"b": 40}})
    assert runner.run("tests.helpers.tasks_mod:add", jd) == 0
    assert json.loads((jd.outputs / "result.json").read_text()) == {"value": 42}

    jd = _jobdir(tmp_path / "p", "pickle", {"args": [7], "kwargs": {}})
    assert runner.run("tests.helpers.tasks_mod:pair", jd) == 0
    assert pickle.loads((jd.outputs / "result.pickle").read_bytes()) == (7, {7})


def test_runner_records_an_exception_with_its_traceback(tmp_path, capsys):
    jd = _jobdir(tmp_path, "json", {"args": ["no good"], "kwargs": {}})
    assert runner.run("tests.helpers.tasks_mod:boom", jd) == runner.FAILED
    err = json.loads((jd.outputs / "error.json").read_text())
    assert err["type"] == "ValueError" and err["message"] == "no good"
    assert "raise ValueError(message)" in err["traceback"]
    assert "ValueError: no good" in capsys.readouterr().err
    assert not (jd.outputs / "result.json").exists()
    for bad in ("tests.helpers.tasks_mod", "tests.helpers.tasks_mod:nothing", "no_such_module_x:f"):
        assert runner.run(bad, jd) == runner.FAILED


def test_a_task_process_gets_the_workers_environment_with_its_jobs_set_over_it(monkeypatch):
    """`_become` sets what the job adds over the environment the process inherited (the shim host's, the worker's):
    a variable the job changes is its, one only the worker has stays, and the C environment that a task's own
    subprocess inherits says the same."""
    import os
    import subprocess

    monkeypatch.setenv("WORKER_ONLY", "worker")
    monkeypatch.setenv("SHARED", "worker")
    added = {"SHARED": "job", "PILOOP_JOB": "j1"}
    want = {**os.environ, **added}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # as the task's process is: a fork, the job's variables set over what it inherited
        code = 1
        try:
            runner._become(added)
            out = subprocess.run(["env", "-0"], capture_output=True, check=True).stdout
            os.write(w, json.dumps([dict(os.environ), out.decode()]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        seen, c_env = json.loads(f.read())
    assert os.waitpid(pid, 0)[1] == 0
    assert seen == want and seen["WORKER_ONLY"] == "worker" and seen["SHARED"] == "job"
    inherited = dict(line.split("=", 1) for line in c_env.split("\0") if line)
    # (libraries may setenv in C what os.environ never saw, e.g. a terminal's size: those are not the job's to judge)
    assert {k: inherited.get(k) for k in want} == want
