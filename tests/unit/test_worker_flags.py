"""orca's worker flags (the 004 spec) are not piloop's: each says where piloop keeps what it set, as a usage error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from piloop_common.cli import root


@pytest.mark.parametrize(
    "flag,says",
    [
        ("--max-runs", "executor.pools.<pool>.evaluations=N"),
        ("--poll-seconds", "the heartbeat period is the server's renew_seconds"),
    ],
)
def test_an_orca_flag_says_where_piloop_keeps_it(tmp_path, flag, says):
    got = CliRunner().invoke(root, ["--home", str(tmp_path), "worker", flag, "2", "--pool", "gpu"])
    assert got.exit_code == 2 and f"{flag}: " in got.output and says in got.output, got.output
    assert flag not in CliRunner().invoke(root, ["worker", "--help"]).output  # not offered, only explained


def test_the_cli_starts_without_the_protocol_models_and_lists_every_job_state():
    """`piloop --help` and every command's start import no pydantic model (about 0.25 s of CPU each time); the job
    states it offers are the protocol's."""
    import subprocess
    import sys
    from typing import get_args

    from piloop_common.cli.jobs import JOB_STATES
    from piloop_common.protocol.worker import JobState

    assert get_args(JobState) == JOB_STATES
    code = "import sys, piloop_common.cli; print(sorted(m for m in sys.modules if m.startswith('pydantic')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
