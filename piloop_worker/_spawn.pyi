from collections.abc import Sequence
from os import PathLike

_Path = str | bytes | PathLike[str] | PathLike[bytes]

def spawn(
    programs: Sequence[_Path],
    argv: Sequence[_Path],
    envp: Sequence[_Path],
    cwd: _Path | None,
    stdin: int,
    stdout: int,
    stderr: int,
    pass_fds: Sequence[int],
    new_session: bool,
    cgroup_fd: int,
    uid: int,
    gid: int,
    groups: Sequence[int] | None,
    isolate: bool,
    pdeathsig: int,
    /,
) -> tuple[int, int, int]: ...
