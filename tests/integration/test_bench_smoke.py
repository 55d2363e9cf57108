"""`python -m bench --quick` runs and prints its table (a smoke test: no figure is asserted, benchmarks are not
tests). Only the server figures, with few simulated workers, to stay well under 30 s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_python_m_bench_quick_prints_its_table():
    got = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "server", "--workers", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    lines = got.stdout.splitlines()
    assert lines[0].startswith("| figure ") and "piloop/best" in lines[0], got.stdout
    assert any(line.startswith("| heartbeats/s, 10 workers") for line in lines), got.stdout
    assert any("load average" in line for line in lines), got.stdout
