"""A system user for the tests that run a job or a worker as someone other than root."""

from __future__ import annotations

import pwd
import shutil
import subprocess


def system_user(name: str) -> pwd.struct_passwd:
    """The user `name`, made (`useradd --system`) when missing and this may; else `nobody`."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if shutil.which("useradd"):
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=False, capture_output=True)
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
    return pwd.getpwnam("nobody")
