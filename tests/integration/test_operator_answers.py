"""The operator's smaller answers against a real `piloop serve` and real workers: `config check` names a limit as
the source of a value it holds; `worker forget` and a revoked worker that leaves `worker list` by itself; an
`https://` URL against a plain-HTTP server named at once (CLI and worker); bad input is a usage error (exit 2)
naming the flag, while the Python API names the parameter; `wait().result` is a typed record; `job show` gives
`started` and `finished`; a whole float limit echoes as written."""

from __future__ import annotations

import json

import pytest

from piloop_common.errors import BadRequest
from piloop_common.protocol.operator import JobResult
from piloop_common.tasks import Client
from tests.helpers.redis import wait_for
from tests.helpers.serve import piloop
from tests.helpers.workers import state, submit, token


def _names(d) -> list[str]:
    return [w["name"] for w in json.loads(d.cli("worker", "list", "--json", check=True).stdout)]


def test_config_check_names_the_limit_that_holds_a_value_and_limits_echo_whole_numbers(daemon):
    d = daemon
    before = json.loads(d.cli("config", "check", "--json", check=True).stdout)
    assert before["settings"]["executor.pools.serve.max_load"] == {"value": 1000, "source": "config.toml"}
    r = d.cli("limits", "set", "executor.pools.serve.max_load=50", "--reason", "a busy host", check=True)
    assert r.stdout == "executor.pools.serve.max_load = 50: the daemon applies it at once\n"
    r = d.cli("limits", "set", "executor.pools.serve.min_memory_gb=100000", "--reason", "none", check=True)
    assert r.stdout == "executor.pools.serve.min_memory_gb = 100000: the daemon applies it at once\n"
    got = json.loads(d.cli("config", "check", "--json", check=True).stdout)
    assert got["limits_read"] is True
    assert got["settings"]["executor.pools.serve.max_load"] == {
        "value": 50,
        "source": "limit",
        "reason": "a busy host",
        "over": {"value": 1000, "source": "config.toml"},
    }
    assert got["settings"]["executor.pools.serve.agents"]["source"] == "config.toml"  # no limit: as it was
    rows = {
        line.split()[0]: line.split(None, 2)[1:]
        for line in d.cli("config", "check", check=True).stdout.splitlines()[4:]
    }
    assert rows["executor.pools.serve.max_load"] == ["50", "limit: a busy host (over config.toml: 1000)"]
    assert rows["executor.pools.serve.min_memory_gb"] == ["100000", "limit: none (over config.toml: 0)"]
    listed = d.cli("limits", "list", check=True).stdout
    assert " 100000 " in listed and "100000.0" not in listed
    d.stop()  # no daemon: the config's values, and a line that says the limits were not read
    text = d.cli("config", "check", check=True).stdout
    assert "limits: not read (no daemon answers on" in text
    assert json.loads(d.cli("config", "check", "--json", check=True).stdout)["limits_read"] is False


def test_worker_forget_and_a_revoked_worker_that_leaves_the_list_by_itself(server, workers):
    d = server
    w1 = workers(d, token(d, "w1")).start()
    w2 = workers(d, token(d, "w2")).start()
    wait_for(lambda: {"w1", "w2"} <= set(_names(d)), 60, interval=0.2, what="both workers listed")
    r = d.cli("worker", "forget", "w1")
    assert r.returncode == 1 and "worker w1 is reachable: stop it first" in r.stderr, r.stderr
    assert d.cli("worker", "forget", "nosuch").stderr.strip() == "piloop: no worker nosuch (`piloop worker list`)"
    w1.kill()  # silent, not revoked: it might come back, so only an admin removes it before 2 x toleration
    wait_for(
        lambda: (
            not next(w for w in json.loads(d.cli("worker", "list", "--json").stdout) if w["name"] == "w1")["reachable"]
        ),
        30,
        interval=0.2,
        what="w1 unreachable",
    )
    assert d.cli("worker", "forget", "w1", check=True).stdout == "worker w1: forgotten\n"
    assert "w1" not in _names(d)
    # a revoked token: the worker exits refused, and leaves the list grace_seconds (2 s here) after it went silent
    d.cli("token", "revoke", "w2", check=True)
    assert w2.wait(30) == 3, w2.output()
    wait_for(lambda: "w2" not in _names(d), 30, interval=0.2, what="the revoked w2 to leave the list")


def test_https_against_plain_http_is_named_at_once(server, workers):
    d = server
    wrong = d.url.replace("http://", "https://")
    where = d.url.removeprefix("http://")
    r = piloop(d.home, "--server", wrong, "job", "list", env={"PILOOP_TOKEN": token(d, "op1", "--role", "viewer")})
    want = f"the server speaks plain HTTP on {where}; use {d.url}"
    assert r.returncode == 1 and want in r.stderr, r.stderr
    w = workers(d, token(d, "w3"), url=wrong).start()
    assert w.wait(30) == 5, w.output()  # a setup mistake no retry fixes, as an untrusted certificate
    assert want in w.output()


def test_bad_input_names_the_flag_on_the_cli_and_the_parameter_in_python(daemon):
    d = daemon
    r = d.cli("job", "submit", "--pool", "gpu", "--", "true")
    assert r.returncode == 2, r
    assert r.stderr.startswith("piloop: --pool gpu: no such pool (pools: serve)"), r.stderr
    r = d.cli("job", "submit", "--secret", "NOPE", "--", "true")
    assert r.returncode == 2 and "--secret NOPE: no secret named NOPE" in r.stderr, r.stderr
    with Client.from_env(d.home) as c:
        with pytest.raises(BadRequest, match=r"^pool='nosuch': no such pool \(pools: serve\)$"):
            c.submit(["true"], pool="nosuch")
        view = c.wait(c.submit(["sh", "-c", "exit 3"]), timeout=60)
    assert isinstance(view.result, JobResult) and view.result.exit_code == 3 and view.result.outcome == "failed"
    assert view.result.usage.cpu_seconds >= 0 and view.result.log == view.log


def test_job_show_gives_started_and_finished(daemon):
    d = daemon
    job = submit(d, "true", pool="serve")
    v = state(d, job, "succeeded")
    assert v["created_ms"] <= v["started_ms"] <= v["finished_ms"], v
    lines = dict(line.split(None, 1) for line in d.cli("job", "show", job, check=True).stdout.splitlines())
    assert lines["started"] != "-" and lines["finished"] != "-" and lines["created"] != "-"
    queued = submit(d, "true", pool="serve", opts=("--countdown", "1h"))
    q = dict(line.split(None, 1) for line in d.cli("job", "show", queued, check=True).stdout.splitlines())
    assert q["started"] == "-" and q["finished"] == "-"
    d.cli("job", "cancel", queued, check=True)
