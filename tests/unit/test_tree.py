"""The tree held to its own rules: the linter and the type checker, as a newcomer's editor would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=170)


def test_the_shared_package_passes_the_linter() -> None:
    proc = _run(sys.executable, "-m", "ruff", "check", "--no-cache", "piloop_common")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_shared_package_is_strictly_typed() -> None:
    proc = _run(sys.executable, "-m", "mypy", "--no-incremental", "piloop_common")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout
