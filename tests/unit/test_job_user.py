"""`piloop_worker.jobuser`: the credentials a job never gets, the `run_as` user, and outputs as root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from piloop_common.errors import ConfigError
from piloop_worker import jobuser
from piloop_worker.jobfiles import files_under


def test_no_credential_of_the_worker_is_left() -> None:
    env = {
        "PATH": "/usr/bin",
        "PILOOP_HTTPS_TOKEN": "plt_x",
        "PILOOP_WORKER_CREDENTIAL": "key",
        "PILOOP_REDIS_URL": "redis://:pw@h",
        "PILOOP_SECRET_KEY": "k",
        "PILOOP_STATE__URL": "redis://h",
        "PILOOP_HOME": "/h",
    }
    assert jobuser.without_credentials(env) == {"PATH": "/usr/bin", "PILOOP_HOME": "/h"}


def test_unset_is_no_user_and_a_user_goes_over_the_wire_whole() -> None:
    assert jobuser.resolve(None) is None and jobuser.JobUser.of(None) is None
    u = jobuser.JobUser("u", 1000, 1000, (1000, 27))
    assert jobuser.JobUser.of(u.wire()) == u


def test_run_as_is_refused_in_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError) as e:
        jobuser.resolve("no-such-piloop-user")
    assert "run_as" in e.value.message and "\n" not in e.value.message
    if os.geteuid() == 0:
        assert "no-such-piloop-user" in e.value.message
        with pytest.raises(ConfigError, match="root"):
            jobuser.resolve("root")
    else:
        assert "root" in e.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="a symlink of another user's needs root to make")
def test_a_symlink_another_user_left_in_outputs_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("plt_secret")
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "mine").symlink_to(secret)
    (out / "theirs").symlink_to(secret)
    os.lchown(out / "theirs", 65534, 65534)
    (out / "plain").write_text("x")
    assert [name for name, _ in files_under(out)] == ["mine", "plain"]
