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
