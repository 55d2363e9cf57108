"""contrib/systemd/, checked statically (no systemd runs here): each unit keeps the shims alive across a stop
(`KillMode=process`), does not restart what a restart cannot fix, and runs a `piloop` command whose flags exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from piloop_common.cli import root
from piloop_common.config.settings import ExecutorConfig
from piloop_worker.main import EXIT_REFUSED, EXIT_UNTRUSTED, EXIT_USAGE

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "contrib" / "systemd"
SERVE, WORKER = UNITS / "piloop-serve.service", UNITS / "piloop-worker@.service"
INSTANCE = "gpu"  # what %i is in piloop-worker@gpu.service
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """{section: {key: [every value, in order]}}: systemd allows a key more than once (EnvironmentFile=)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}:{n}: a continued line (this parser reads one line a key)"
        if line.startswith("["):
            assert line.endswith("]"), f"{path.name}:{n}: {line!r}"
            section = out.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None, f"{path.name}:{n}: {line!r} is not Key=value in a section"
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def env_example() -> dict[str, str]:
    out = {}
    for line in (UNITS / "worker.env.example").read_text().splitlines():
        line = line.strip().removeprefix("#")
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            out[key] = value
    return out


def one(u: dict, key: str) -> str:
    (value,) = u["Service"][key]
    return value


def argv(path: Path) -> list[str]:
    """The unit's ExecStart as the process gets it: %i the instance, ${VAR} from Environment= or the env example."""
    u = unit(path)
    env = dict(v.split("=", 1) for v in u["Service"].get("Environment", []))
    env.update(env_example())
    words = shlex.split(one(u, "ExecStart").replace("%i", INSTANCE))
    for w in words:
        for var in _VAR.findall(w):
            assert var in env, f"{path.name}: ExecStart uses ${{{var}}}, which no Environment= or example sets"
    return [_VAR.sub(lambda m: env[m.group(1)], w) for w in words]


@pytest.mark.parametrize("path", [SERVE, WORKER], ids=lambda p: p.name)
def test_a_stop_signals_the_main_process_only_so_the_shims_and_their_jobs_live_on(path):
    u = unit(path)
    # control-group and mixed would kill every shim, and every running job with it, at each restart
    assert one(u, "KillMode") == "process"
    assert u["Service"].get("KillSignal", ["SIGTERM"]) == ["SIGTERM"]  # what detaches the worker
    assert one(u, "RemoveIPC") == "no"  # the jobs' shared memory and /dev/shm files outlive the unit's stop
    assert "DynamicUser" not in u["Service"] and "PrivateTmp" not in u["Service"]  # torn down at a stop
    assert one(u, "Restart") == "on-failure"
    assert u["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_worker_is_not_restarted_after_a_refusal_or_a_mistake_and_has_time_to_detach():
    u = unit(WORKER)
    prevent = one(u, "RestartPreventExitStatus").split()
    assert {str(EXIT_REFUSED), str(EXIT_USAGE), str(EXIT_UNTRUSTED)} <= set(prevent), prevent
    # the detach sends ready reports for up to 2 × request_timeout_seconds (the default 10)
    budget = 2 * ExecutorConfig().request_timeout_seconds
    assert float(one(u, "TimeoutStopSec")) > budget


def test_the_daemon_has_time_to_stop_its_own_worker():
    u = unit(SERVE)
    assert one(u, "RestartPreventExitStatus").split() == ["2"]  # a config mistake: `piloop: config: …`, exit 2
    # the daemon waits up to 30 s for its worker (piloop_server/serve.py, WorkerChild.stop), then stops the rest
    assert float(one(u, "TimeoutStopSec")) > 30


def _parsed(args: list[str]) -> tuple[str, dict]:
    """The command `piloop <args>` names and the parameters click gives it, parsed as click would, never run (a
    flag it does not have, or one without its value, raises `click.UsageError`)."""
    assert Path(args[0]).name == "piloop" and Path(args[0]).is_absolute(), args[0]
    name, rest = args[1], args[2:]
    parent = root.make_context("piloop", [name], resilient_parsing=True)
    cmd = root.get_command(parent, name)
    assert cmd is not None, name
    return name, cmd.make_context(name, rest, parent=parent).params


def test_the_daemon_runs_in_the_foreground_with_its_config_from_the_home():
    name, params = _parsed(argv(SERVE))
    from_config = {"detach": False, "listen": None, "log_format": None, "replica": False}
    assert name == "serve" and params == from_config, params


def test_the_worker_reads_its_token_from_a_file_and_keeps_its_dir_across_starts():
    u = unit(WORKER)
    env = dict(v.split("=", 1) for v in u["Service"]["Environment"])
    name, params = _parsed(argv(WORKER))
    assert name == "worker" and params["pool"] == INSTANCE, params
    assert params["server"] == (env_example()["PILOOP_WORKER_SERVER"],)  # a list: the worker may take several
    # a file mode 0600, not the environment, which every job inherits
    assert params["token_file"] == Path(f"/etc/piloop/worker-{INSTANCE}.token")
    assert "PILOOP_HTTPS_TOKEN" not in env and "PILOOP_HTTPS_TOKEN" not in env_example()
    # the same job directories at every start, known before registering: the running jobs are named in it
    assert params["workdir"] == Path(env["PILOOP_HOME"]) / "work" / INSTANCE
    assert env["PILOOP_HOME"] == "/var/lib/" + one(u, "StateDirectory")
    # not the daemon's home, whose config may hold the state's credentials (a worker refuses to start with them)
    assert env["PILOOP_HOME"] != dict(v.split("=", 1) for v in unit(SERVE)["Service"]["Environment"])["PILOOP_HOME"]


def test_a_flag_the_command_lacks_is_refused_by_this_check():
    with pytest.raises(click.UsageError, match="No such option"):
        _parsed([*argv(WORKER), "--detach"])
