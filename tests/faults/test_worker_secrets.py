"""A worker keeps its token from its jobs, and starts as contrib/systemd starts it.

The systemd unit's way: `--token-file`, no token in the environment, and the manual's `cached` → `http` CAS in front
of a real `piloop cas serve`: the CAS client takes the worker's token, and a job runs. That job, run as the
worker's own user, tries to read the worker's `/proc/<pid>/environ`, `maps` and `mem`, and its shim's environ: the
worker is not dumpable, so it reads nothing of the worker, and the token is nowhere in what it read. The worker runs
as a plain user (`setpriv`, as systemd's `User=`), with the system's python3 and this tree on its PYTHONPATH (this
venv's interpreter lives under root's home).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sysconfig
import textwrap
from pathlib import Path

import pytest

from piloop_common.cas.local import LocalStore
from tests.faults.test_worker_startup import CasServe, cached_over, registered
from tests.helpers.users import system_user
from tests.helpers.workers import RemoteWorker, state, submit, token

PYTHON = "/usr/bin/python3"
SETPRIV = shutil.which("setpriv")
WORKER_USER = "piloop-worker-test"
REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None or not os.access(PYTHON, os.X_OK),
    reason="a worker run as a plain user is started with setpriv, as root",
)

# a job that looks for its worker's token: the worker's environ, maps and every writable mapping of its memory,
# and its shim's environ (the shim is its parent); what it read and the errors, to ../outputs/look.json
LOOK = textwrap.dedent("""
    import json, os, sys
    worker, tok = int(sys.argv[1]), sys.argv[2].encode()
    out = {}
    def read(name, path):
        try:
            with open(path, "rb") as f:
                data = f.read()
            out[name] = {"bytes": len(data), "token": tok in data}
            return data
        except OSError as e:
            out[name] = {"error": type(e).__name__}
            return None
    read("worker environ", f"/proc/{worker}/environ")
    maps = read("worker maps", f"/proc/{worker}/maps")
    try:
        found, seen = False, 0
        with open(f"/proc/{worker}/mem", "rb") as mem:
            for line in (maps or b"").decode().splitlines():
                span, perms = line.split()[:2]
                if not perms.startswith("rw"):
                    continue
                lo, hi = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(lo)
                    chunk = mem.read(min(hi - lo, 64 << 20))
                except OSError:
                    continue
                seen += len(chunk)
                found = found or tok in chunk
        out["worker mem"] = {"bytes": seen, "token": found}
    except OSError as e:
        out["worker mem"] = {"error": type(e).__name__}
    read("shim environ", f"/proc/{os.getppid()}/environ")
    out["uid"] = os.getuid()
    with open("../outputs/look.json", "w") as f:
        json.dump(out, f)
""")


@pytest.fixture
def cas_http(server, redis_server, namespace):
    c = CasServe(server, redis_server.url, namespace)
    yield c
    c.cleanup()


def _worker_user() -> pwd.struct_passwd:
    return system_user(WORKER_USER)


def _as_user(user: pwd.struct_passwd) -> tuple[str, ...]:
    assert SETPRIV is not None
    ids = ("--reuid", str(user.pw_uid), "--regid", str(user.pw_gid), "--clear-groups")
    return (SETPRIV, *ids, PYTHON, "-m", "piloop_common.cli")


def _chown_tree(root: Path, user: pwd.struct_passwd) -> None:
    for dirpath, _dirs, files in os.walk(root):
        os.chown(dirpath, user.pw_uid, user.pw_gid)
        for f in files:
            os.chown(os.path.join(dirpath, f), user.pw_uid, user.pw_gid)


@needs_root
def test_a_systemd_style_worker_uses_its_token_file_for_the_cas_and_its_job_reads_nothing_of_it(
    server, cas_http, tmp_path
):
    user = _worker_user()
    tok = token(server, "gpu1", "--pool", "gpu")
    w = RemoteWorker(server, tok, same_cas=False, command=_as_user(user))
    token_file = w.home / "worker-gpu.token"
    token_file.write_text(tok + "\n")
    token_file.chmod(0o600)
    (w.home / "config.toml").write_text(cached_over(cas_http.url, w.home))
    _chown_tree(w.home, user)
    site = sysconfig.get_paths()["purelib"]  # this venv's packages, built for the same Python minor version
    w.env = {"PILOOP_HTTPS_TOKEN": "", "PYTHONPATH": os.pathsep.join((str(REPO), site))}  # as the unit: a file only
    w.args = ("--token-file", str(token_file), "--dir", str(w.home / "work" / "gpu"))
    w.start()
    try:
        registered(w)
        job = submit(server, PYTHON, "-c", LOOK, str(w.proc.pid), tok)  # type: ignore[union-attr]
        v = state(server, job, timeout=60)
        assert v["state"] == "succeeded", (v, w.output())
        look = json.loads(LocalStore(server.home / "cas").get_bytes(v["result"]["outputs"]["look.json"]))
        for what in ("worker environ", "worker maps", "worker mem"):
            assert look[what] == {"error": "PermissionError"}, look
        assert look["shim environ"]["bytes"] > 0 and look["shim environ"]["token"] is False, look
        assert look["uid"] == user.pw_uid  # the worker's own user: what a systemd unit's jobs are
        assert tok not in w.output() and tok not in cas_http.output()
    finally:
        w.cleanup()


def test_a_worker_drops_its_token_from_its_environment_block(server, workers):
    """The token given in the environment is gone from the worker's environ (read here with root's rights, which a
    job has not) and from its shim host's."""
    tok = token(server, "gpu1", "--pool", "gpu")
    w = workers(server, tok).start()
    registered(w)
    pid = w.proc.pid
    if os.geteuid() != 0:
        pytest.skip("a non-dumpable worker's /proc/<pid>/environ is root's to read")
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"PILOOP_HOME=" in environ  # the rest of it is there
    assert tok.encode() not in environ and b"PILOOP_HTTPS_TOKEN=p" not in environ
    assert Path(f"/proc/{pid}/environ").stat().st_uid == 0  # not dumpable: its /proc is root's
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        assert tok.encode() not in Path(f"/proc/{child}/environ").read_bytes()


def test_a_worker_that_cannot_make_its_spool_exits_2_in_one_line(server, workers):
    """A start that fails after registering (here its spool, a file where its dir goes) is one line and a documented
    code, not a traceback and 1, which a supervisor would restart every 5 s forever."""
    w = workers(server, token(server, "gpu1", "--pool", "gpu"))
    (w.home / "spool").write_text("not a dir\n")
    w.start()
    assert w.wait(60) == 2, w.output()
    out = w.output()
    lines = [line for line in out.splitlines() if line.startswith("piloop worker:")]
    assert len(lines) == 1 and "cannot start:" in lines[0] and "spool" in lines[0], out
    assert "Traceback" not in out
