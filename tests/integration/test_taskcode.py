"""Where task code comes from, on real processes: a worker started elsewhere (its own home and cwd, no repo on its
path) runs a task whose module exists only in the code the client shipped by address (`Client(code=…)`); an edited
copy shipped again runs on the same worker without a restart; the tasks path (`--tasks-path`, `[plugins.tasks]
path`) is where a task without shipped code imports from, and shipped code never leaks into it; a module the worker
cannot import fails the job with one line naming the module, the worker and its path."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from piloop_common.errors import BadRequest, TaskFailed
from piloop_common.sdk.taskcode import pack
from piloop_common.tasks import AsyncResult, Client
from tests.helpers.redis import free_port
from tests.helpers.serve import FAST_EXECUTOR, Daemon, cli_env, piloop, short_home
from tests.helpers.slowdown import scaled

GPU = "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 2\nmax_load = 1000\nmin_memory_gb = 0\n"
PKG = "shipped_" + uuid.uuid4().hex[:8]  # a package no process has on its path but through the tests below

WORK = """
import os
from piloop_common.tasks import task

VERSION = {version!r}


@task(pool="{pool}")
def where():
    return {{"version": VERSION, "file": __file__, "cwd": os.getcwd(), "pid": os.getpid()}}
"""


def write_pkg(root: Path, version: str, pool: str = "gpu") -> Path:
    pkg = root / PKG
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "work.py").write_text(WORK.format(version=version, pool=pool))
    return pkg


@pytest.fixture(scope="module")
def setup(redis_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("code")
    on_path = base / "tasks-path"  # the worker's --tasks-path: a version of the package that is not shipped
    write_pkg(on_path, "from the tasks path")
    serve_path = base / "serve-path"  # the daemon's own worker: [plugins.tasks] path
    write_pkg(serve_path, "from the config's path", pool="serve")
    config = FAST_EXECUTOR + GPU + f'\n[plugins.tasks]\npath = ["{serve_path}"]\n'
    d = Daemon(short_home(), config=config, redis_url=redis_server.url, namespace="t" + uuid.uuid4().hex[:10])
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    token = d.cli("token", "create", "gpu1", check=True).stdout.strip()
    home, cwd = short_home("w"), base / "elsewhere"  # another machine's view: its own home, cwd and path
    cwd.mkdir()
    (home / "config.toml").write_text(f'[plugins.cas]\nprovider = "local"\npath = "{d.home}/cas"\n')
    env = cli_env(home, {"PILOOP_HTTPS_TOKEN": token})
    env.pop("PYTHONPATH", None)
    argv = ["worker", "--server", f"http://127.0.0.1:{port}", "--pool", "gpu", "--tasks-path", str(on_path)]
    with open(home / "worker.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "piloop_common.cli", *argv],
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    yield d, proc, home, base
    proc.terminate()
    proc.wait(20)
    d.cleanup()


@pytest.fixture
def client(setup):
    with Client.from_env(setup[0].home) as c:
        yield c


def _module(root: Path):
    """The package's `work` module as this (the submitting) process imports it from `root`."""
    for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(f"{PKG}.work")
    finally:
        sys.path.remove(str(root))


def test_shipped_code_runs_on_a_worker_elsewhere_and_an_edit_runs_without_a_restart(setup, client):
    _d, proc, home, base = setup
    cache = home / "work" / "gpu1" / "code"
    src = base / "src"
    pkg = write_pkg(src, "v1")
    work = _module(src)
    plain = work.where.apply_async(client=client).get(timeout=scaled(60))  # no code shipped: the worker's --tasks-path
    assert plain["version"] == "from the tasks path" and plain["file"].startswith(str(base / "tasks-path")), plain

    shipping = Client(client.api, code=pkg)
    first = work.where.apply_async(client=shipping)
    got = first.get(timeout=scaled(60))
    address = client.show(first.id).spec["code"]
    assert address == client.push_code(pkg)  # the spec names the snapshot's address, the same for the same files
    # imported from the worker's unpacked copy of that address, under its --dir, not the host's preloaded module
    assert got["version"] == "v1", got
    assert got["file"] == str(cache / address.partition(":")[2] / PKG / "work.py"), got

    (pkg / "work.py").write_text(WORK.format(version="v2", pool="gpu"))
    second = work.where.apply_async(client=shipping)  # the same Task and client: the dir is snapshotted again
    assert second.get(timeout=scaled(60))["version"] == "v2"
    assert client.show(second.id).spec["code"] != address
    assert proc.poll() is None and client.show(second.id).worker == client.show(first.id).worker == "gpu1"

    # two code addresses at once on the one worker: each task runs its own
    other = write_pkg(base / "other", "v1")
    a, b = work.where.apply_async(client=Client(client.api, code=other)), work.where.apply_async(client=shipping)
    assert (a.get(timeout=scaled(60))["version"], b.get(timeout=scaled(60))["version"]) == ("v1", "v2")
    assert client.show(a.id).spec["code"] == address  # v1's files again: v1's address, run from the cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        client.show(j).spec["code"].partition(":")[2] for j in (first.id, second.id)
    )
    # and the shipped code left the host's own import alone: a task without code still runs the tasks path's
    assert work.where.apply_async(client=client).get(timeout=scaled(60))["version"] == "from the tasks path"


