"""`piloop task push DIR`: ship a snapshot of a code dir to the server's CAS and print its address."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def task() -> None:
    """Python tasks (`@task`): their code."""


@task.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.pass_obj
def push(obj, directory: Path) -> None:
    """Put a snapshot of DIRECTORY (a package, or a dir of modules) in the server's CAS and print its address,
    for `Client.submit(..., code=ADDRESS)` or a job spec's `code`. The same files print the same address."""
    from piloop_common.sdk.taskclient import Client

    with obj.api() as api:
        click.echo(Client(api).push_code(directory))
