"""`--log-format json`: a real `piloop serve` and its worker write one JSON object a line through a real job, each
event once, with the events stream's keys, and every line keeps to docs/logs.md's schema: its event is there, at its
level, and each field has its key and type (numbers are numbers)."""

from __future__ import annotations

import json

from tests.helpers.logschema import LINE_KEYS, is_type, schema
from tests.helpers.redis import wait_for
from tests.helpers.serve import Daemon, short_home
from tests.helpers.workers import state, submit


def _lines(path) -> list[dict]:
    text = path.read_text()
    out = []
    for line in text.splitlines():
        assert line.startswith("{"), f"{path.name}: a line that is not JSON: {line!r}"
        out.append(json.loads(line))
    return out


def test_serve_and_its_worker_log_one_json_object_a_line_each_event_once(redis_server, namespace):
    d = Daemon(short_home(), redis_url=redis_server.url, namespace=namespace, env={"PILOOP_LOG_FORMAT": "json"})
    d.start()
    try:
        job = submit(d, "sh", "-c", "echo hello", pool="serve")
        state(d, job, "succeeded", timeout=30)
        worker_log = d.home / "logs" / "worker-serve.log"

        def reported():
            return [e for e in _lines(worker_log) if e.get("type") == "job.reported" and e.get("job") == job]

        wait_for(reported, 10, what="the worker's job.reported line")
        worker = _lines(worker_log)
        mine = [e for e in worker if e.get("job") == job]
        assert [e["type"] for e in mine] == ["job.started", "job.ended", "job.reported"], mine
        started = mine[0]
        assert started["worker"] == "serve" and started["kind"] == "evaluation" and started["logger"] == "piloop.worker"
        assert mine[1]["outcome"] == "succeeded" and mine[1]["exit_code"] == 0, mine[1]
        assert all({"ts", "level", "logger"} <= set(e) for e in worker)
        assert any(e.get("type") == "worker.registered" and e.get("pool") == "serve" for e in worker)
        server = _lines(d.home / "logs" / "test-daemon.log")
        assert server and all({"ts", "level", "logger"} <= set(e) for e in server)
        assert not any("Bearer" in json.dumps(e) for e in worker + server)
        leader = [e for e in server if e.get("type") == "pass.leader"]
        assert [(e["level"], e["msg"]) for e in leader] == [("info", "(this server runs the pass)")], leader
        _keeps_to_the_schema(worker + server)
    finally:
        d.cleanup()


def _keeps_to_the_schema(lines: list[dict]) -> None:
    events, problems = schema(), []
    typed = [e for e in lines if "type" in e]
    assert len(typed) >= 6, typed  # daemon.started, pass.leader, worker.registered, job.started/ended/reported
    for e in typed:
        ev = events.get(e["type"])
        if ev is None:
            problems.append(f"{e['type']} is not in docs/logs.md: {e}")
            continue
        if e["level"] not in ev.levels:
            problems.append(f"{e['type']} at {e['level']}, docs/logs.md says {sorted(ev.levels)}")
        for k, v in e.items():
            if k in LINE_KEYS:
                continue
            if k not in ev.fields:
                problems.append(f"{e['type']}: a field {k} docs/logs.md does not list: {e}")
            elif not is_type(v, ev.fields[k]):
                problems.append(f"{e['type']}.{k} = {v!r}, docs/logs.md says {'|'.join(ev.fields[k])}")
    assert not problems, "\n".join(problems)
