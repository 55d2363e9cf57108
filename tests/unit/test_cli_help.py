"""Every command, group and option of `piloop` says what it does in its --help (issue 33: a dozen said nothing)."""

from __future__ import annotations

import subprocess
import sys

import click

from piloop_common.cli import root


def _walk(cmd: click.Command, path: str):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _walk(sub, f"{path} {name}")


def test_every_command_and_option_has_help_text():
    missing = []
    for path, cmd in _walk(root, "piloop"):
        if cmd.hidden:
            continue
        if not (cmd.help or "").strip():
            missing.append(path)
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip():
                missing.append(f"{path} {p.opts[0]}")
    assert not missing, f"no help text: {', '.join(missing)}"


def test_the_walk_reaches_every_subcommand():
    paths = {path for path, _ in _walk(root, "piloop")}
    # a walk that missed the groups would pass the test above on its own
    assert {"piloop limits unset", "piloop token revoke", "piloop campaign resume", "piloop inbox ack"} <= paths
    assert len(paths) > 40


def test_each_groups_help_lists_its_commands_with_their_summaries():
    out = subprocess.run(
        [sys.executable, "-m", "piloop_common.cli", "limits", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for line in ("set ", "unset ", "list "):
        row = next(r for r in out.splitlines() if r.strip().startswith(line))
        assert len(row.split()) > 1, f"`piloop limits --help` lists {line.strip()} with no summary: {out}"
