"""A job holds no credential of its worker: its environment has no token, its calls with whatever it finds there
are refused, and with `[plugins.executor] run_as` it cannot read the worker's token file or a neighbour job's
`/proc/<pid>/environ`. Real `piloop serve` and `piloop worker` processes; the user tests need root."""

from __future__ import annotations

import json
import os
import pwd
import secrets as pysecrets
import tempfile
import textwrap
from pathlib import Path

import pytest

from piloop_common.cas.local import LocalStore
from piloop_worker import jobuser
from tests.helpers.users import system_user
from tests.helpers.workers import RemoteWorker, state, submit, token

JOB_USER = "piloop-job-test"
PYTHON = "/usr/bin/python3"  # a job run as another user cannot run this venv's interpreter under root's home

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as another user needs a worker run as root")

# what a job finds: its environment, its parent's (the shim's), and where it is; written to outputs/ through its
# cwd (work/), the one way in for a job run as another user
LOOK = textwrap.dedent("""
    import json, os, sys
    def environ(pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return {"env": f.read().decode(errors="replace")}
        except OSError as e:
            return {"error": type(e).__name__}
    out = {"env": dict(os.environ), "shim": environ(os.getppid()), "uid": os.getuid(), "euid": os.geteuid(),
           "gid": os.getgid(), "cwd_uid": os.stat(".").st_uid}
    with open("../outputs/look.json", "w") as f:
        json.dump(out, f)
""")

# the job tries to act as a worker with anything in its environment (and nothing at all), then reads the token file
ACT = textwrap.dedent("""
    import json, os, sys, urllib.error, urllib.request
    server, token_file = sys.argv[1], sys.argv[2]
    tried = []
    for value in [None, *sorted(set(os.environ.values()))]:
        for route in ("register", "heartbeat", "claim"):
            req = urllib.request.Request(f"{server}/v1/worker/{route}", data=b"{}", method="POST",
                                         headers={"content-type": "application/json"})
            if value is not None:
                req.add_header("authorization", f"Bearer {value}")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            except (ValueError, UnicodeError, OSError) as e:  # a value no header can carry
                status = type(e).__name__
            tried.append([route, status])
    try:
        with open(token_file) as f:
            read = f.read()
    except OSError as e:
        read = type(e).__name__
    with open("../outputs/act.json", "w") as f:
        json.dump({"tried": tried, "token_file": read, "env": dict(os.environ)}, f)
""")

# job A: finds job B by its command line (readable by all), tries B's environ, the token file; then lets B end
NEIGHBOUR = textwrap.dedent("""
    import json, os, sys, time
    marker, token_file, flag = sys.argv[1], sys.argv[2], sys.argv[3]
    found, end = {}, time.monotonic() + 30
    while not found and time.monotonic() < end:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() not in f.read() or int(pid) == os.getpid():
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    found[pid] = f.read().decode(errors="replace")
            except PermissionError:
                found[pid] = "PermissionError"
            except OSError:
                continue
        time.sleep(0.05)
    try:
        with open(token_file) as f:
            read = f.read()
    except OSError as e:
        read = type(e).__name__
    with open("../outputs/neighbour.json", "w") as f:
        json.dump({"found": found, "token_file": read, "uid": os.getuid(), "groups": os.getgroups()}, f)
    open(flag, "w").close()
""")

# job B: holds its secret in its environment until A has looked (or 30 s)
WAIT = "import os, sys, time\nend = time.monotonic() + 30\nwhile not os.path.exists(sys.argv[2]) and time.monotonic() < end:\n    time.sleep(0.05)\n"


def _output(server, v: dict, name: str) -> dict:
    return json.loads(LocalStore(server.home / "cas").get_bytes(v["result"]["outputs"][name]))


def _job_user() -> pwd.struct_passwd:
    return system_user(JOB_USER)


def _run_as_worker(server, workers, tok: str, user: str) -> tuple[RemoteWorker, Path]:
    """A worker that reads its token from a file (0600, root's) and runs its jobs as `user`."""
    token_file = Path(tempfile.mkdtemp(prefix="pl-tok-")) / "token"
    token_file.write_text(tok + "\n")
    token_file.chmod(0o600)
    w = workers(server, tok, env={"PILOOP_HTTPS_TOKEN": ""}, args=("--token-file", str(token_file)))
    with open(w.home / "config.toml", "a") as f:
        f.write(f'\n[plugins.executor]\nrun_as = "{user}"\n')
    return w.start(), token_file


