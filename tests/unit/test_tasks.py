"""The task decorator's checks and a task's call as its process makes it, without processes."""

from __future__ import annotations

import json
import pickle

import pytest

from piloop_common.tasks import task
from piloop_worker import tasks as runner
from piloop_worker.slots import SlotRequest
from piloop_worker.slots.taskproc import call


def test_a_task_is_still_a_function_here_and_refuses_what_a_worker_cannot_run():
    from tests.helpers.tasks_mod import add

    assert add(2, 3) == 5 and add.name == "tests.helpers.tasks_mod:add"
    with pytest.raises(ValueError, match="serializer"):
        task(serializer="yaml")(lambda: 1)

    def local():
        return 1

    with pytest.raises(ValueError, match="top level"):
        task(local)


def _request(target: str, ser: str, payload: dict) -> SlotRequest:
    data = json.dumps(payload).encode() if ser == "json" else pickle.dumps(payload)
    return SlotRequest(argv=[target], task=target, serializer=ser, args=data)


def test_a_task_s_value_comes_back_inline_as_the_serializer_says(tmp_path):
    got = call(_request("tests.helpers.tasks_mod:add", "json", {"args": [2], "kwargs": {"b": 40}}), "")
    assert got.code == 0 and got.value is not None and json.loads(got.value) == {"value": 42}
    got = call(_request("tests.helpers.tasks_mod:pair", "pickle", {"args": [7], "kwargs": {}}), "")
    assert got.code == 0 and got.value is not None and pickle.loads(got.value) == (7, {7})


def test_arguments_over_the_inline_cap_are_read_from_the_file_the_worker_fetched_them_to(tmp_path):
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"args": [2], "kwargs": {"b": 1}}))
    req = SlotRequest(argv=["x"], task="tests.helpers.tasks_mod:add", serializer="json", args_file=str(args))
    got = call(req, "")
    assert got.code == 0 and got.value is not None and json.loads(got.value) == {"value": 3}


def test_a_task_that_raises_fails_with_its_classes_and_its_traceback_in_the_log(capsys):
    got = call(_request("tests.helpers.tasks_mod:boom", "json", {"args": ["no good"], "kwargs": {}}), "")
    assert got.code == runner.FAILED and "ValueError" in got.classes[0] and got.value is None
    err = json.loads(got.error or b"{}")  # its report's error.json
    assert (
        err["type"] == "ValueError" and err["message"] == "no good" and "raise ValueError(message)" in err["traceback"]
    )
    assert "ValueError: no good" in capsys.readouterr().err
    for bad in ("tests.helpers.tasks_mod", "tests.helpers.tasks_mod:nothing", "no_such_module_x:f"):
        assert call(_request(bad, "json", {"args": [], "kwargs": {}}), "").code == runner.FAILED
