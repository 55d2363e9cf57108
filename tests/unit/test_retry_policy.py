"""Every Lua script is classified by the retry policy (piloop_server/state/retry.py): retried after a lost
connection only when running it twice changes nothing more."""

from __future__ import annotations

from importlib import resources

from piloop_server.state import retry


def _scripts() -> set[str]:
    root = resources.files("piloop_server.state").joinpath("scripts")
    return {p.name.removesuffix(".lua") for p in root.iterdir() if p.name.endswith(".lua")}


def test_every_script_is_either_retried_or_sent_once():
    scripts = _scripts()
    assert not retry.ONCE & retry.RETRIED
    assert scripts - (retry.ONCE | retry.RETRIED) == set(), "classify each new script in retry.py"
    assert (retry.ONCE | retry.RETRIED) - scripts == set(), "a script named in retry.py does not exist"


def test_the_scripts_that_would_act_twice_are_sent_once():
    assert {"claim", "append_log", "enqueue", "depend_submit", "relay_child", "schedule_add"} <= retry.ONCE
