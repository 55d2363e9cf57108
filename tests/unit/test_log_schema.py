"""docs/logs.md is the schema of the log events, and every log call in the code keeps to it: its event is there,
at its level, with its keys, and a value the call fixes the type of (`%d`, `%g`, `%r`, a literal) has the type the
schema gives. A JSON line is typed from the call's own arguments (piloop_common/logformat.py)."""

from __future__ import annotations

import fnmatch
import io
import json
import logging

from piloop_common import logformat
from tests.helpers.logschema import is_type, log_calls, schema

PACKAGES = ("piloop_server", "piloop_worker", "piloop_common")
# what a conversion fixes of a JSON value's type (`%s` of any value keeps that value's own type)
FIXED = {"d": "integer", "i": "integer", "g": "number", "f": "number", "e": "number", "r": "string"}


def _name(event_field: logformat.FormatField) -> str:
    return event_field.text.replace("%s", "*")


def _problems(call, specs, ev) -> list[str]:
    out = []
    if call.level not in ev.levels:
        out.append(f"{call.where}: {ev.name} logged at {call.level}, docs/logs.md says {sorted(ev.levels)}")
    for f in specs[1:]:
        if f.key not in ev.fields:
            out.append(f"{call.where}: {ev.name}'s field {f.key} is not in docs/logs.md")
            continue
        fixed = "string" if f.placeholder is None else FIXED.get(f.placeholder["conv"])
        if fixed is not None and fixed not in ev.fields[f.key]:
            out.append(f"{call.where}: {ev.name}.{f.key} is {fixed}, docs/logs.md says {ev.fields[f.key]}")
    return out


def test_every_log_call_is_in_the_schema_at_its_level_with_its_keys_and_types():
    events, problems, seen = schema(), [], set()
    for call in log_calls(*PACKAGES):
        specs, _ = logformat.format_fields(call.fmt)
        assert specs and specs[0].key == "event", call
        name = _name(specs[0])
        if "*" in name:  # `event=provisioner.%s`: the events of that shape it may be
            fit = [n for n in fnmatch.filter(events, name) if not _problems(call, specs, events[n])]
            problems += [] if fit else [f"{call.where}: no event {name} in docs/logs.md has its level and keys"]
            seen.update(fit)
        elif name not in events:
            problems.append(f"{call.where}: {name} is not in docs/logs.md")
        else:
            seen.add(name)
            problems += _problems(call, specs, events[name])
    assert not problems, "\n".join(problems)
    assert sorted(set(events) - seen) == [], "events in docs/logs.md that no code logs"


def test_every_key_of_an_event_in_the_schema_is_logged_somewhere():
    events, logged = schema(), {}
    for call in log_calls(*PACKAGES):
        specs, _ = logformat.format_fields(call.fmt)
        for name in fnmatch.filter(events, _name(specs[0])):
            if "*" not in _name(specs[0]) or set(f.key for f in specs[1:]) <= set(events[name].fields):
                logged.setdefault(name, set()).update(f.key for f in specs[1:])
    stale = {name: sorted(set(ev.fields) - logged.get(name, set())) for name, ev in events.items()}
    assert {k: v for k, v in stale.items() if v} == {}


def test_a_json_line_is_typed_from_the_call_and_keeps_prose_out_of_its_fields():
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    logformat.setup("json", out)
    try:
        log = logging.getLogger("piloop.test")
        log.info("event=pass.leader instance=%s token=%s (this server runs the pass)", "i1", "7")
        log.info("event=daemon.started pid=%d socket=%s listen=%s replica=%s instance=%s", 12, "/s", "-", False, "i1")
        log.info("event=job.ended job=%s outcome=%s reason=%r exit_code=%s", "j1", "failed", "", None)
        log.info("event=tasks.ready queues=%s pid=%d seconds=%.2f rss_mb=%.0f", "q", 3, 1.23456, 41.6)
        log.warning("event=worker.exited name=serve code=%s (restarting in %gs)", 1, 0.5)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert lines[0]["token"] == "7" and lines[0]["msg"] == "(this server runs the pass)"
    assert lines[1]["pid"] == 12 and lines[1]["replica"] is False
    assert lines[2]["exit_code"] is None and lines[2]["reason"] == ""
    assert lines[3]["seconds"] == 1.23 and lines[3]["rss_mb"] == 42.0
    assert lines[4]["code"] == 1 and lines[4]["msg"] == "(restarting in 0.5s)"
    events = schema()
    for line in lines:
        ev = events[line["type"]]
        for k, v in line.items():
            if k not in {"ts", "level", "logger", "type", "msg", "exc"}:
                assert is_type(v, ev.fields[k]), (line["type"], k, v, ev.fields[k])
