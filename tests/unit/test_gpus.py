"""Which reader `gpus.sample()` takes: NVML when `pynvml` imports, `nvidia-smi` only when it does not, else none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from piloop_worker import gpus

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fake_pynvml"


@pytest.fixture
def fresh(monkeypatch):
    """A process-wide NVML state of its own, and no `pynvml` imported yet."""
    monkeypatch.setattr(gpus, "_nvml", gpus._Nvml())
    saved = sys.modules.pop("pynvml", None)
    yield
    gpus.close()
    sys.modules.pop("pynvml", None)  # the fake, imported here, is no other test's
    if saved is not None:
        sys.modules["pynvml"] = saved


def _smi(tmp_path: Path, monkeypatch, out: str) -> Path:
    log = tmp_path / "smi.log"
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nprintf '{out}'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(exe.parent))
    return log


def test_nvml_is_initialised_once_and_shut_down(fresh, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.setenv("FAKE_PYNVML_LOG", str(tmp_path / "nvml.log"))
    smi = _smi(tmp_path, monkeypatch, "0, 1, 2, 3\\n")
    first, second = gpus.sample(), gpus.sample()
    assert first == second == [gpus.Gpu(0, 37.0, 1024.0, 81920.0), gpus.Gpu(1, 81.0, 40960.0, 81920.0)]
    gpus.close()
    calls = [line.split()[0] for line in (tmp_path / "nvml.log").read_text().splitlines()]
    assert calls == ["init", "count", "count", "shutdown"]
    assert not smi.exists()


def test_nvidia_smi_only_without_pynvml(fresh, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError, as when not installed
    smi = _smi(tmp_path, monkeypatch, "0, 12, 100, 16384\\n1, 99, 200, 16384\\nnot a row\\n")
    assert gpus.sample() == [gpus.Gpu(0, 12.0, 100.0, 16384.0), gpus.Gpu(1, 99.0, 200.0, 16384.0)]
    assert gpus.sample() is not None
    assert len(smi.read_text().splitlines()) == 2  # one run a sample


def test_no_reader_no_gpus(fresh, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.sample() is None
    monkeypatch.delitem(sys.modules, "pynvml")
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.setenv("FAKE_PYNVML_MODE", "missing")
    monkeypatch.setattr(gpus, "_nvml", gpus._Nvml())
    assert gpus.sample() is None and gpus.sample() is None