def test_the_config_tasks_path_serves_the_daemons_worker(setup, client):
    work = _module(setup[3] / "serve-path")
    got = work.where.apply_async(client=client).get(timeout=scaled(60))
    assert got["version"] == "from the config's path"
    assert got["file"] == str(setup[3] / "serve-path" / PKG / "work.py"), got


def test_a_module_the_worker_cannot_import_fails_with_one_line(setup, client):
    base = setup[3]
    args = client.put_blob(b'{"args": [], "kwargs": {}}')
    job = client.submit(["nosuch_pkg.mod:fn"], pool="gpu", runner="task", inputs={"args.json": args})
    view = client.wait(job, timeout=scaled(60))
    assert view.state == "failed", view
    assert "\n" not in view.reason and "Traceback" not in view.reason, view.reason
    for part in ("'nosuch_pkg.mod'", "worker gpu1", str(base / "tasks-path"), str(base / "elsewhere")):
        assert part in view.reason, view.reason
    assert client.log(job).decode().strip() == view.reason  # the log too: the one line, no traceback
    with pytest.raises(TaskFailed, match="cannot be imported on worker gpu1"):
        AsyncResult(job, client, "json").get(timeout=5)


def test_task_push_prints_the_address_and_bad_input_is_one_line(setup, client):
    d, _proc, home, base = setup
    pkg = write_pkg(base / "pushed", "pushed")
    out = d.cli("task", "push", str(pkg))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == client.push_code(pkg) == "sha256:" + hashlib.sha256(pack(pkg)).hexdigest()
    bad = d.cli("task", "push", str(base / "missing"))
    assert bad.returncode == 2 and "not a directory" in bad.stderr and "Traceback" not in bad.stderr, bad
    assert bad.stderr.strip().count("\n") == 0
    with pytest.raises(BadRequest, match="the CAS lacks"):
        client.submit(["x:y"], pool="gpu", runner="task", code="sha256:" + "0" * 64)
    worker = piloop(
        home,
        "worker",
        "--server",
        "http://127.0.0.1:1",
        "--pool",
        "gpu",
        "--tasks-path",
        str(base / "missing"),
        env={"PILOOP_HTTPS_TOKEN": "x"},
    )
    assert worker.returncode == 2 and f"--tasks-path: {base / 'missing'} is not a directory" in worker.stderr, worker


def test_a_process_job_with_pushed_code_imports_from_it(setup, client):
    d, _proc, _home, base = setup
    plain = base / "plain"  # no __init__.py: a path entry, its module at the top
    plain.mkdir()
    mod = "pushed_" + uuid.uuid4().hex[:8]
    (plain / f"{mod}.py").write_text("X = 'from the pushed code'\n")
    address = d.cli("task", "push", str(plain), check=True).stdout.strip()
    cmd = [sys.executable, "-c", f"import {mod}; print({mod}.X)"]
    job = d.cli("job", "submit", "--pool", "gpu", "--code", address, "--", *cmd, check=True).stdout.strip()
    view = client.wait(job, timeout=scaled(60))
    assert view.state == "succeeded" and view.spec["code"] == address, view
    assert client.log(job) == b"from the pushed code\n"
    bad = d.cli("job", "submit", "--pool", "gpu", "--code", "sha256:nope", "--", "true")
    assert bad.returncode == 2 and "--code: not a CAS address" in bad.stderr and "Traceback" not in bad.stderr, bad
