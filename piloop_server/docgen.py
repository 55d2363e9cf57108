"""The references generated from the code, so the docs cannot drift from it.

`python -m piloop_server.docgen` prints docs/configuration.md (`piloop_common/config` reference); `--write`
rewrites it and the generated blocks of the other docs (`state/stateref.py`: the Redis keys and Lua scripts;
`api/roleref.py`: who reaches which route); `--state` prints the first block. Unit tests fail when any differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from piloop_common.config.reference import render
from piloop_server.api.roleref import splice_roles
from piloop_server.state.stateref import render_state, splice_state


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        docs = Path(__file__).resolve().parents[1] / "docs"
        (docs / "configuration.md").write_text(render())
        arch = docs / "architecture.md"
        arch.write_text(splice_state(arch.read_text()))
        security = docs / "security.md"
        security.write_text(splice_roles(security.read_text()))
        return 0
    if argv == ["--state"]:
        print(render_state(), end="")
        return 0
    if argv:
        print("usage: python -m piloop_server.docgen [--state | --write]", file=sys.stderr)
        return 2
    print(render(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
