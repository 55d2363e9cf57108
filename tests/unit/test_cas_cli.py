"""`piloop cas`, driven through click with a stand-in for the root group's context object."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from click.testing import CliRunner

from piloop_common.cas import LocalCasConfig, hash_bytes
from piloop_common.cli.cas import cas


@dataclass
class StandIn:
    """What `piloop_common.cli.context.Cli` offers the commands: `home` and `settings`."""

    home: Path
    tls: Any = None
    settings: Any = field(init=False)

    def __post_init__(self) -> None:
        plugins = SimpleNamespace(cas=LocalCasConfig(), network=SimpleNamespace(tls=self.tls, provider="token"))
        self.settings = SimpleNamespace(plugins=plugins)


def run(home: Path, *args: str, stdin: bytes | None = None, tls: Any = None) -> Any:
    return CliRunner().invoke(cas, list(args), obj=StandIn(home, tls), input=stdin)


def test_put_get_has(tmp_path: Path) -> None:
    data = bytes(range(256)) * 10  # binary, with NULs and newlines
    (tmp_path / "f").write_bytes(data)
    result = run(tmp_path, "put", str(tmp_path / "f"))
    assert result.exit_code == 0 and result.output == hash_bytes(data) + "\n"
    address = hash_bytes(data)
    assert json.loads(run(tmp_path, "put", "--json", "-", stdin=data).output) == {"address": address, "size": 2560}

    got = run(tmp_path, "get", address)
    assert got.exit_code == 0 and got.stdout_bytes == data
    assert run(tmp_path, "get", address, "-o", str(tmp_path / "out")).exit_code == 0
    assert (tmp_path / "out").read_bytes() == data

    missing = hash_bytes(b"nope")
    has = run(tmp_path, "has", address, missing)
    assert has.exit_code == 1
    assert has.output.splitlines() == [f"{address}  present", f"{missing}  missing"]
    assert run(tmp_path, "has", address).exit_code == 0
    as_json = json.loads(run(tmp_path, "has", "--json", address, missing).output)
    assert as_json == [{"address": address, "present": True}, {"address": missing, "present": False}]


def test_errors_are_one_line_without_a_traceback(tmp_path: Path) -> None:
    for args in (["get", "sha256:../../etc/passwd"], ["get", hash_bytes(b"absent")], ["put", str(tmp_path / "no")]):
        result = run(tmp_path, *args)
        assert result.exit_code == 1, args
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
        assert result.output.startswith("Error: ")


def test_serve_refuses_a_public_address_without_tls(tmp_path: Path) -> None:
    result = run(tmp_path, "serve", "--listen", "0.0.0.0:7701")
    assert result.exit_code == 2 and "not a loopback address" in result.output and "tls" in result.output
    assert run(tmp_path, "serve", "--listen", "nonsense").exit_code == 2