def _no_token_in(env: dict[str, str], tok: str) -> None:
    assert not {"PILOOP_HTTPS_TOKEN", "PILOOP_WORKER_CREDENTIAL", "PILOOP_REDIS_URL"} & set(env)
    assert not [k for k, v in env.items() if "plt_" in v or tok in v], env


def test_a_jobs_environment_holds_no_token_of_its_worker(server, workers) -> None:
    tok = token(server, "w1")
    w = workers(server, tok, env={"PILOOP_WORKER_CREDENTIAL": "shared-proxy-key"}).start()
    job = submit(server, PYTHON, "-c", LOOK)
    v = state(server, job)
    assert v["state"] == "succeeded", (v, w.output())
    look = _output(server, v, "look.json")
    _no_token_in(look["env"], tok)
    assert "shared-proxy-key" not in json.dumps(look)
    assert look["env"]["PILOOP_LEASE_TOKEN"] and look["env"]["PILOOP_RELAY"]  # its own lease's, and its relay
    # its shim (the same user here) holds none either: the shim host was started without them
    assert "env" in look["shim"], look["shim"]
    assert "plt_" not in look["shim"]["env"] and "PILOOP_HTTPS_TOKEN" not in look["shim"]["env"]
    assert tok not in w.output()


@needs_root
def test_a_job_has_nothing_to_act_as_its_worker_with(server, workers) -> None:
    user = _job_user()
    tok = token(server, "w1")
    w, token_file = _run_as_worker(server, workers, tok, user.pw_name)
    job = submit(server, PYTHON, "-c", ACT, server.url, str(token_file))
    v = state(server, job)
    assert v["state"] == "succeeded", (v, w.output())
    act = _output(server, v, "act.json")
    _no_token_in(act["env"], tok)
    assert act["token_file"] == "PermissionError"
    # every call it could make as a worker is refused before the body is read (a 400 would mean it got in)
    assert len(act["tried"]) >= 3 * 2
    assert {status for _, status in act["tried"]} <= {401, 403, "ValueError", "UnicodeEncodeError"}, act["tried"]
    assert {status for _, status in act["tried"]} & {401, 403}


@needs_root
def test_jobs_run_as_a_user_cannot_read_each_other_or_the_workers_token(server, workers) -> None:
    if not jobuser.available():
        pytest.skip("this kernel has no Landlock: jobs run as one user could read each other's environ")
    user = _job_user()
    values = {n: f"v-{n}-{pysecrets.token_hex(12)}" for n in ("TJOB_A", "TJOB_B")}
    for name, value in values.items():
        server.cli("secret", "set", name, input=value, check=True)
    tok = token(server, "w1")
    w, token_file = _run_as_worker(server, workers, tok, user.pw_name)
    shared = Path(tempfile.mkdtemp(prefix="pl-flag-"))
    shared.chmod(0o777)  # where A tells B it is done: /tmp is the one place both users' jobs reach
    flag = shared / "done"
    marker = f"job-b-{pysecrets.token_hex(6)}"
    b = submit(server, PYTHON, "-c", WAIT, marker, str(flag), kind="agent", opts=("--secret", "TJOB_B"))
    a = submit(server, PYTHON, "-c", NEIGHBOUR, marker, str(token_file), str(flag), opts=("--secret", "TJOB_A"))
    va, vb = state(server, a, timeout=45), state(server, b, timeout=45)
    assert va["state"] == "succeeded", (va, w.output())
    assert vb["state"] == "succeeded", (vb, w.output())
    seen = _output(server, va, "neighbour.json")
    assert seen["found"], "job A never saw job B running"
    assert set(seen["found"].values()) == {"PermissionError"}, seen["found"]
    assert values["TJOB_B"] not in json.dumps(seen)
    assert seen["token_file"] == "PermissionError"
    assert seen["uid"] == user.pw_uid and 0 not in seen["groups"]


@needs_root
def test_run_as_an_unknown_user_is_refused_in_one_line(server, workers) -> None:
    w = workers(server, token(server, "w1"))
    with open(w.home / "config.toml", "a") as f:
        f.write('\n[plugins.executor]\nrun_as = "no-such-piloop-user"\n')
    assert w.start().wait(20) == 2
    out = w.output().strip().splitlines()
    assert len(out) == 1 and "run_as" in out[0] and "no-such-piloop-user" in out[0], out
